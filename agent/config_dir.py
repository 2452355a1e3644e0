"""The user's config folder: `$GLM5_CONFIG_DIR`, else `~/.config/glm5`.

What lives there is the user's, never a repository's: `config.toml` (agent/settings.py), `trusted.json`
(agent/trust.py), `provenance.key` (agent/provenance.py), a global `AGENTS.md` (agent/context.py). The sandbox
masks it. Knows nothing of what the files hold.
"""

from __future__ import annotations

import os
from pathlib import Path


def config_dir() -> Path:
    d = os.environ.get("GLM5_CONFIG_DIR")
    return Path(d) if d else Path.home() / ".config" / "glm5"
