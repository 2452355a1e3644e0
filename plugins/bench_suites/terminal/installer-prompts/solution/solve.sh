#!/bin/bash
# Reference solution: run the installer on a pseudo-terminal and answer each question once it has been asked
# (the installer discards anything typed before its question).
set -euo pipefail
python3 - <<'PY'
import os, pty, sys, time

answers = [("Project name: ", "orchard-api"), ("Choose a database [1-3]: ", "2"), ("Port [8080]: ", "5433"),
           ("[y/N]: ", "y")]
pid, fd = pty.fork()
if pid == 0:
    os.execvp("python3", ["python3", "/app/install.py"])
seen = b""
for prompt, answer in answers:
    deadline = time.monotonic() + 30
    while prompt.encode() not in seen:
        if time.monotonic() > deadline:
            sys.exit(f"no prompt {prompt!r}; the installer printed {seen[-500:]!r}")
        seen += os.read(fd, 1024)
    seen = b""
    os.write(fd, answer.encode() + b"\r")
while True:
    try:
        chunk = os.read(fd, 1024)
    except OSError:
        break
    if not chunk:
        break
    sys.stdout.write(chunk.decode(errors="replace"))
_, status = os.waitpid(pid, 0)
sys.exit(os.waitstatus_to_exitcode(status))
PY
