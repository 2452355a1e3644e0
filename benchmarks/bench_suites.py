"""Times `materialize` for both built-in suites: a cold build and a cached reuse (wall, and CPU with children).

python benchmarks/bench_suites.py [--out benchmarks/bench_suites.json]
"""

import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from plugins.bench_suites.swe_suite import SWESuite
from plugins.bench_suites.terminal_suite import TerminalSuite


def cpu():
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


out = {}
for suite in (SWESuite(), TerminalSuite()):
    with tempfile.TemporaryDirectory() as d:
        w0, c0 = time.perf_counter(), cpu()
        paths = suite.materialize(Path(d))
        w1, c1 = time.perf_counter(), cpu()
        suite.materialize(Path(d))
        w2, c2 = time.perf_counter(), cpu()
        n = sum(1 for _ in paths[0].open()) if suite.kind == "swe" else len(paths)
        out[suite.key] = {
            "tasks": n,
            "materialize_cold_wall_s": round(w1 - w0, 2),
            "materialize_cold_cpu_s": round(c1 - c0, 2),
            "materialize_cached_wall_s": round(w2 - w1, 3),
        }
out["machine"] = {"cpus": os.cpu_count(), "python": sys.version.split()[0], "load_avg_1m": round(os.getloadavg()[0], 2)}
text = json.dumps(out, indent=2)
print(text)
if "--out" in sys.argv:
    Path(sys.argv[sys.argv.index("--out") + 1]).write_text(text + "\n")
