"""Launchers for external engines: `glm5 serve --engine sglang|vllm` when one machine's embedded engine is not enough.

Module map:
- topology.py  `Topology`: nodes x GPUs, parallelism (TP / EP / DP, dp-attention), precision, MTP speculation;
               reads the checkpoint's precision and checks there are enough GPUs for it.
- sglang.py    `sglang_command(topology, ...)`: the `sglang serve` argv with GLM-5's flags, per hardware (and an RL
               rollout server's LoRA flags).
- vllm.py      `vllm_command(topology, ...)`: the `vllm serve` argv with GLM-5's flags.
- common.py    `ServerOptions` (listen address, served name, API key, extra args), `EngineCommand` (argv + env,
               printed with the key masked), the flags both engines share, the install check.
- process.py   `ExternalServer`: runs that argv as a child process, streams its log, waits for its /health,
               forwards SIGINT / SIGTERM, and returns its exit code.
- launch.py    what `glm5 serve --engine sglang|vllm` does: `plan_launch` (topology checked, weights fit, each
               node's command) and `run_launch` (the ExternalServer with its health check).

Life of a launch: CLI flags -> Topology -> launch.plan_launch -> argv (printed; `--dry-run` stops here) ->
launch.run_launch -> ExternalServer.run().
Neither engine is ever imported by glm5: we only ask `importlib.util.find_spec` whether it is installed.
"""
