"""What glm5 sends sglang and vLLM, checked by their own code: every launch recipe's argv parsed by sglang's
`prepare_server_args` / vLLM's `vllm serve` parser, and every body the RL client sends (/generate, the adapter
routes, pause / continue, update_weights_from_disk) built with sglang's own request and sampling-parameter classes,
so an unknown key fails here as it fails against a real server.

The engines need CUDA to run, not to parse: scripts/engines_env.sh installs sglang and vLLM at the versions the
extras pin into .venv-engines without their dependencies, plus the few modules their imports need (and one
two-line shim, tests/serve/engines/cpu_shim.py). These tests run the check scripts there (`GLM5_ENGINES_PYTHON`
names another interpreter) and skip, saying how to build it, where it is absent.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import httpx
import pytest

from tests.serve.launch_recipes import RECIPES, build

ROOT = Path(__file__).resolve().parents[2]
ENGINES = Path(os.environ.get("GLM5_ENGINES_PYTHON", ROOT / ".venv-engines" / "bin" / "python"))
CHECKS = Path(__file__).parent / "engines"

pytestmark = pytest.mark.skipif(
    not ENGINES.exists(), reason=f"no engines environment at {ENGINES}: build it with scripts/engines_env.sh"
)


def run_check(script: str, payload) -> dict | list:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHONWARNINGS": "ignore"}
    out = subprocess.run([str(ENGINES), str(CHECKS / script)], input=json.dumps(payload), capture_output=True,
                         text=True, timeout=600, env=env)  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def client_bodies() -> dict[str, list[dict]]:
    """Every body glm5's RL client sends, by route: its HttpServer driven through a generate on the base model, an
    adapter push, a generate on the adapter, a second push (unloading the first) and a full-weight push. Answers come
    from a transport that records the requests; the verdict on them is sglang's, below."""
    from finetune.rl.remote import HttpServer
    from finetune.rl.server import GenParams

    sent: dict[str, list[dict]] = {}

    def answer(request: httpx.Request) -> httpx.Response:
        sent.setdefault(request.url.path, []).append(json.loads(request.content or b"{}"))
        if request.url.path == "/generate":
            meta = {"output_token_logprobs": [[-0.5, 7]], "weight_version": "default", "finish_reason": None}
            return httpx.Response(200, json={"text": "", "output_ids": [7], "meta_info": meta})
        return httpx.Response(200, json={"success": True, "message": "", "status": "ok"})

    server = HttpServer("http://sglang.test", api_key="k")
    server._http = httpx.Client(base_url=server.url, transport=httpx.MockTransport(answer))
    params = GenParams(max_new_tokens=8, temperature=1.0, seed=11)
    server.generate([1, 2, 3], params)
    server.load_lora_adapter("glm5-rl", "/push/v1", 1)
    server.generate([1, 2, 3], params)
    server.load_lora_adapter("glm5-rl", "/push/v2", 2)
    server.update_weights_from_disk("/push/v3", 3)
    server.generate([1, 2, 3], GenParams(max_new_tokens=8, temperature=0.0, seed=None))
    return sent


def options_argv(engine: str) -> tuple[str, ...]:
    """The server options every launch may add (key, name, batch bound, an --engine-arg), without MTP."""
    from serve.launchers.common import ServerOptions
    from serve.launchers.sglang import sglang_command
    from serve.launchers.topology import Topology
    from serve.launchers.vllm import vllm_command

    opts = ServerOptions(model="m", api_key="k", served_model_name="glm-5", max_num_seqs=32, mem_fraction=0.8,
                         extra_args=("--max-model-len" if engine == "vllm" else "--context-length", "65536"))  # fmt: skip
    build_cmd = sglang_command if engine == "sglang" else vllm_command
    return build_cmd(Topology(speculative=None), opts, ("x", "serve")).argv[2:]


@pytest.fixture(scope="module")
def sglang_verdicts():
    recipes = [r for r in RECIPES if r.engine == "sglang"]
    sent = client_bodies()
    controls = [[route, body] for route, bodies in sent.items() if route != "/generate" for body in bodies]
    bad_generate = [{"input_ids": [1], "sampling_params": {"max_new_tokens": 4, "seed": 3}}]  # glm5's old body
    payload = {
        "argv": [list(build(r).argv[2:]) for r in recipes]
        + [list(options_argv("sglang")), ["--model-path", "m", "--enable-dp-attention-x"]],
        "generate": sent["/generate"] + bad_generate,
        "control": controls + [["/pause_generation", {"mode": "pause"}]],
    }
    return recipes, sent, controls, run_check("check_sglang.py", payload)


