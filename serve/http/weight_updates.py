"""Weight updates without a restart, with sglang's routes and shapes (an RL trainer's weight push):

- POST /update_weights_from_disk `{"model_path", "load_format"?, "weight_version"?}` -> `{"success", "message",
  "num_paused_requests", "weight_version"}`: every tensor of the checkpoint at `model_path` (same architecture)
  replaces the served one.
- POST /load_lora_adapter `{"lora_name", "lora_path", "weight_version"?}` / POST /unload_lora_adapter `{"lora_name"}` ->
  `{"success", "error_message", "loaded_adapters": {name: path}}`: a peft adapter (adapter_config.json +
  adapter_model.safetensors, as `glm5 finetune` writes) is merged into the served weights, W + s*B@A with
  s = lora_alpha/r (alpha/sqrt(r) with rslora); an INT4 layer serves it beside its int4 weight instead,
  W_int4 x + s*B(A x) (merged and rounded anew, every weight would move further than a small adapter does).
  Adapters are registered by name as sglang's LoRARegistry registers them: a name already loaded is refused
  ("LoRA with name X already exists", so a trainer pushes each version under a new name and unloads the old one),
  unloading a name not loaded is refused, and /generate's `lora_path` must name a loaded adapter. The embedded
  engine has no per-request adapters: it serves the adapter loaded last, merged, to every request, and /generate's
  `weight_version` says which weights sampled. Unloading that one puts the original tensors back; unloading an
  older one only takes it off the registry.
- POST /update_weight_version `{"new_version", "abort_all_requests"?}` -> `{"success", "message", "new_version"}`:
  the label the served weights report from now on.
- GET /get_weight_version -> `{"weight_version"}`.

Each update is applied by the engine thread between two steps (`AsyncLLM.update_weights`): no step sees half
of it, the prefix cache is dropped, and the weights version that /generate reports goes up by one (or takes
the `weight_version` the caller names). Requests already running continue on the new weights. Failures answer
400 with `success: false` and leave the served weights as they were. These routes sit behind the API key.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
from pathlib import Path

import anyio
import torch
from fastapi import Request
from fastapi.responses import JSONResponse
from pydantic import Field
from safetensors.torch import load_file

from model.modeling import GLM5ForCausalLM
from serve.http.protocol import _Body, parse_body


class UpdateFromDiskRequest(_Body):
    model_path: str
    load_format: str | None = None
    weight_version: str | None = None
    abort_all_requests: bool = False
    flush_cache: bool = True


class LoadLoraRequest(_Body):
    lora_name: str = Field(min_length=1)
    lora_path: str = Field(min_length=1)
    pinned: bool = False
    lora_id: str | None = None  # sglang's (its tokenizer manager fills it in); not used here
    weight_version: str | None = None  # ours (sglang's update_weights_from_disk has it): the version to report


class UnloadLoraRequest(_Body):
    lora_name: str = Field(min_length=1)
    lora_id: str | None = None


class UpdateVersionRequest(_Body):
    new_version: str
    abort_all_requests: bool = False


class UpdateError(ValueError):
    pass


def read_lora_factors(path: Path) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """name of the weight an adapter changes -> its (A [r, K], s*B [N, r]) (float32, CPU), from peft's files at
    `path`: the change is s*B@A, s = lora_alpha/r (alpha/sqrt(r) with rslora)."""
    cfg_file, tensors_file = path / "adapter_config.json", path / "adapter_model.safetensors"
    if not cfg_file.is_file() or not tensors_file.is_file():
        raise UpdateError(
            f"{path} is not a peft LoRA adapter (needs adapter_config.json and adapter_model.safetensors)"
        )
    try:
        cfg = json.loads(cfg_file.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise UpdateError(f"{cfg_file} is not readable JSON: {e}") from None
    if not isinstance(cfg, dict):
        raise UpdateError(f"{cfg_file} must hold a JSON object")
    if cfg.get("peft_type", "LORA") != "LORA" or cfg.get("use_dora") or cfg.get("fan_in_fan_out"):
        raise UpdateError(f"{path}: only plain LoRA adapters can be merged (no DoRA, no fan_in_fan_out)")
    r, alpha = cfg.get("r"), cfg.get("lora_alpha", cfg.get("r"))
    # The file is the client's: a missing, zero or non-numeric rank or alpha is its error, not a 500.
    if isinstance(r, bool) or not isinstance(r, int) or r < 1:
        raise UpdateError(f"{cfg_file}: r must be a positive integer, not {r!r}")
    if isinstance(alpha, bool) or not isinstance(alpha, int | float) or not math.isfinite(alpha):
        raise UpdateError(f"{cfg_file}: lora_alpha must be a number, not {alpha!r}")
    scale = alpha / math.sqrt(r) if cfg.get("use_rslora") else alpha / r
    try:
        state = load_file(str(tensors_file))
    except Exception as e:  # safetensors' own error type for a corrupt file, OSError for an unreadable one
        raise UpdateError(f"cannot read {tensors_file}: {e}") from None
    factors = {}
    for key, a in state.items():
        if ".lora_A." not in key:
            continue
        b = state.get(key.replace(".lora_A.", ".lora_B."))
        if b is None:
            raise UpdateError(f"{path}: {key} has no lora_B beside it")
        if a.dim() != 2 or b.dim() != 2 or b.shape[1] != a.shape[0]:
            raise UpdateError(f"{path}: {key}: A {tuple(a.shape)} and B {tuple(b.shape)} are not LoRA factors")
        name = key.removeprefix("base_model.model.").replace(".lora_A.weight", ".weight")
        factors[name] = (a.float(), scale * b.float())
    if not factors:
        raise UpdateError(f"{path}: the adapter has no LoRA weights")
    return factors


def split_lora(path: Path, factors: dict, weights: dict, int4_layers: dict) -> tuple[dict, dict]:
    """An adapter's factors -> (dense deltas for full-precision weights by name, (A, s*B) for INT4 layers by
    module name). An INT4 layer keeps its factors beside its int4 weight: merged and rounded anew, every weight
    would move by INT4's rounding (~10% of it), far more than a small adapter's change."""
    deltas, low = {}, {}
    for name, (a, b) in factors.items():
        module = name.removesuffix(".weight")
        if name in weights:
            shape = tuple(weights[name].shape)
        elif module in int4_layers:
            shape = tuple(int4_layers[module])
        else:
            raise UpdateError(f"{path}: the adapter targets {name}, which this model does not have")
        if (b.shape[0], a.shape[1]) != shape:
            raise UpdateError(f"{path}: {name} is {shape} here, the adapter's delta {(b.shape[0], a.shape[1])}")
        if name in weights:
            deltas[name] = b @ a
        else:
            low[module] = (a, b)
    return deltas, low


def int4_layer_shapes(model) -> dict[str, tuple[int, int]]:
    """name -> (out_features, in_features) of every INT4 layer of `model`: those take an adapter beside their
    int4 weight (`Int4Linear.set_low_rank`)."""
    return {n: (m.out_features, m.in_features) for n, m in model.named_modules() if hasattr(m, "set_low_rank")}


def attach_lora(model, path: Path) -> int:
    """Apply the adapter at `path` to `model` in place: merged into full-precision weights, beside the int4
    weight of INT4 layers (`glm5 serve --quant int4 --lora`: the served change is exactly the adapter's).
    -> how many layers keep it beside an int4 weight."""
    weights = dict(model.state_dict())
    deltas, low = split_lora(path, read_lora_factors(path), weights, int4_layer_shapes(model))
    with torch.no_grad():
        for name, d in deltas.items():
            w = weights[name]
            w.copy_((w.float() + d.to(w.device)).to(w.dtype))
    for name, (a, b) in low.items():
        model.get_submodule(name).set_low_rank(a, b)
    return len(low)


class WeightUpdater:
    """The served weights' history the routes need: the tensors an adapter replaced, and the adapter loaded."""

    def __init__(self, engine):
        self.engine = engine
        self.lock = asyncio.Lock()  # one update at a time
        self.originals: dict[str, torch.Tensor] = {}  # weights the loaded adapter changed, as they were
        self.adapter: tuple[str, str] | None = None  # (lora_name, lora_path) of the adapter served (merged)
        self.registry: dict[str, str] = {}  # every loaded adapter, name -> path, in load order (sglang's registry)
        self.low_rank: set[str] = set()  # INT4 layers that serve the loaded adapter's factors beside their weight
        self.labels: dict[int, str] = {}  # engine version -> the weight_version its caller named

    def loaded(self) -> dict[str, str]:
        return dict(self.registry)

    def check_loaded(self, name: str) -> None:
        """/generate's `lora_path`: the name of a loaded adapter, else sglang's error."""
        if name not in self.registry:
            raise UpdateError(f"The following requested LoRA adapters are not loaded: {name}\n"
                              f"Loaded adapters: {list(self.registry)}.")  # fmt: skip

    def _weights(self) -> dict[str, torch.Tensor]:
        weights = getattr(self.engine, "named_weights", None)
        if weights is None or not hasattr(self.engine, "update_weights"):
            raise UpdateError("this engine cannot update its weights in place")
        return weights()

    async def _apply(self, state_dict: dict, label: str | None, low_rank: dict | None = None) -> str:
        weights = self._weights()
        # Checked whole before anything is written: load_state_dict would copy what fits and then complain.
        for name, t in state_dict.items():
            if name not in weights:
                raise UpdateError(f"the new weights do not fit the served model: it has no {name}")
            if tuple(t.shape) != tuple(weights[name].shape):
                raise UpdateError(
                    f"the new weights do not fit the served model: {name} is {tuple(t.shape)}, "
                    f"served {tuple(weights[name].shape)}"
                )
        version = await (self.engine.update_weights(state_dict, low_rank) if low_rank else
                         self.engine.update_weights(state_dict))  # fmt: skip
        if label is not None:
            self.labels[version] = label
        return self.label(version)

    def label(self, version) -> str:
        return self.labels.get(version, str(version))

    async def from_disk(self, req: UpdateFromDiskRequest) -> str:
        if req.load_format not in (None, "auto", "safetensors"):
            raise UpdateError(f"load_format {req.load_format!r}: only safetensors checkpoints are read")
        path = Path(req.model_path)
        if not path.is_dir() or not any(path.glob("*.safetensors")):
            raise UpdateError(f"{path} is not a checkpoint directory (no *.safetensors)")
        weights = self._weights()
        dtype = next(iter(weights.values())).dtype

        def load() -> dict:
            return GLM5ForCausalLM.from_pretrained(path, dtype=dtype, device="cpu").state_dict()

        try:
            state = await anyio.to_thread.run_sync(load)
        except Exception as e:  # a checkpoint the client names may fail any way (a corrupt file: SafetensorError)
            raise UpdateError(f"cannot read {path}: {type(e).__name__}: {e}") from None
        check_covers(state, weights, path)
        state = {k: v for k, v in state.items() if k in weights}
        version = await self._apply(state, req.weight_version)
        self.originals, self.adapter, self.registry = {}, None, {}  # the new checkpoint is the base now
        return version

    async def load_lora(self, req: LoadLoraRequest) -> str:
        if req.lora_name in self.registry:
            raise UpdateError(f"LoRA with name {req.lora_name} already exists. Loaded LoRAs: {list(self.registry)}")
        weights = self._weights()
        int4 = getattr(self.engine, "int4_layers", dict)()
        path = Path(req.lora_path)

        def read() -> tuple[dict, dict]:
            return split_lora(path, read_lora_factors(path), weights, int4)

        deltas, low = await anyio.to_thread.run_sync(read)
        originals = dict(self.originals)
        for name in deltas:
            originals.setdefault(name, weights[name].detach().to("cpu", copy=True))
        update = {n: originals[n] for n in originals if n not in deltas}  # the previous adapter's other tensors
        for name, delta in deltas.items():
            base = originals[name]
            update[name] = (base.float() + delta).to(base.dtype)
        low_rank = {**{n: None for n in self.low_rank if n not in low}, **low}  # the previous adapter's others go
        version = await self._apply(update, req.weight_version, low_rank)
        self.originals, self.adapter, self.low_rank = originals, (req.lora_name, req.lora_path), set(low)
        self.registry[req.lora_name] = req.lora_path
        return version

    async def unload_lora(self, req: UnloadLoraRequest) -> str:
        if req.lora_name not in self.registry:
            raise UpdateError(f"LoRA with name {req.lora_name} does not exist. Loaded LoRAs: {list(self.registry)}")
        if self.adapter is None or self.adapter[0] != req.lora_name:
            del self.registry[req.lora_name]  # not the one served: the weights stay as they are
            return self.label(self.engine.weights_version)
        version = await self._apply(dict(self.originals), None, {n: None for n in self.low_rank})
        self.originals, self.adapter, self.low_rank = {}, None, set()
        del self.registry[req.lora_name]
        return version


def check_covers(state: dict, weights: dict, path: Path) -> None:
    """A checkpoint replaces every served weight, with the same shapes: one of another model (fewer layers) was
    applied in part and reported a success, its MTP layer written over a decoder layer. The one part it may lack is
    the MTP layer (the last layer index), whole: transformers' save_pretrained writes none."""
    layer = re.compile(r"^model\.layers\.(\d+)\.")

    def decoders(names) -> int:  # the layers that are not an MTP layer (DeepSeek's: it has an eh_proj)
        every = {int(m.group(1)) for n in names if (m := layer.match(n))}
        return len(every - {int(layer.match(n).group(1)) for n in names if n.endswith(".eh_proj.weight")})

    if decoders(state) != decoders(weights):
        raise UpdateError(f"{path}: its weights do not fit the served model ({decoders(state)} decoder layers for "
                          f"{decoders(weights)}); nothing was changed")  # fmt: skip
    indices = [int(m.group(1)) for n in weights if (m := layer.match(n))]
    mtp = f"model.layers.{max(indices)}." if indices else None
    missing = [n for n in weights if n not in state]
    if mtp and missing and all(n.startswith(mtp) for n in missing) and not any(k.startswith(mtp) for k in state):
        missing = []  # no MTP layer in the checkpoint: the served one stays
    shapes = [n for n in weights if n in state and tuple(state[n].shape) != tuple(weights[n].shape)]
    if missing or shapes:
        what = (f"lacks {len(missing)} of the served weights (e.g. {missing[0]})" if missing else
                f"has other shapes for {len(shapes)} weights (e.g. {shapes[0]}: {tuple(state[shapes[0]].shape)} "
                f"for {tuple(weights[shapes[0]].shape)})")  # fmt: skip
        raise UpdateError(f"{path}: its weights do not fit the served model (it {what}); nothing was changed")


def _updater(state) -> WeightUpdater:
    if state.weight_updater is None:
        state.weight_updater = WeightUpdater(state.engine)
    return state.weight_updater


async def update_weights_from_disk(state, request: Request):
    req = parse_body(UpdateFromDiskRequest, await request.body())
    up = _updater(state)
    async with up.lock:
        try:
            version = await up.from_disk(req)
        except UpdateError as e:
            return JSONResponse({"success": False, "message": str(e), "num_paused_requests": 0}, status_code=400)
    body = {"success": True, "message": "Succeeded to update model weights.", "num_paused_requests": 0}
    return JSONResponse({**body, "weight_version": version})


async def load_lora_adapter(state, request: Request):
    return await _lora(state, parse_body(LoadLoraRequest, await request.body()), load=True)


async def unload_lora_adapter(state, request: Request):
    return await _lora(state, parse_body(UnloadLoraRequest, await request.body()), load=False)


async def _lora(state, req, load: bool):
    up = _updater(state)
    async with up.lock:
        try:
            version = await (up.load_lora(req) if load else up.unload_lora(req))
        except UpdateError as e:
            body = {"success": False, "error_message": str(e), "loaded_adapters": up.loaded()}
            return JSONResponse(body, status_code=400)
    return {"success": True, "error_message": "", "loaded_adapters": up.loaded(), "weight_version": version}


def weight_version(state, version=None) -> str:
    """How a weights version is reported (/generate, /get_weight_version): the label its update named, or the
    engine's count. None: the version served now."""
    version = state.engine.weights_version if version is None else version
    up = state.weight_updater
    return up.label(version) if up is not None else str(version)


async def get_weight_version(state):
    return {"weight_version": weight_version(state)}


async def update_weight_version(state, request: Request):
    """sglang's /update_weight_version: label the weights served now (a trainer's step after a push)."""
    req = parse_body(UpdateVersionRequest, await request.body())
    if req.abort_all_requests:
        for rid in list(state.pause.running):
            await state.abort(rid)
    up = _updater(state)
    async with up.lock:
        up.labels[state.engine.weights_version] = req.new_version
    return {"success": True, "message": f"Weight version updated to {req.new_version}", "new_version": req.new_version}
