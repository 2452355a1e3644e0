"""`glm5 doctor` / `glm5 code --sandbox-check`: which protections are active on this machine, each one tried.

Every check does the real thing in a throwaway folder rather than reading configuration: a command inside the
sandbox tries to write outside, to reach a listening socket, to rewrite `.git/config` and `.glm5/`, to read a
secret variable; a planted git filter checks that the host's git runs nothing a repository configured. A check
that could not run says so (ok None: unknown), never "passed".
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import tempfile
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path

from agent import sandbox, trust
from agent.checkpoints import Checkpoints
from agent.child_env import scrubbed_env
from agent.environment import Environment


@dataclass
class Check:
    name: str
    ok: bool | None  # None: could not be checked here
    detail: str


def _env(root: Path, network: bool = False):
    box = sandbox.Sandbox(True, network=network)
    return Environment(root, sandbox=box, scratch_dir=root / ".glm5" / "tmp" / "doctor")


def run_checks(repo: Path | None = None) -> list[Check]:
    out: list[Check] = []
    reason = sandbox.probe(False)  # looked up at the call: tests replace it
    out.append(Check("bubblewrap sandbox", reason is None, reason or "bwrap starts a sandbox with no network"))
    with tempfile.TemporaryDirectory(prefix="glm5-doctor-") as tmp:
        root = Path(tmp) / "repo"
        root.mkdir()
        subprocess.run(["git", "init", "-q", str(root)], capture_output=True)
        if reason is None:
            out += _sandbox_checks(root)
        else:
            for name in ("filesystem outside read-only", "home and the rest of the disk hidden", "network off", ".git and .glm5 read-only",
                         "host kernel settings read-only", "host daemon sockets hidden", "no capabilities"):  # fmt: skip
                out.append(Check(name, None, "not checked: the sandbox cannot run here"))
        out.append(_git_check(root))
    out.append(_env_check())
    if repo is not None:
        t = trust.is_trusted(repo)
        out.append(
            Check(
                "repository settings",
                True,
                f"{repo} is trusted: its settings apply in full"
                if t
                else f"{repo} is not trusted: its settings may only narrow permissions (trust it with --trust)",
            )
        )
    return out


def _sandbox_checks(root: Path) -> list[Check]:
    out = []
    env = _env(root)
    outside = Path(f"/var/tmp/glm5-doctor-{uuid.uuid4().hex}")
    env.execute(f"touch {outside}")
    wrote = outside.exists()
    outside.unlink(missing_ok=True)
    out.append(Check("filesystem outside read-only", not wrote, f"a command {'COULD' if wrote else 'could not'} "
                     "write outside the repository"))  # fmt: skip
    out.append(_hidden_check(env))
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    port = srv.getsockname()[1]
    try:
        r = env.execute(f"exec 3<>/dev/tcp/127.0.0.1/{port} && echo connected", timeout_s=10)
    finally:
        srv.close()
    reached = "connected" in r.output
    out.append(
        Check("network off", not reached, f"a command {'REACHED' if reached else 'could not reach'} a local port")
    )
    before = (root / ".git" / "config").read_text()
    env.execute("echo '[core]' >> .git/config; echo x > .glm5/settings.toml")
    changed = (root / ".git" / "config").read_text() != before or (root / ".glm5" / "settings.toml").exists()
    out.append(Check(".git and .glm5 read-only", not changed, f"a command {'CHANGED' if changed else 'could not change'}"
                     " git's config or glm5's settings"))  # fmt: skip
    r = env.execute('v=$(cat /proc/sys/kernel/printk) && echo "$v" > /proc/sys/kernel/printk && echo WROTE')
    wrote = "WROTE" in r.output
    out.append(Check("host kernel settings read-only", not wrote, f"a command {'COULD' if wrote else 'could not'} "
                     "write /proc/sys"))  # fmt: skip
    r = env.execute("ls /run")
    visible = [n for n in r.output.split() if not n.startswith("[") and n != "systemd"]
    out.append(Check("host daemon sockets hidden", not visible, "/run is empty inside" if not visible
                     else f"/run shows {', '.join(visible[:5])}"))  # fmt: skip
    r = env.execute("grep CapEff /proc/self/status")
    m = re.search(r"CapEff:\s*([0-9a-f]+)", r.output)
    caps = m.group(1) if m else ""
    out.append(Check("no capabilities", caps.strip("0") == "" if caps else None, f"CapEff {caps or 'unknown'}"))
    return out


def _hidden_check(env) -> Check:
    """The view is an allowlist: a file in the home folder or elsewhere on the disk (not a toolchain, not the
    repository) is not there."""
    places = [d for d in ("/var/tmp", os.path.expanduser("~")) if os.access(d, os.W_OK)]
    if not places:
        return Check("home and the rest of the disk hidden", None, "not checked: no folder to plant a file in")
    planted = [Path(d) / f".glm5-doctor-{uuid.uuid4().hex}" for d in places]
    try:
        for p in planted:
            p.write_text("glm5-doctor-secret\n")
        r = env.execute("; ".join(f"cat {p} 2>/dev/null" for p in planted))
    finally:
        for p in planted:
            p.unlink(missing_ok=True)
    seen = "glm5-doctor-secret" in r.output
    return Check("home and the rest of the disk hidden", not seen, f"a command {'COULD' if seen else 'could not'} "
                 f"read a file planted in {' and '.join(places)}")  # fmt: skip


def _git_check(root: Path) -> Check:
    marker = Path(f"/var/tmp/glm5-doctor-{uuid.uuid4().hex}")
    (root / "payload.sh").write_text(f"touch {marker}\ncat\n")
    with open(root / ".git" / "config", "a") as f:
        f.write('[filter "x"]\n\tclean = sh payload.sh\n[core]\n\tfsmonitor = sh payload.sh\n')
    (root / ".gitattributes").write_text("* filter=x\n")
    (root / "a.txt").write_text("a\n")
    try:
        Checkpoints(root, "doctor").snapshot("doctor")
    except Exception as e:  # noqa: BLE001 - reported as unknown
        return Check("host git runs no repository programs", None, f"could not check: {e}")
    ran = marker.exists()
    marker.unlink(missing_ok=True)
    return Check("host git runs no repository programs", not ran, "a planted filter and fsmonitor "
                 f"{'RAN' if ran else 'did not run'} during a checkpoint")  # fmt: skip


def _env_check() -> Check:
    name = "GLM5_DOCTOR_SECRET_TOKEN"
    env = scrubbed_env(environ={**os.environ, name: "x" * 16})
    leaked = [k for k in env if k == name or ("API_KEY" in k.upper())]
    return Check("commands get a scrubbed environment", not leaked,
                 "no key or token variables reach commands" if not leaked else f"passed on: {', '.join(leaked)}")  # fmt: skip


def as_json(checks: list[Check]) -> list[dict]:
    return [asdict(c) for c in checks]
