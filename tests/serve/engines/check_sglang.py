"""Run inside .venv-engines (sglang installed without its dependencies, its modules' imports satisfied): check what
glm5 sends sglang with sglang's own code. Reads a JSON object on stdin, prints one JSON answer per item:

- "argv": lists of `sglang serve` arguments -> parsed by sglang's `prepare_server_args` (its argparse parser and
  ServerArgs record); the answer carries the fields the test compares.
- "generate": /generate bodies -> sglang's HTTP contract gate (`generate_contract_error`, the schema both its Python
  and Rust servers apply first), then `GenerateReqInput(**body)` (the dataclass FastAPI fills), then
  `SamplingParams(**sampling_params)` (what the tokenizer manager builds: an unknown key is a TypeError) and its
  `verify()`.
- "control": [route, body] pairs -> the route's request struct (LoadLoRAAdapterReqInput, UnloadLoRAAdapterReqInput,
  PauseGenerationReqInput, ContinueGenerationReqInput, UpdateWeightFromDiskReqInput, UpdateWeightVersionReqInput)
  validated as FastAPI validates a body (pydantic over sglang's msgspec schema).
"""

import json
import sys

import cpu_shim  # noqa: F401 -- first: see its docstring

FIELDS = ("tp_size", "dp_size", "attn_dp_size", "ep_size", "speculative_algorithm", "speculative_num_steps",
          "speculative_eagle_topk", "speculative_num_draft_tokens", "enable_lora", "max_lora_rank",
          "lora_target_modules", "api_key", "nnodes", "node_rank", "dist_init_addr", "mem_fraction_static",
          "attention_backend", "dsa_prefill_backend", "dsa_decode_backend", "moe_runner_backend", "quantization",
          "flashinfer_allreduce_fusion_backend", "tool_call_parser", "reasoning_parser", "chunked_prefill_size",
          "watchdog_timeout", "trust_remote_code", "model_path", "port", "host")  # fmt: skip


def check_argv(argv):
    from sglang.srt.server_args import prepare_server_args

    args = prepare_server_args(list(argv))
    return {k: _plain(getattr(args, k, "<absent>")) for k in FIELDS}


def check_generate(body):
    from sglang.srt.entrypoints.api_contract import generate_contract_error
    from sglang.srt.managers.io_struct import GenerateReqInput
    from sglang.srt.sampling.sampling_params import SamplingParams

    error = generate_contract_error(body)
    if error is not None:
        raise ValueError(f"contract: {error}")
    req = GenerateReqInput(**body)
    sp = SamplingParams(**(req.sampling_params or {}))
    sp.verify(vocab_size=151552)  # GLM-5's vocabulary
    return {"lora_path": req.lora_path, "sampling_seed": sp.sampling_seed, "max_new_tokens": sp.max_new_tokens}


def check_control(route, body):
    from pydantic import TypeAdapter
    from sglang.srt.managers import io_struct as io

    structs = {
        "/load_lora_adapter": io.LoadLoRAAdapterReqInput,
        "/unload_lora_adapter": io.UnloadLoRAAdapterReqInput,
        "/pause_generation": io.PauseGenerationReqInput,
        "/continue_generation": io.ContinueGenerationReqInput,
        "/update_weights_from_disk": io.UpdateWeightFromDiskReqInput,
        "/update_weight_version": io.UpdateWeightVersionReqInput,
    }
    obj = TypeAdapter(structs[route]).validate_python(body)
    known = {k for k in body if hasattr(obj, k)}
    # sglang drops keys its struct does not have: a key glm5 sends that lands here would do nothing there
    return {"fields": {k: _plain(getattr(obj, k)) for k in known}, "ignored": sorted(set(body) - known)}


def _plain(v):
    try:
        json.dumps(v)
        return v
    except TypeError:
        return sorted(v) if isinstance(v, set) else repr(v)


def main() -> None:
    todo = json.load(sys.stdin)
    out = {"argv": [], "generate": [], "control": []}
    for kind, fn in (("argv", check_argv), ("generate", check_generate), ("control", check_control)):
        for item in todo.get(kind, []):
            try:
                out[kind].append({"ok": True, "value": fn(*item) if kind == "control" else fn(item)})
            except SystemExit as e:
                out[kind].append({"ok": False, "error": f"argparse exited {e.code}"})
            except Exception as e:  # sglang's own verdict, whatever its type
                out[kind].append({"ok": False, "error": f"{type(e).__name__}: {e}"})
    import sglang

    out["version"] = sglang.__version__
    print(json.dumps(out))


if __name__ == "__main__":
    main()
