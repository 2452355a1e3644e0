#!/usr/bin/env python3
"""orchard's installer: asks four questions in a terminal and writes /app/app.conf.

It talks to a person: it runs only with a terminal on both ends, and before each question it throws away
anything typed ahead of it, so the answers must come one at a time, each after its question.
"""

import hashlib
import re
import sys
import termios
from pathlib import Path

DATABASES = ("sqlite", "postgres", "none")


def ask(question: str) -> str:
    termios.tcflush(sys.stdin.fileno(), termios.TCIFLUSH)  # nothing typed before the question counts
    return input(question).strip()


def main() -> int:
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        print("install.py asks questions: run it in a terminal", file=sys.stderr)
        return 2
    print("orchard installer 1.0")
    while not re.fullmatch(r"[a-z][a-z0-9-]{1,30}", name := ask("Project name: ")):
        print("  a name is lower-case letters, digits and '-', starting with a letter")
    print("Databases:  1) sqlite   2) postgres   3) none")
    while (choice := ask("Choose a database [1-3]: ")) not in ("1", "2", "3"):
        print("  type 1, 2 or 3")
    db = DATABASES[int(choice) - 1]
    while not re.fullmatch(r"\d{0,5}", port := ask("Port [8080]: ")) or (port and not 0 < int(port) < 65536):
        print("  a port is a number from 1 to 65535")
    port = port or "8080"
    if ask("Write the configuration to /app/app.conf? [y/N]: ").lower() not in ("y", "yes"):
        print("nothing written")
        return 1
    install_id = hashlib.sha256(f"orchard|{name}|{db}|{port}".encode()).hexdigest()[:16]
    Path("/app/app.conf").write_text(f"name = {name}\ndatabase = {db}\nport = {port}\ninstall_id = {install_id}\n")
    print(f"wrote /app/app.conf (install id {install_id})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
