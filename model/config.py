"""GLM-5's architecture config: a frozen dataclass whose fields are the keys of `config.json`.

`GLM5Config.from_pretrained(dir)` reads a Hugging Face `config.json` (what transformers' `GlmMoeDsaConfig`
writes, or zai-org's own file); `to_dict()` writes one back that both we and transformers read. Defaults are the
real GLM-5 values (reference/glm5-model.md §1), so `GLM5Config()` is the `glm5` preset. The architecture
sizes in `REQUIRED_KEYS` must be present in a file: a config that silently fell back to 744B-model sizes would
only fail later, with a shape error far from the cause. Keys we do not know are kept in `extra`, written back
on save, and reported once per key.

`model_type` ("glm_moe_dsa") is checked on read and always written, but is not an attribute: peft, when
transformers 5 is installed, takes any model whose `config.model_type` is a transformers MoE type for
transformers' fused-expert layout and silently retargets LoRA from our per-expert Linear layers to parameters
that do not exist here.

Derived values (per-layer MLP and indexer types, the softmax scale, RoPE theta) are properties. Runtime knobs
(attention path, cache sizes) are not here: they are arguments of the code that uses them.
Presets: `tiny` (tests), `small` (benchmarks, ~200M), `glm5` (the real sizes, for planning).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from model.special_tokens import SHIPPED_EOS_IDS, SHIPPED_PAD_ID, SHIPPED_VOCAB_SIZE

log = logging.getLogger(__name__)

MODEL_TYPE = "glm_moe_dsa"
ARCHITECTURE = "GlmMoeDsaForCausalLM"

# Sizes without which a config cannot describe a checkpoint; everything else has a GLM-5 default.
REQUIRED_KEYS = (
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "q_lora_rank",
    "kv_lora_rank",
    "qk_nope_head_dim",
    "qk_rope_head_dim",
    "v_head_dim",
    "intermediate_size",
    "moe_intermediate_size",
    "n_routed_experts",
    "num_experts_per_tok",
    "index_topk",
    "index_n_heads",
    "index_head_dim",
)

# Keys transformers writes that carry no architecture for us (kept so a round trip does not report them).
_IGNORED_KEYS = {"model_type", "transformers_version", "_name_or_path", "torch_dtype", "qk_head_dim"}

_reported_unknown: set[str] = set()  # keys already warned about once; read and grown only under _reported_lock
_reported_lock = threading.Lock()  # checkpoints are read from several threads (RL's engine, bench trials)


class ConfigError(ValueError):
    """A config.json that cannot describe a GLM-5 model; the message names the field."""


@dataclass(frozen=True)
class GLM5Config:
    """GLM-5 (`glm_moe_dsa`) hyper-parameters. Field names and meanings are those of config.json."""

    # Sizes
    vocab_size: int = 154880
    hidden_size: int = 6144
    intermediate_size: int = 12288  # dense MLP of the first `first_k_dense_replace` layers
    moe_intermediate_size: int = 2048  # each routed and shared expert
    num_hidden_layers: int = 78  # main decoder layers; MTP layers come after them
    num_attention_heads: int = 64
    num_key_value_heads: int = 64  # MLA: every head has its own k/v, expanded from one latent
    head_dim: int = 64  # unused by MLA; transformers sets it to qk_rope_head_dim
    # MLA
    q_lora_rank: int = 2048
    kv_lora_rank: int = 512
    qk_nope_head_dim: int = 192
    qk_rope_head_dim: int = 64
    v_head_dim: int = 256
    attention_bias: bool = False
    attention_dropout: float = 0.0
    rope_interleave: bool = True
    rope_parameters: dict | None = field(default_factory=lambda: {"rope_theta": 1000000.0, "rope_type": "default"})
    rope_theta: float | None = None  # older files put theta here instead of in rope_parameters
    max_position_embeddings: int = 202752
    # DSA lightning indexer
    index_topk: int = 2048
    index_n_heads: int = 32
    index_head_dim: int = 128
    indexer_rope_interleave: bool = True
    indexer_types: tuple[str, ...] | None = None  # GLM-5.x: per layer "full" | "shared"; None = all full
    index_topk_pattern: str | tuple[str, ...] | None = None  # GLM-5.x: e.g. "FFSF..." (F=full, S=shared)
    index_topk_freq: int | None = None  # GLM-5.x schedule: every `freq`-th layer after `offset` is full
    index_skip_topk_offset: int | None = None
    # MoE
    n_routed_experts: int = 256
    n_shared_experts: int = 1
    num_experts_per_tok: int = 8
    first_k_dense_replace: int = 3
    moe_layer_freq: int = 1
    mlp_layer_types: tuple[str, ...] | None = None  # per layer "dense" | "sparse"; None = from the two above
    routed_scaling_factor: float = 2.5
    n_group: int = 1
    topk_group: int = 1
    norm_topk_prob: bool = True
    scoring_func: str = "sigmoid"
    topk_method: str = "noaux_tc"
    # MTP
    num_nextn_predict_layers: int = 1
    # Everything else
    rms_norm_eps: float = 1e-5
    hidden_act: str = "silu"
    mlp_bias: bool = False
    tie_word_embeddings: bool = False
    initializer_range: float = 0.02
    bos_token_id: int | None = 0
    eos_token_id: int | tuple[int, ...] | None = (154820, 154827, 154829)
    pad_token_id: int | None = 154820
    ep_size: int = 1
    pretraining_tp: int = 1
    use_cache: bool = True
    output_router_logits: bool = False
    layer_types: tuple[str, ...] | None = None  # transformers writes "indexed_attention" per layer
    dtype: str | None = "bfloat16"
    architectures: tuple[str, ...] = (ARCHITECTURE,)
    quantization_config: dict | None = None  # GLM-5-FP8: {"quant_method": "fp8", "weight_block_size": [128, 128]}
    extra: dict = field(default_factory=dict)  # unknown keys, written back on save

    def __post_init__(self) -> None:
        def bad(msg: str) -> None:
            raise ConfigError(f"invalid GLM-5 config: {msg}")

        for name in REQUIRED_KEYS:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                bad(f"{name} must be a positive integer, got {value!r}")
        if self.qk_rope_head_dim % 2:
            bad(f"qk_rope_head_dim must be even, got {self.qk_rope_head_dim}")
        if self.index_head_dim < self.qk_rope_head_dim:
            bad(f"index_head_dim ({self.index_head_dim}) is smaller than qk_rope_head_dim ({self.qk_rope_head_dim})")
        if self.num_experts_per_tok > self.n_routed_experts:
            bad(f"num_experts_per_tok ({self.num_experts_per_tok}) > n_routed_experts ({self.n_routed_experts})")
        if self.n_routed_experts % self.n_group or not 1 <= self.topk_group <= self.n_group:
            bad(f"n_group={self.n_group}, topk_group={self.topk_group} do not divide {self.n_routed_experts} experts")
        if self.scoring_func != "sigmoid":
            bad(f"scoring_func {self.scoring_func!r} is not GLM-5's ('sigmoid')")
        if self.hidden_act != "silu":
            bad(f"hidden_act {self.hidden_act!r} is not GLM-5's ('silu')")
        if self.rope_type != "default":
            bad(f"rope_type {self.rope_type!r} is not supported (GLM-5 uses 'default', no YaRN)")
        n = self.num_hidden_layers
        for name, allowed in (("mlp_layer_types", {"dense", "sparse"}), ("indexer_types", {"full", "shared"})):
            value = getattr(self, name)
            if value is not None and (len(value) != n or not set(value) <= allowed):
                bad(f"{name} must list {n} entries from {sorted(allowed)}, got {value!r}")
        if self.layer_indexer_types[0] != "full":
            bad("the first layer's indexer must be 'full' (a 'shared' layer reuses the previous layer's top-k)")

    # ---- derived values -------------------------------------------------------------------------------------
    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def softmax_scale(self) -> float:
        """MLA's score scale: qk_head_dim^-0.5 (1/16 for GLM-5). No YaRN mscale: rope_type is 'default'."""
        return self.qk_head_dim**-0.5

    @property
    def rope_type(self) -> str:
        return (self.rope_parameters or {}).get("rope_type", "default")

    @property
    def rope_base(self) -> float:
        theta = (self.rope_parameters or {}).get("rope_theta", self.rope_theta)
        return float(theta if theta is not None else 10000.0)

    @property
    def layer_mlp_types(self) -> tuple[str, ...]:
        """'dense' or 'sparse' (MoE) for each main layer, as transformers derives it."""
        if self.mlp_layer_types is not None:
            return tuple(self.mlp_layer_types)
        return tuple(
            "sparse" if i >= self.first_k_dense_replace and i % self.moe_layer_freq == 0 else "dense"
            for i in range(self.num_hidden_layers)
        )

    @property
    def layer_indexer_types(self) -> tuple[str, ...]:
        """'full' (runs its indexer) or 'shared' (reuses the previous layer's top-k) for each main layer.

        Same derivation as transformers: explicit list > pattern > freq/offset schedule (GLM-5: all full).
        """
        if self.indexer_types is not None:
            return tuple(self.indexer_types)
        if self.index_topk_pattern is not None:
            p = self.index_topk_pattern
            return tuple({"F": "full", "S": "shared"}[c] for c in p) if isinstance(p, str) else tuple(p)
        freq = max(self.index_topk_freq or 1, 1)
        offset = 2 if self.index_skip_topk_offset is None else self.index_skip_topk_offset
        return tuple("full" if max(i - offset + 1, 0) % freq == 0 else "shared" for i in range(self.num_hidden_layers))

    @property
    def eos_ids(self) -> tuple[int, ...]:
        e = self.eos_token_id
        return () if e is None else (e,) if isinstance(e, int) else tuple(e)

    @property
    def num_layers_with_mtp(self) -> int:
        return self.num_hidden_layers + self.num_nextn_predict_layers

    # ---- file I/O -------------------------------------------------------------------------------------------
    @classmethod
    def from_dict(cls, raw: dict[str, Any], source: str = "config") -> GLM5Config:
        if raw.get("model_type", MODEL_TYPE) != MODEL_TYPE:
            raise ConfigError(f"{source}: model_type is {raw['model_type']!r}, expected {MODEL_TYPE!r}")
        missing = [k for k in REQUIRED_KEYS if k not in raw]
        if missing:
            raise ConfigError(f"{source} lacks required field(s): {', '.join(missing)}")
        known = {f.name for f in dataclasses.fields(cls)} - {"extra"}
        kwargs: dict[str, Any] = {}
        extra: dict[str, Any] = dict(raw.get("extra", {}))
        for key, value in raw.items():
            if key == "extra":
                continue
            if key in known:
                kwargs[key] = tuple(value) if isinstance(value, list) else value
            elif key not in _IGNORED_KEYS:
                extra[key] = value
        if "rope_parameters" not in raw and raw.get("rope_theta") is not None:  # older files: theta at top level
            kwargs["rope_parameters"] = {"rope_theta": float(raw["rope_theta"]), "rope_type": "default"}
        if "dtype" not in kwargs and isinstance(raw.get("torch_dtype"), str):
            kwargs["dtype"] = raw["torch_dtype"]
        with _reported_lock:
            new = sorted(set(extra) - _reported_unknown)
            _reported_unknown.update(new)
        for key in new:
            log.warning("%s: unknown key %r kept as is", source, key)
        try:
            return cls(**kwargs, extra=extra)
        except TypeError as e:  # a field of the wrong kind, e.g. a string where a dict is needed
            raise ConfigError(f"{source}: {e}") from None

    @classmethod
    def from_pretrained(cls, path: str | Path) -> GLM5Config:
        """Read `<dir>/config.json` (or a json file)."""
        path = Path(path)
        file = path / "config.json" if path.is_dir() else path
        if not file.is_file():
            raise ConfigError(f"no config.json at {path}")
        try:
            raw = json.loads(file.read_text(errors="replace"))
        except json.JSONDecodeError as e:
            raise ConfigError(f"{file} is not valid JSON: {e}") from None
        except (ValueError, RecursionError) as e:  # nesting past the stack, a number past the digit limit
            raise ConfigError(f"{file} is not readable JSON ({type(e).__name__})") from None
        if not isinstance(raw, dict):
            raise ConfigError(f"{file} does not hold a JSON object")
        return cls.from_dict(raw, source=str(file))

    def to_dict(self) -> dict[str, Any]:
        """config.json content: every field (lists for tuples), the derived per-layer lists, unknown keys."""
        out: dict[str, Any] = {"model_type": MODEL_TYPE}
        for f in dataclasses.fields(self):
            if f.name == "extra":
                continue
            value = getattr(self, f.name)
            out[f.name] = list(value) if isinstance(value, tuple) else value
        # Written out explicitly so that every reader (transformers included) sees the same layer types.
        out["mlp_layer_types"] = list(self.layer_mlp_types)
        out["indexer_types"] = list(self.layer_indexer_types)
        out["qk_head_dim"] = self.qk_head_dim
        out.update(self.extra)
        return out

    def save(self, directory: str | Path) -> None:
        Path(directory, "config.json").write_text(json.dumps(self.to_dict(), indent=2) + "\n")

    def replace(self, **changes: Any) -> GLM5Config:
        return dataclasses.replace(self, **changes)


