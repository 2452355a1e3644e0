"""Run inside .venv-engines: parse each argv on stdin (JSON list of argv lists, `serve MODEL ...`) with vLLM's own
`vllm serve` parser and its own post-parse validation; print one JSON result per argv."""

import json
import os
import sys

import cpu_shim  # noqa: F401 -- first: see its docstring

# vLLM's own switch for a machine without its GPUs (what `vllm bench` falls back to): the parser needs a platform.
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")


def main() -> None:
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(prog="vllm")
    sub = parser.add_subparsers(dest="subparser")
    cmd = ServeSubcommand()
    cmd.subparser_init(sub).set_defaults(dispatch_function=cmd.cmd)
    out = []
    for argv in json.load(sys.stdin):
        try:
            args = parser.parse_args(argv)
            cmd.validate(args)
            out.append({"ok": True, "args": {k: _plain(v) for k, v in vars(args).items() if k != "dispatch_function"}})
        except SystemExit as e:
            out.append({"ok": False, "error": f"argparse exited {e.code}"})
        except Exception as e:  # the parser's own verdict, whatever its type
            out.append({"ok": False, "error": f"{type(e).__name__}: {e}"})
    print(json.dumps(out))


def _plain(v):
    try:
        json.dumps(v)
        return v
    except TypeError:
        return repr(v)


if __name__ == "__main__":
    main()
