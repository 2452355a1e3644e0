"""Resident memory of `glm5 serve` on a small checkpoint, against the checkpoint's size.

Starts the real CLI (`glm5 serve DIR --port 0`) in a subprocess, waits for /health, and reads VmRSS from
/proc/PID/status; once with the default KV-cache sizing and once with `--kv-cache-gib 1` (the fixed 1 GiB cache
every server allocated before the default was sized to the model). Writes benchmarks/serve_memory.json.

    python benchmarks/bench_serve_memory.py [--preset tiny]
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx


def rss_mib(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"VmRSS:\s+(\d+) kB", status).group(1)) / 1024


def serve_rss(ckpt: Path, extra: list[str]) -> dict:
    cmd = [sys.executable, "-m", "glm5cli.app", "serve", str(ckpt), "--port", "0", "--no-access-log", *extra]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    try:
        url, deadline = None, time.monotonic() + 300
        lines = []
        while url is None and time.monotonic() < deadline:
            line = proc.stderr.readline()
            if not line:
                raise RuntimeError("glm5 serve exited:\n" + "".join(lines))
            lines.append(line)
            m = re.search(r"ready\s+(http://\S+)/v1", line)
            url = m.group(1) if m else None
        assert httpx.get(url + "/health", timeout=10).status_code == 200
        return {"args": extra, "url": url, "rss_mib": round(rss_mib(proc.pid), 1)}
    finally:
        proc.terminate()
        proc.wait(30)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="tiny")
    args = ap.parse_args()
    from model.config import preset
    from model.modeling import GLM5ForCausalLM
    from model.tokenizer import save_tokenizer_files

    with tempfile.TemporaryDirectory() as d:
        ckpt = Path(d)
        GLM5ForCausalLM.from_config(preset(args.preset), seed=0).save_pretrained(ckpt)
        save_tokenizer_files(ckpt)
        size = sum(f.stat().st_size for f in ckpt.glob("*.safetensors")) / 2**20
        runs = [serve_rss(ckpt, []), serve_rss(ckpt, ["--kv-cache-gib", "1"])]
    bare = subprocess.run(
        [sys.executable, "-c", "import torch, fastapi, uvicorn, re;"
         "print(int(re.search(r'VmRSS:\\s+(\\d+)', open('/proc/self/status').read()).group(1)) / 1024)"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    out = {
        "preset": args.preset,
        "checkpoint_mib": round(size, 1),
        "python_torch_fastapi_rss_mib": round(float(bare.stdout), 1),
        "default": runs[0]["rss_mib"],
        "kv_cache_gib_1_old_default": runs[1]["rss_mib"],
        "ratio_old_over_new": round(runs[1]["rss_mib"] / runs[0]["rss_mib"], 2),
    }
    print(json.dumps(out, indent=1))
    Path(__file__).with_name("serve_memory.json").write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
