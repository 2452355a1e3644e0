"""What a built-in suite shares: materialize into a folder once, atomically, and reuse it while the data is unchanged.

`materialize(dest)` takes a lock on dest, and when dest already holds this suite built from the same data (the
digest in `.glm5-suite.json`) returns the same paths without rebuilding: the bench can call it on every run. A
build goes to a temporary folder inside dest and is moved into place, the marker written last, so a build killed
half way leaves nothing that looks finished. dest may be empty or a folder this suite wrote before; anything else
is refused rather than overwritten.
"""

from __future__ import annotations

import abc
import fcntl
import hashlib
import json
import os
import tempfile
from pathlib import Path

from plugins.bench_suites.gitrepo import remove_tree

MARKER = ".glm5-suite.json"
LOCK = ".glm5-suite.lock"
# Bump when the generator changes what it writes from the same data, so old folders are rebuilt.
GENERATOR_VERSION = 1


def data_digest(root: Path) -> str:
    h = hashlib.sha256(f"generator {GENERATOR_VERSION}\n".encode())
    for path in sorted(p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        h.update(f"{path.relative_to(root).as_posix()}\n".encode())
        h.update(hashlib.sha256(path.read_bytes()).digest())
    return h.hexdigest()


class BuiltinSuite(abc.ABC):
    """Base of the built-in suites: subclasses set kind/name/description and implement `build`."""

    kind: str = ""
    name: str = "builtin"
    description: str = ""
    deterministic = True

    @abc.abstractmethod
    def build(self, tmp: Path, dest: Path) -> list[str]:
        """Write the suite into tmp as it will be at dest (paths inside files name dest); return top-level names."""

    def outputs(self, dest: Path, names: list[str]) -> list[Path]:
        """The paths `materialize` returns, from the top-level names `build` wrote."""
        return [dest / n for n in names]

    def materialize(self, dest: Path) -> list[Path]:
        dest = Path(dest).resolve()
        dest.mkdir(parents=True, exist_ok=True)
        digest = data_digest(Path(__file__).parent)  # the data and the code that builds it
        with open(dest / LOCK, "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            marker = dest / MARKER
            old = _read_marker(marker)
            if old is not None and old.get("suite") == self.key and old.get("digest") == digest:
                names = old["names"]
                if all((dest / n).exists() for n in names):
                    return self.outputs(dest, names)
            stray = sorted(
                p.name for p in dest.iterdir() if p.name not in {LOCK, MARKER, MARKER + ".tmp"} | _names(old)
            )
            stray = [n for n in stray if not n.startswith(".glm5-build-")]
            if stray:
                raise FileExistsError(
                    f"{dest} holds files this suite did not write ({', '.join(stray[:5])}); "
                    f"materialize {self.key} into an empty folder"
                )
            marker.unlink(missing_ok=True)
            for n in _names(old):
                remove_tree(dest / n)
            for p in dest.glob(".glm5-build-*"):
                remove_tree(p)  # left by a build that was killed
            with tempfile.TemporaryDirectory(prefix=".glm5-build-", dir=dest) as tmp:
                names = self.build(Path(tmp), dest)
                for n in names:
                    os.replace(Path(tmp) / n, dest / n)
            body = json.dumps({"suite": self.key, "digest": digest, "names": names}, indent=1)
            tmp_marker = dest / (MARKER + ".tmp")
            tmp_marker.write_text(body + "\n")
            os.replace(tmp_marker, marker)
            return self.outputs(dest, names)

    @property
    def key(self) -> str:
        return f"{self.kind}:{self.name}"


def _read_marker(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("names"), list) else None


def _names(marker: dict | None) -> set[str]:
    return {
        n for n in (marker or {}).get("names", []) if isinstance(n, str) and "/" not in n and n not in ("", ".", "..")
    }
