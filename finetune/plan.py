"""The per-GPU memory of a fine-tuning layout, from the config alone: `glm5 finetune plan`, and the check that
`finetune sft|rl|distill` run before they load anything.

    p = plan(preset("glm5"), Layout(gpus=8, gpu_mem=141e9, base="fp8", seq_len=4096))
    print(format_plan(p)); p.fits; p.advice       # the table, whether it fits, and what would if not

The layout is the one finetune/sharded_load.py + finetune/distributed.py build: FSDP2 shards every parameter
over all the ranks (each decoder layer a unit, the embeddings / final norm / lm_head the root), the frozen base
stays in its stored precision (FP8 block-scaled, INT4, or bf16), LoRA adapters and their AdamW state are fp32
and sharded too, and each decoder layer is recomputed in the backward (activation checkpointing). Per GPU:

- weights      stored base bytes / gpus (a distillation teacher sharded alike counts twice)
- adapter      LoRA parameters, fp32 master, / gpus (full fine-tuning: the whole model, fp32)
- gradients    the same count, fp32, / gpus
- optimizer    AdamW's two moments, fp32, / gpus (0 with optimizer offload: they and an fp32 master copy of
               what trains live in host memory, 12 bytes per trained parameter: finetune/offload.py)
- gathers      FSDP's all-gathered units: the layer running and the one prefetched (2 x the largest layer, as
               stored), plus the largest linear dequantised to the compute dtype (the forward's per-linear copy)
- activations  with checkpointing, each layer's input [T, D] for every layer, one layer's inside (recomputed
               in its backward: `_token_elems` per token, plus the attention's [H, T, T] softmax
               probabilities, fp32), and the lm_head's target rows [T, V] (logits + their gradient, fp32)

The activation model is an estimate from the layer's shapes (see `_token_elems`); tests/finetune/test_plan.py
checks it against the bytes autograd actually saves on `small`. Nothing here knows about CUDA: a GPU's memory
is a number the user gives (H200: 141 GB), with `reserve` (default 10%) kept back for the allocator, NCCL and
the CUDA context.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from model.config import GLM5Config, count_parameters, human_bytes

METHODS = ("sft", "rl", "distill", "full")
BASES = ("bf16", "fp8", "int4")


class PlanError(ValueError):
    """A layout that cannot fit; the message names the largest items and what would fit."""


@dataclass(frozen=True)
class Layout:
    """One fine-tuning run's shape: where it runs and what it trains."""

    gpus: int = 8
    gpu_mem: float = 141e9  # bytes per GPU (H200: 141 GB)
    method: str = "sft"  # sft | rl | distill (LoRA) or full
    base: str = "fp8"  # the frozen base's stored precision
    seq_len: int = 4096
    micro_batch: int = 1  # rows per forward/backward
    lora_rank: int = 16
    offload_optimizer: bool = False
    teacher: str = "base"  # distill: "base" (the student's base, LoRA off: free), "sharded", or "served"
    act_bytes: int = 2  # bf16 activations on GPU (4 on CPU: fp32)
    dense_bytes: int = 2  # the base's tensors that are not quantised (embeddings, norms, ...): bf16 (CPU: fp32)
    int4_group: int = 128  # INT4: input columns per scale
    reserve: float = 0.10  # kept back for the allocator, NCCL buffers, the CUDA context
    gpus_per_node: int = 8

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"method must be one of {', '.join(METHODS)}, not {self.method!r}")
        if self.base not in BASES:
            raise ValueError(f"base must be one of {', '.join(BASES)}, not {self.base!r}")
        if self.teacher not in ("base", "sharded", "served"):
            raise ValueError(f"teacher must be base, sharded or served, not {self.teacher!r}")
        if self.gpus < 1 or self.seq_len < 1 or self.micro_batch < 1 or self.gpu_mem <= 0:
            raise ValueError("gpus, seq_len, micro_batch and gpu_mem must be positive")


@dataclass
class Plan:
    layout: Layout
    rows: dict[str, int]  # per GPU, bytes
    host: dict[str, int] = field(default_factory=dict)  # per rank, bytes of host memory (offloaded state)
    advice: str = ""

    @property
    def total(self) -> int:
        return sum(self.rows.values())

    @property
    def usable(self) -> int:
        return int(self.layout.gpu_mem * (1 - self.layout.reserve))

    @property
    def fits(self) -> bool:
        return self.total <= self.usable