def test_sglang_parses_every_recipe_to_the_layout_glm5_meant(sglang_verdicts):
    recipes, _, _, out = sglang_verdicts
    assert out["version"] == "0.5.23"
    for recipe, verdict in zip(recipes, out["argv"], strict=False):
        assert verdict["ok"], (recipe.name, verdict)
        got, topo = verdict["value"], recipe.topology
        assert got["tool_call_parser"] == "glm47" and got["reasoning_parser"] == "glm45", recipe.name
        assert got["attn_dp_size"] == (topo.get("dp", 1) if topo.get("dp_attention") else 1), recipe.name
        mtp = topo.get("speculative", "mtp") == "mtp" and topo.get("hardware") != "amd"
        assert (got["speculative_algorithm"] == "EAGLE") == mtp, recipe.name
        if mtp:
            steps = topo.get("spec_steps", 3)
            assert (got["speculative_num_steps"], got["speculative_num_draft_tokens"]) == (steps, steps + 1)
        if recipe.options.get("rollout_lora_rank"):
            assert got["enable_lora"] and got["max_lora_rank"] == recipe.options["rollout_lora_rank"]
            assert sorted(got["lora_target_modules"]) == sorted(recipe.options["rollout_lora_targets"])
    options = out["argv"][-2]
    assert options["ok"] and options["value"]["api_key"] == "k", options  # --api-key, --max-running-requests, ...
    assert not out["argv"][-1]["ok"]  # sglang's parser refuses what it does not know: the check can fail


def test_sglang_accepts_every_body_the_rl_client_sends(sglang_verdicts):
    _, sent, controls, out = sglang_verdicts
    generate = out["generate"]
    for body, verdict in zip(sent["/generate"], generate, strict=False):
        assert verdict["ok"], (body, verdict)
    assert generate[0]["value"]["lora_path"] is None  # before the first push: the base model
    assert generate[1]["value"]["lora_path"] == "glm5-rl-v1" and generate[1]["value"]["sampling_seed"] == 11
    assert generate[2]["value"]["lora_path"] is None  # after a full-weight push: no adapter
    assert not generate[-1]["ok"] and "seed" in generate[-1]["error"]  # the old `seed` key: sglang refuses it
    for (route, body), verdict in zip(controls, out["control"], strict=False):
        assert verdict["ok"], (route, body, verdict)
        assert not verdict["value"]["ignored"], (route, verdict)  # a key sglang would drop, doing nothing
    assert not out["control"][-1]["ok"]  # a mode sglang does not define
    # the documented flow, in order: pause, push, continue; each version under its own name; the old one unloaded
    assert [b["lora_name"] for b in sent["/load_lora_adapter"]] == ["glm5-rl-v1", "glm5-rl-v2"]
    assert sent["/unload_lora_adapter"] == [{"lora_name": "glm5-rl-v1"}]
    assert [b["mode"] for b in sent["/pause_generation"]] == ["in_place", "in_place", "retract"]
    assert len(sent["/continue_generation"]) == 3


def test_vllm_parses_every_recipe_to_the_layout_glm5_meant():
    recipes = [r for r in RECIPES if r.engine == "vllm"]
    argvs = [["serve", *build(r).argv[2:]] for r in recipes] + [["serve", *options_argv("vllm")]]
    out = run_check("check_vllm.py", argvs + [["serve", "m", "--bogus"]])
    assert out[-2]["ok"] and out[-2]["args"]["max_num_seqs"] == 32, out[-2]  # --api-key, --max-num-seqs, ...
    for recipe, verdict in zip(recipes, out, strict=False):
        assert verdict["ok"], (recipe.name, verdict)
        args = verdict["args"]
        assert args["model_tag"] == recipe.options["model"] and args["trust_remote_code"] is True
        assert args["chat_template_content_format"] == "string" and args["enable_auto_tool_choice"] is True
        nodes = recipe.topology.get("nnodes", 1)
        if recipe.topology.get("dp", 1) > 1 and nodes > 1:
            assert args["data_parallel_hybrid_lb"] is True and args["enable_expert_parallel"] is True
        assert args["headless"] == (recipe.topology.get("node_rank", 0) > 0)
    assert not out[-1]["ok"]
