"""The coding agent (`glm5 code`): model client, loop, tools, permissions and sandbox, checkpoints, sessions and
trajectories, hooks, MCP, TUI and headless runs.

    client.py       ChatClient: OpenAI-compatible Chat Completions over httpx; streaming, reasoning_content and
                    tool_calls deltas assembled, retries with backoff on 429/5xx/timeouts, raw response kept
    loop.py         Agent: run(task) loops step() = execute(query()), as small as mini-swe-agent's loop; the agent
                    owns its state: compact() (the conversation summarized and restarted from the summary: auto
                    and /compact), rewind(n) (the last N turns undone, code and conversation: /undo, /rewind),
                    labels() (the outcome labels: test runs, files changed, diff kept) are its methods
    flow.py         the exit statuses and the exceptions that carry the loop's control flow (Submitted, ...)
    stats.py        token / cost / step totals and the limits checked before each model call
    tool_call.py    one tool call: parse, approval, PreToolUse hook, checkpoints, run, PostToolUse, record; sees
                    the agent as `Caller` (a Protocol of what it needs), never imports the loop
    approval.py     may a call run: permission rules (a terminal's line judged as the bash command), then the
                    user's yes / no / always; sees the agent as `Approver`
    outcomes.py     a test run's label (passed / failed / unknown) from the runner's summary or exit status
    environment.py  Environment: the repository, path resolution, commands (process groups, timeouts, background
                    jobs, long output to a file), the terminal sessions (made at the first terminal_open)
    terminal.py     interactive sessions: a program on a pty in the sandbox, its screen emulated by pyte, named
                    keys, waits for quiet or a pattern; limits on count, output and idle time; no orphans
    term_keeper.py  the keeper of an unsandboxed terminal session (a stdlib script, a child subreaper): ends all
                    the program left behind on its exit, on close and when glm5 dies
    spawn.py        children started from one thread that lives as long as glm5 (PR_SET_PDEATHSIG follows the
                    starting thread; a TUI turn's thread ends with the turn)
    sandbox.py      bubblewrap wrapping (an allowlist view: system folders, toolchains, the repository; binds,
                    read-only .git / .glm5, no capabilities, limits), probed once; a clear warning where it cannot run
    permissions.py  modes (ask, accept-edits, plan, auto) and allow / ask / deny rules on analyzed commands;
                    deny wins; narrowest_rule for "always allow"
    command_analysis.py  what a command line does as far as static reading tells: wrappers looked through,
                    writes, paths outside the repository, the read-only allowlist (is_read_only)
    shell.py        a conservative bash parser: simple commands, redirections, what cannot be judged statically
    git_safe.py     every host-side git call: no repository-configured filter, hook, fsmonitor or program runs
    host_files.py   reads and writes beneath a folder something else can change (a repository, a trial's /app and
                    /logs): from a directory fd, one component at a time, no link followed
    child_env.py    the scrubbed environment commands get (an allowlist, never keys)
    trust.py        trusted folders: a repository's own settings only narrow until the user trusts it
    doctor.py       `glm5 doctor` / `--sandbox-check`: each protection tried for real
    tools/          the built-in tools (read, write, edit, glob, grep, bash, todo, terminal_*) and their registry
    mcp.py          MCP servers' tools (stdio, streamable HTTP) through the `mcp` SDK
    checkpoints.py  working-tree snapshots in hidden git refs; exact restores
    context.py      AGENTS.md / CLAUDE.md collection, the system prompt, compaction messages
    profiles.py     agent profiles: full (every tool, the full prompt) or compact (read, edit, bash, glob, a short
                    prompt: for small models); `[agent] profile`, `glm5 code --profile`, `--agent-profile`
    hooks.py        PreToolUse, PostToolUse, UserPromptSubmit, Stop, SessionStart, PreCompact commands
    trajectory.py   the JSONL session record (schema glm5-trajectory/1), writer and reader; file_is_ours
    provenance.py   this machine's keyed chain on every trajectory record; marks on run folders (what was recorded here)
    session.py      where sessions live; --continue / --resume lookup
    redact.py       secrets out of everything written to a trajectory
    settings.py     TOML settings, GLM5_* environment, flags; named providers; trust's narrowing; save_rule
    settings_schema.py  what each settings table accepts, checked by pydantic, and the message naming a wrong key
    config_dir.py   the user's config folder ($GLM5_CONFIG_DIR or ~/.config/glm5)
    plugin_registry.py  pluggy hook specs (tools, benchmarks, environments, rewards, log parsers) and default_manager(),
                    the one PluginManager: DEFAULT_PLUGINS by name
                    and the `glm5.plugins` entry points, loaded at run time (plugins import agent, never the reverse)
    builder.py      assembles a Session (all of the above) for an interface
    commands.py     slash commands, !cmd, @file mentions
    ui.py           AgentUI: the callbacks an interface implements (deltas, tool calls, approvals)
    headless.py     `glm5 code -p`: text / json / stream-json output, refusals reported, exit codes; --undo / --rewind
                    / --diff on a recorded session
    endpoint.py     where the endpoint URL came from (flag / env / settings / built-in); a refused local one fails fast
    tui/            the Textual app

Life of a task: interface -> builder.build_session -> Agent.run(task) -> ChatClient.query -> tool_call.run_call
(approval, hooks, checkpoints) -> every message and call appended to the trajectory -> Agent.finish writes the
outcome labels (Agent.labels).
"""

__version__ = "0.1.0"