def lora_parameters(cfg: GLM5Config, rank: int) -> int:
    """LoRA parameters on the main layers' targets (finetune/lora.py's DEFAULT_TARGETS: the five attention
    projections and every MLP's gate, up and down): r * (in + out) per adapted linear."""
    h, n_h = cfg.hidden_size, cfg.num_attention_heads
    attn = [(h, cfg.q_lora_rank), (cfg.q_lora_rank, n_h * cfg.qk_head_dim), (h, cfg.kv_lora_rank + cfg.qk_rope_head_dim),
            (cfg.kv_lora_rank, n_h * (cfg.qk_nope_head_dim + cfg.v_head_dim)), (n_h * cfg.v_head_dim, h)]  # fmt: skip
    per_attn = sum(rank * (a + b) for a, b in attn)

    def mlp(inter: int) -> int:
        return rank * 3 * (h + inter)  # gate, up: h -> inter; down: inter -> h

    total = 0
    for t in cfg.layer_mlp_types:
        total += per_attn
        if t == "dense":
            total += mlp(cfg.intermediate_size)
        else:
            total += (cfg.n_routed_experts + cfg.n_shared_experts) * mlp(cfg.moe_intermediate_size)
    return total


def _layer_params(cfg: GLM5Config) -> tuple[int, int]:
    """(the largest decoder layer's parameters, its largest single linear's) from the config."""
    h, n_h = cfg.hidden_size, cfg.num_attention_heads
    linears = [h * cfg.q_lora_rank, cfg.q_lora_rank * n_h * cfg.qk_head_dim, h * (cfg.kv_lora_rank + cfg.qk_rope_head_dim),
               cfg.kv_lora_rank * n_h * (cfg.qk_nope_head_dim + cfg.v_head_dim), n_h * cfg.v_head_dim * h,
               cfg.q_lora_rank * cfg.index_n_heads * cfg.index_head_dim]  # fmt: skip
    attn = sum(linears) + h * cfg.index_head_dim
    moe = (cfg.n_routed_experts + cfg.n_shared_experts) * 3 * h * cfg.moe_intermediate_size
    dense = 3 * h * cfg.intermediate_size
    mlp = max(moe if "sparse" in cfg.layer_mlp_types else 0, dense if "dense" in cfg.layer_mlp_types else 0)
    return attn + mlp, max(linears + [h * cfg.intermediate_size])


