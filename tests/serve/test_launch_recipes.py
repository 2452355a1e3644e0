"""Golden tests: glm5's sglang / vLLM command for each GLM-5 launch recipe is exactly the one in launch_recipes.py,
which names the source each follows (and test_engine_contracts.py parses each with the engine's own parser)."""

from __future__ import annotations

import pytest

from serve.launchers.common import ServerOptions
from serve.launchers.sglang import sglang_command
from serve.launchers.topology import Topology, TopologyError
from serve.launchers.vllm import vllm_command
from tests.serve.launch_recipes import RECIPES, build


@pytest.mark.parametrize("recipe", RECIPES, ids=[r.name for r in RECIPES])
def test_each_recipe_is_glm5s_command_word_for_word(recipe):
    cmd = build(recipe)
    program = 2
    assert " ".join(cmd.argv[program:]) == recipe.argv, recipe.source
    assert cmd.env == recipe.env
    assert cmd.serves_http == (recipe.topology.get("node_rank", 0) == 0)


def test_mtp_on_amd_and_rl_with_data_parallel_are_refused_naming_the_fix():
    with pytest.raises(TopologyError, match="--speculative off"):
        sglang_command(Topology(hardware="amd", precision="bf16"), ServerOptions(model="m"))
    with pytest.raises(TopologyError, match="--rollout-url"):
        sglang_command(Topology(dp=8, dp_attention=True), ServerOptions(model="m", rollout_lora_rank=8))
    with pytest.raises(TopologyError, match="--engine sglang"):
        vllm_command(Topology(), ServerOptions(model="m", rollout_lora_rank=8))
    with pytest.raises(TopologyError, match="--hardware"):
        Topology(hardware="tpu").validate()


def test_the_cli_passes_num_draft_tokens_hardware_and_the_rl_server_flags():
    from typer.testing import CliRunner

    from glm5cli.app import app

    r = CliRunner().invoke(app, ["serve", "zai-org/GLM-5-FP8", "--engine", "sglang", "--dry-run",
                                 "--num-draft-tokens", "1"])  # fmt: skip
    assert r.exit_code == 0, r.output
    assert "--speculative-num-steps 1 --speculative-eagle-topk 1 --speculative-num-draft-tokens 2" in r.output
    r = CliRunner().invoke(app, ["serve", "zai-org/GLM-5-FP8", "--engine", "vllm", "--dry-run",
                                 "--num-draft-tokens", "2"])  # fmt: skip
    assert r.exit_code == 0 and "--speculative-config.num_speculative_tokens 2" in r.output, r.output
    r = CliRunner().invoke(app, ["serve", "zai-org/GLM-5", "--engine", "sglang", "--dry-run", "--hardware", "amd",
                                 "--gpu-memory-gib", "288"])  # fmt: skip
    assert r.exit_code == 0 and "tilelang" in r.output and "EAGLE" not in r.output, r.output
    r = CliRunner().invoke(app, ["serve", "zai-org/GLM-5-FP8", "--engine", "sglang", "--dry-run",
                                 "--rollout-lora-rank", "16", "--speculative", "off"])  # fmt: skip
    assert r.exit_code == 0, r.output
    assert "--enable-lora --max-lora-rank 16 --lora-target-modules q_a_proj" in r.output
    r = CliRunner().invoke(app, ["serve", "zai-org/GLM-5", "--engine", "vllm", "--dry-run", "--nnodes", "2",
                                 "--dist-init-addr", "h0:20000", "--socket-ifname", "ib0"])  # fmt: skip
    assert r.exit_code == 0 and "GLOO_SOCKET_IFNAME=ib0 NCCL_SOCKET_IFNAME=ib0" in r.output, r.output
