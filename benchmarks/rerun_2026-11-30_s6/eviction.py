"""Each side timed right after itself and right after the other (CPU time), 6 rounds of [ours, ours, hf, hf]."""
import sys, torch, time, tempfile, statistics
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[2]))
torch.set_num_threads(1)
import transformers
from model import GLM5ForCausalLM
from model.config import preset
cfg = preset("small").replace(rms_norm_eps=1e-6, dtype="float32")
m = GLM5ForCausalLM.from_config(cfg, seed=0).eval()
with tempfile.TemporaryDirectory() as d:
    m.save_pretrained(d); transformers.logging.set_verbosity_error()
    hf = transformers.GlmMoeDsaForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
ids = torch.randint(0, 8192, (1, 512), generator=torch.Generator().manual_seed(0))
r = {k: [] for k in ("ours after hf", "ours after ours", "hf after ours", "hf after hf")}
def t(f):
    c = time.process_time(); f(); return (time.process_time() - c) * 1e3
with torch.inference_mode():
    m(ids); hf(ids)
    for _ in range(6):
        r["ours after hf"].append(t(lambda: m(ids))); r["ours after ours"].append(t(lambda: m(ids)))
        r["hf after ours"].append(t(lambda: hf(ids))); r["hf after hf"].append(t(lambda: hf(ids)))
for k, v in r.items():
    print(f"{k:16s} median {statistics.median(v):6.0f} ms, fastest {min(v):6.0f} ms  {[round(x) for x in v]}")
