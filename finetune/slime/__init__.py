"""glm5 inside slime (THUDM/slime: Megatron training, sglang rollouts; what GLM-5 was RL-trained with): glm5
supplies the agent, its sandboxed bench environment and the bench's grading, slime the trainer at full scale.
slime is not a dependency: nothing here imports it at module level, and `generate` imports slime's Sample type
only when slime calls it.

Module map:
- tasks.py     SWE-bench / Harbor tasks -> slime's prompt data (JSONL rows: prompt, label, metadata naming the
               task for the rollout module)
- samples.py   a glm5 Rollout (one agent session: its branches as token samples, the bench's grade) -> slime
               Samples: tokens, response_length, loss_mask, rollout_log_probs, reward, one rollout_id for all of
               a session's segments, weight_versions, status
- generate.py  slime's custom generate-function hook (`--custom-generate-function-path
               finetune.slime.generate.generate`): one glm5 agent session per prompt row in glm5's bench
               environment, against slime's sglang router (token in, token out; the session id as routing key),
               graded by the bench
- launch.py    the slime launch script for GLM-5's topology (slime's own GLM-5 recipe) with the hook wired in

The life of a slime rollout: slime reads OUT/prompts.jsonl (tasks.py) -> for each row calls generate(args,
sample, sampling_params) -> finetune.rl's Orchestrator runs one session (SessionModel over HttpServer at the
router) in a BenchEnv trial -> the Rollout -> samples.py -> slime trains on the returned Samples.
"""