def _shipped_vocab(**kw: Any) -> dict[str, Any]:
    """Vocabulary fields of glm5's own 8192-token tokenizer (specials at 8128+, same order as GLM-5)."""
    return (
        dict(
            vocab_size=SHIPPED_VOCAB_SIZE,
            bos_token_id=0,
            eos_token_id=tuple(SHIPPED_EOS_IDS),
            pad_token_id=SHIPPED_PAD_ID,
        )
        | kw
    )


PRESETS: dict[str, GLM5Config] = {
    # A few million parameters; index_topk 16 so that ordinary test lengths take the sparse path.
    "tiny": GLM5Config(
        **_shipped_vocab(),
        hidden_size=64,
        intermediate_size=128,
        moe_intermediate_size=32,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=4,
        head_dim=8,
        q_lora_rank=48,
        kv_lora_rank=32,
        qk_nope_head_dim=16,
        qk_rope_head_dim=8,
        v_head_dim=16,
        index_topk=16,
        index_n_heads=8,
        index_head_dim=16,
        n_routed_experts=8,
        num_experts_per_tok=2,
        first_k_dense_replace=1,
        max_position_embeddings=4096,
        rope_parameters={"rope_theta": 10000.0, "rope_type": "default"},
        dtype="float32",
    ),
    # About 200M parameters, for CPU benchmarks: 8 layers (1 dense), 32 routed experts with 4 active.
    "small": GLM5Config(
        **_shipped_vocab(),
        hidden_size=768,
        intermediate_size=2048,
        moe_intermediate_size=256,
        num_hidden_layers=8,
        num_attention_heads=8,
        num_key_value_heads=8,
        head_dim=32,
        q_lora_rank=384,
        kv_lora_rank=256,
        qk_nope_head_dim=64,
        qk_rope_head_dim=32,
        v_head_dim=64,
        index_topk=256,
        index_n_heads=8,
        index_head_dim=64,
        n_routed_experts=32,
        num_experts_per_tok=4,
        first_k_dense_replace=1,
        max_position_embeddings=32768,
        dtype="float32",
    ),
    "glm5": GLM5Config(),
}


