"""The built-in tools. Names and arguments are stable (trajectories become training data).

    base.py       Tool protocol, ToolResult, ToolContext (environment + shared state), ToolError
    registry.py   ToolRegistry: name -> tool, OpenAI `tools` schemas
    read.py       read(path, offset?, limit?)
    write.py      write(path, content)
    edit.py       edit(path, old_string, new_string, replace_all?)
    glob.py       glob(pattern, path?)
    grep.py       grep(pattern, path?, glob?)       ripgrep, with the Python reference path beside it
    bash.py       bash(command, timeout?, background?)
    terminal.py   terminal_open / _send / _read / _resize / _close: interactive programs in named pty sessions
                  (agent/terminal.py), what they would run judged as `bash` commands
    todo.py       todo(items)
    ignore.py     what the search tools skip (.git, .glm5, git-ignored files)
    fence.py      file reads and writes checked at the moment of access (real paths, no link swaps, no .git)

A call: the loop looks the tool up in the registry, permissions decide on (kind, subject(args)), then
`tool.run(args, ctx)` returns a ToolResult, or raises ToolError whose message goes back to the model.
"""

from agent.tools.bash import BashTool
from agent.tools.edit import EditTool
from agent.tools.glob import GlobTool
from agent.tools.grep import GrepTool
from agent.tools.read import ReadTool
from agent.tools.terminal import terminal_tools
from agent.tools.todo import TodoTool
from agent.tools.write import WriteTool


def builtin_tools() -> list:
    return [ReadTool(), WriteTool(), EditTool(), GlobTool(), GrepTool(), BashTool(), TodoTool(), *terminal_tools()]


__all__ = ["builtin_tools", "BashTool", "EditTool", "GlobTool", "GrepTool", "ReadTool", "TodoTool", "WriteTool"]
