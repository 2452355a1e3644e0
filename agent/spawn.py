"""Children that outlive the thread that asked for them.

PR_SET_PDEATHSIG, which bubblewrap's --die-with-parent and the terminal keeper (agent/term_keeper.py) use so that
nothing glm5 started outlives it, fires when the *thread* that started the child ends, not the process (prctl(2)).
The TUI runs each turn in a worker thread that ends with the turn: a terminal session or a background job started
in one turn was killed as the turn ended. `popen` starts the child from one thread that lives as long as glm5.
"""

from __future__ import annotations

import subprocess
import threading
from concurrent.futures import ThreadPoolExecutor

_lock = threading.Lock()
_spawner: ThreadPoolExecutor | None = None


def popen(argv: list[str], **kw) -> subprocess.Popen:
    """subprocess.Popen(argv, **kw), from the main thread or the one lasting spawner thread."""
    global _spawner
    if threading.current_thread() is threading.main_thread():
        return subprocess.Popen(argv, **kw)
    with _lock:
        if _spawner is None:
            _spawner = ThreadPoolExecutor(max_workers=1, thread_name_prefix="glm5-spawner")
    return _spawner.submit(subprocess.Popen, argv, **kw).result()