def preset(name: str) -> GLM5Config:
    if name not in PRESETS:
        raise ConfigError(f"unknown preset {name!r}; choose from {', '.join(PRESETS)}")
    return PRESETS[name]


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def count_parameters(cfg: GLM5Config) -> dict[str, int]:
    """Parameter counts from the config alone (no weights needed): total (main model, as GLM-5's "744B"),
    mtp (the MTP layers on top), active (per token: everything but the embedding table and the unselected
    routed experts, as GLM-5's "40B"), and `quantizable` (the linear weights FP8/INT4 would compress)."""
    h, n_heads = cfg.hidden_size, cfg.num_attention_heads
    attn_lin = (
        h * cfg.q_lora_rank
        + cfg.q_lora_rank * n_heads * cfg.qk_head_dim
        + h * (cfg.kv_lora_rank + cfg.qk_rope_head_dim)
        + cfg.kv_lora_rank * n_heads * (cfg.qk_nope_head_dim + cfg.v_head_dim)
        + n_heads * cfg.v_head_dim * h
    )
    attn_norms = cfg.q_lora_rank + cfg.kv_lora_rank
    idx_lin = cfg.q_lora_rank * cfg.index_n_heads * cfg.index_head_dim + h * cfg.index_head_dim
    idx_other = 2 * cfg.index_head_dim + h * cfg.index_n_heads  # k_norm weight+bias, weights_proj (kept bf16)
    dense_mlp = 3 * h * cfg.intermediate_size
    expert = 3 * h * cfg.moe_intermediate_size
    shared = expert * cfg.n_shared_experts
    router = cfg.n_routed_experts * h + cfg.n_routed_experts

    def layer(mlp_type: str, indexer: bool) -> tuple[int, int, int]:  # total, active, quantizable
        total = attn_lin + attn_norms + 2 * h + (idx_lin + idx_other if indexer else 0)
        quant = attn_lin + (idx_lin if indexer else 0)
        if mlp_type == "dense":
            return total + dense_mlp, total + dense_mlp, quant + dense_mlp
        moe_total = cfg.n_routed_experts * expert + shared + router
        moe_active = cfg.num_experts_per_tok * expert + shared + router
        return total + moe_total, total + moe_active, quant + cfg.n_routed_experts * expert + shared

    embed = cfg.vocab_size * h
    total, active, quant = embed * (1 if cfg.tie_word_embeddings else 2) + h, h, 0
    active += 0 if cfg.tie_word_embeddings else embed  # lm_head is a matmul per token; the embedding a lookup
    for mlp_type, idx_type in zip(cfg.layer_mlp_types, cfg.layer_indexer_types, strict=True):
        t, a, q = layer(mlp_type, idx_type == "full")
        total, active, quant = total + t, active + a, quant + q
    mtp_t, _, mtp_q = layer("sparse" if cfg.n_routed_experts else "dense", True)
    mtp_extra = 3 * h + 2 * h * h  # enorm, hnorm, shared_head.norm + eh_proj
    return {
        "total": total,
        "active": active,
        "mtp": cfg.num_nextn_predict_layers * (mtp_t + mtp_extra),
        "quantizable": quant,
        "mtp_quantizable": cfg.num_nextn_predict_layers * mtp_q,
    }