def stored_bytes(cfg: GLM5Config, lay: Layout) -> int:
    """The whole base as held in memory: the quantisable linears (model.config.count_parameters') at FP8 (+ an fp32
    scale per 128 x 128 block), INT4 (+ a bf16 scale per group) or bf16, everything else at `dense_bytes`."""
    p = count_parameters(cfg)
    quant = p["quantizable"] + p["mtp_quantizable"]
    rest = p["total"] + p["mtp"] - quant
    q = {"fp8": quant + 4 * -(-quant // (128 * 128)), "int4": quant // 2 + 2 * -(-quant // lay.int4_group),
         "bf16": 2 * quant}[lay.base]  # fmt: skip
    return q + lay.dense_bytes * rest


def _token_elems(cfg: GLM5Config) -> int:
    """Elements autograd keeps per token inside one decoder layer in training (LoRA on, the base frozen): the
    norms' inputs, each projection's output (and its LoRA's rank-r middle), the expanded per-head keys and values,
    and the MoE's routed copies (k experts' SwiGLU intermediates) and shared expert. Checked against measurement
    on `small` (tests/finetune/test_plan.py)."""
    d, n_h, k = cfg.hidden_size, cfg.num_attention_heads, cfg.num_experts_per_tok
    attn = (6 * d + 2 * cfg.q_lora_rank + 3 * n_h * cfg.qk_head_dim + 2 * (cfg.kv_lora_rank + cfg.qk_rope_head_dim)
            + 3 * n_h * (cfg.qk_nope_head_dim + cfg.v_head_dim) + 2 * n_h * cfg.v_head_dim)  # fmt: skip
    if cfg.n_routed_experts:
        inter = cfg.moe_intermediate_size
        mlp = k * (d + 3 * inter) + cfg.n_shared_experts * (d + 3 * inter) + d
    else:
        mlp = d + 3 * cfg.intermediate_size
    return attn + mlp


def activation_bytes(cfg: GLM5Config, seq_len: int, rows: int, act_bytes: int, checkpointing: bool = True) -> dict:
    """The activation rows of the plan (bytes): saved layer inputs, one layer's inside, attention scores, logits."""
    tokens = seq_len * rows
    n_layers = cfg.num_hidden_layers
    inside = tokens * _token_elems(cfg) * act_bytes
    scores = rows * cfg.num_attention_heads * seq_len * seq_len * 4  # the fp32 probabilities autograd keeps
    inputs = tokens * cfg.hidden_size * act_bytes * n_layers if checkpointing else inside * (n_layers - 1)
    logits = tokens * cfg.vocab_size * 4 * 2  # fp32 target-row logits and, in the backward, their gradient
    return {"layer inputs": inputs, "one layer": inside + scores * (1 if checkpointing else n_layers), "logits": logits}


def _plan(cfg: GLM5Config, layout: Layout) -> Plan:
    lay, g = layout, layout.gpus
    p = count_parameters(cfg)
    n_all = p["total"] + p["mtp"]
    stored = stored_bytes(cfg, lay) if lay.method != "full" else 4 * n_all
    teachers = 2 if lay.method == "distill" and lay.teacher == "sharded" else 1
    trained = n_all if lay.method == "full" else lora_parameters(cfg, lay.lora_rank)
    largest_layer, largest_linear = _layer_params(cfg)
    per_param = 4.0 if lay.method == "full" else stored / n_all
    full = lay.method == "full"
    rows = {"weights": teachers * stored // g}
    if not full:
        rows["adapter"] = 4 * trained // g
    rows["gradients"] = 4 * trained // g
    rows["optimizer"] = 0 if lay.offload_optimizer else 8 * trained // g
    rows["gathers"] = int(2 * largest_layer * per_param) + largest_linear * lay.act_bytes
    acts = activation_bytes(cfg, lay.seq_len, lay.micro_batch, lay.act_bytes)
    rows |= {f"activations: {k}": v for k, v in acts.items()}
    return Plan(lay, rows, host={"optimizer (offloaded)": 12 * trained // g} if lay.offload_optimizer else {})


def plan(cfg: GLM5Config, layout: Layout) -> Plan:
    """The per-GPU memory of `layout` for the model of `cfg` (see the module docstring), with advice if it does
    not fit."""
    out = _plan(cfg, layout)
    if not out.fits:
        out.advice = _advice(cfg, layout, out)
    return out


def _advice(cfg: GLM5Config, lay: Layout, p: Plan) -> str:
    """What would fit instead: more GPUs (whole nodes) if the sharded part is the problem, a shorter sequence if
    the per-GPU activations are (FSDP does not split a sequence), else the Megatron engine (slime)."""
    tips = []
    for nodes in range(max(1, lay.gpus // lay.gpus_per_node) + 1, 65):
        if _plan(cfg, replace(lay, gpus=nodes * lay.gpus_per_node)).fits:
            tips.append(f"{nodes} nodes of {lay.gpus_per_node} GPUs (--gpus {nodes * lay.gpus_per_node})")
            break
    seq = lay.seq_len
    while seq > 256 and not _plan(cfg, replace(lay, seq_len=seq)).fits:
        seq //= 2
    if seq != lay.seq_len and _plan(cfg, replace(lay, seq_len=seq)).fits:
        tips.append(f"--seq-len {seq}")
    if lay.base == "bf16" and lay.method != "full" and _plan(cfg, replace(lay, base="fp8")).fits:
        tips.append("the FP8 base (--base fp8)")
    tips.append("or `glm5 finetune rl --trainer slime` (Megatron: tensor, expert and context parallel)")
    big = sorted(p.rows.items(), key=lambda kv: -kv[1])[:2]
    return (f"needs {human_bytes(p.total)} per GPU, {human_bytes(p.usable)} usable of {human_bytes(int(lay.gpu_mem))} "
            f"(most: {', '.join(f'{k} {human_bytes(v)}' for k, v in big)}); would fit: " + "; ".join(tips))  # fmt: skip


def format_plan(p: Plan, name: str = "") -> str:
    """The plan as a plain-text table (what `glm5 finetune plan` prints)."""
    lay = p.layout
    head = (f"{name + ': ' if name else ''}{lay.method} on {lay.gpus} GPU(s) x {human_bytes(int(lay.gpu_mem))}, "
            f"{lay.base} base, seq {lay.seq_len} x {lay.micro_batch} row(s), LoRA rank {lay.lora_rank}"
            + (", optimizer offloaded" if lay.offload_optimizer else ""))  # fmt: skip
    if lay.method == "full":
        head = head.replace(f", LoRA rank {lay.lora_rank}", ", full fine-tuning (fp32 master)")
    width = max(len(k) for k in p.rows) + 2
    lines = [head, f"{'per GPU':<{width}}{'bytes':>12}"]
    lines += [f"{k:<{width}}{human_bytes(v):>12}" for k, v in p.rows.items()]
    lines.append(f"{'total':<{width}}{human_bytes(p.total):>12}   usable {human_bytes(p.usable)}: "
                 + ("fits" if p.fits else "DOES NOT FIT"))  # fmt: skip
    for k, v in p.host.items():
        lines.append(f"host per rank: {k} {human_bytes(v)}")
    if p.advice:
        lines.append(p.advice)
    return "\n".join(lines)


def check(cfg: GLM5Config, layout: Layout) -> Plan:
    """`plan`, raising PlanError (the advice) when the layout does not fit: what the training commands run first."""
    p = plan(cfg, layout)
    if not p.fits:
        raise PlanError(p.advice)
    return p
