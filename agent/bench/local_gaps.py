"""What `--env local` cannot honour of a task, said before the run rather than found in a wrong verdict.

Local mode runs a task on this machine in bubblewrap: /app is a copy of the task's environment/ folder (or a
checkout), the rest of the filesystem read-only, and, without a setup of its own, the Python that runs glm5 first
on PATH. So a Harbor task's Dockerfile is not built: its base image, RUN, ENV, WORKDIR (other than /app), USER and
COPY/ADD into other places never happen, and a SWE row's image (its conda environment, system packages) is not
there: only the pip installs of a published row's Dockerfile are taken (harness_specs.local_setup). `--env docker`
honours all of it.
"""

from __future__ import annotations

import re
from typing import Any

_COPY_TO_APP = re.compile(r"^(COPY|ADD)\s+(--\S+\s+)*\.\s+(/app/?|\.)\s*$", re.I)


def dockerfile_instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of a Dockerfile, continuation lines joined, comments dropped."""
    out, buf = [], ""
    for raw in text.splitlines():
        line = raw.strip()
        if not buf and (not line or line.startswith("#")):
            continue
        buf += (" " if buf else "") + line.rstrip("\\").strip()
        if line.endswith("\\"):
            continue
        word, _, rest = buf.partition(" ")
        out.append((word.upper(), rest.strip()))
        buf = ""
    return out


def _terminal_gaps(task: Any) -> list[str]:
    path = task.environment_dir / "Dockerfile"
    if not path.is_file():
        return [f"its image {task.docker_image}"] if task.docker_image else []
    gaps, runs = [], 0
    for word, args in dockerfile_instructions(path.read_text(encoding="utf-8", errors="replace")):
        if word == "FROM":
            gaps.append(f"FROM {args} (this machine's system, glm5's Python first on PATH)")
        elif word == "RUN":
            runs += 1
        elif word in ("ENV", "USER", "ARG") or (word == "WORKDIR" and args.rstrip("/") not in ("/app", task.workdir)):
            gaps.append(f"{word} {args[:60]}")
        elif word in ("COPY", "ADD") and not _COPY_TO_APP.match(f"{word} {args}"):
            gaps.append(f"{word} {args[:60]}")
    if runs:
        gaps.insert(1 if gaps else 0, f"{runs} RUN instruction(s)")
    return gaps


def local_gaps(task: Any) -> list[str]:
    """The parts of `task` local mode does not honour (empty when it honours all of it)."""
    if getattr(task, "kind", "") == "terminal":
        return _terminal_gaps(task)
    if task.eval_script:
        return [f"its image {task.image or 'sweb.eval.x86_64.' + task.instance_id} (conda environment, system "
                "packages): only its Dockerfile's pip installs are taken"]  # fmt: skip
    if task.image:
        return [f"its image {task.image}"]
    return []