def memory_bytes(cfg: GLM5Config) -> dict[str, int]:
    """Bytes for the weights (main model + MTP) at bf16 / fp8 / int4, and for the KV cache per 1K tokens.

    fp8: quantizable linears at 1 byte + one fp32 scale per 128x128 block, the rest bf16 (GLM-5-FP8's split).
    int4: quantizable linears at 0.5 byte + one bf16 scale per group of 128, the rest bf16.
    KV cache (bf16, main layers): MLA latent + roped key (kv_lora_rank + qk_rope_head_dim) per token and layer,
    plus the indexer key (index_head_dim) on 'full' indexer layers.
    """
    p = count_parameters(cfg)
    total = p["total"] + p["mtp"]
    quant = p["quantizable"] + p["mtp_quantizable"]
    rest = total - quant
    n_full = sum(t == "full" for t in cfg.layer_indexer_types)
    kv_per_token = cfg.num_hidden_layers * (cfg.kv_lora_rank + cfg.qk_rope_head_dim) + n_full * cfg.index_head_dim
    return {
        "bf16": 2 * total,
        "fp8": quant + 4 * _ceil_div(quant, 128 * 128) + 2 * rest,
        "int4": quant // 2 + 2 * _ceil_div(quant, 128) + 2 * rest,
        "kv_cache_per_1k_tokens_bf16": 2 * kv_per_token * 1024,
    }


def human_bytes(n_bytes: int) -> str:
    for unit, div in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n_bytes >= div:
            return f"{n_bytes / div:.2f} {unit}"
    return f"{n_bytes} B"


def human_count(n: int) -> str:
    for unit, div in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= div:
            return f"{n / div:.{1 if n / div < 100 else 0}f}{unit}"
    return str(n)


__all__ = ["GLM5Config", "ConfigError", "PRESETS", "preset", "count_parameters", "memory_bytes"]
