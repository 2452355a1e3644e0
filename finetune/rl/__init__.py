"""The one RL (`glm5 finetune rl`: agentic with --env swe|terminal|scripted, single completions with --env
completion through finetune/grpo.py): a pipeline of plain roles, each tested alone with fakes of its neighbours;
the asynchronous and the synchronous run are the same roles wired differently.

Module map:
- config.py         RLConfig: every knob of a run, GLM-5's defaults (IS band, IcePop beta, staleness, ...), the LR
                    warm-up and updates per batch (once finetune/grpo.py's GRPOConfig)
- rollout.py        the data: ModelCall (ids in/out, rollout logprobs, weight versions), TokenSample (ids, loss
                    mask, logprobs of one branch), Rollout (a session: calls, samples, grade), Grade
- tito.py           TitoSession: token in, token out; later prompts appended by our chat format, a new branch
                    where GLM-5's template rewrites earlier turns
- session_model.py  SessionModel: the agent loop's Model over a rollout server, recording every call via TITO
- server.py         RolloutServer protocol; InProcessServer: our engine on a thread, weights swapped between steps;
                    gather(n): single-call sessions' calls as one batch in session order (exact resume)
- remote.py         HttpServer (`glm5 serve` / sglang, their API as sglang defines it: /generate naming the
                    adapter; pushes as pause -> /load_lora_adapter `glm5-rl-vN` or /update_weights_from_disk ->
                    continue; the API key) and Router (session-affine consistent hashing over several)
- engine_process.py ServeChild: `--rollout-engine process`, the run's own `glm5 serve` child (127.0.0.1, port 0,
                    a random key in its environment, killed with the run), driven as an HttpServer
- env.py            RolloutEnv / EnvSession protocol: reset(task) -> session; run(model); grade() -> Grade;
                    ServerFailure, RewardUnavailable (a step none of whose sessions could be scored)
- scripted.py       ScriptedFamily: in-process task families (tests, benchmarks, `--env scripted`)
- bench_env.py      BenchEnv: the bench's SWE / terminal tasks in its per-trial sandboxes, `glm5 code`'s agent
                    loop, graded by the bench (one definition of "solved")
- completion.py     CompletionEnv: one completion of an RLTask's prompt ids (SessionModel.complete, no chat
                    format), scored by the task's reward; None -> UNSCORED (left out of its group)
- rewards.py        hybrid reward specs: rules (tests), an outcome reward model, a generative judge; weighted
- orchestrator.py   Orchestrator: many sessions at once, group by group, gated by staleness; yields Rollouts
- buffer.py         RolloutBuffer: finished rollouts on disk; staleness drop and the crash-group rule at take
                    (UNSCORED sessions are no crash: they stay in their group)
- objective.py      the loss: direct double-sided importance sampling on pi_theta / pi_rollout (IcePop's band
                    on-policy), PPO's clip against pi_train_old for further updates on a batch, KL and mismatch
                    statistics; advantages, token_logprobs
- trainer.py        Trainer: the explicit optimizer step over a batch of groups (backward: the loss alone),
                    updates_per_batch, the LR warm-up; optional optimizer reset
- weight_push.py    WeightPush: the trainer's weights to the rollout server after each step, no restart
- sharded.py        ShardedTrainer: `finetune rl --qlora` under torchrun, the policy sharded over the ranks; rank 0
                    runs run_rl and broadcasts each trainer call (step, state, restore, the adapter gathered) as a
                    command the other ranks `follow`
- run.py            run_rl: the wiring (sync or async), resume from the run folder, rl_log rows (RewardUnavailable
                    when no session of a step was scored); summary.
                    Its steps: _Progress (what state.pt keeps besides the trainer), _StepLoop (the staleness gate,
                    wait, step: take -> train -> save -> push -> finish with its evaluation and log row)
- job.py            the recipe of `glm5 finetune rl --env swe|terminal|scripted` (AgenticJob, AgenticRun): the
                    environment and held-out tasks, INT4 rounding, the rollout server (the serve child's lifecycle),
                    rl_log.jsonl and the step adapters, the adapter written
- evaluate.py       HeldOut: the pushed policy on held-out tasks (the bench's grading for swe / terminal) before
                    training and every N steps, into rl_log rows; `disjoint` refuses training tasks held out

Life of a run: run_rl -> Orchestrator runs sessions (env.reset -> the agent queries a SessionModel ->
TitoSession builds prompt ids -> the server samples ids + logprobs + version -> env.grade) -> RolloutBuffer
stores each Rollout -> the trainer takes the next complete groups (stale samples dropped, crashed groups padded
or dropped) -> Trainer.step (IS-masked policy gradient on exactly the sampled tokens) -> state.pt -> WeightPush
(the server's version moves; the orchestrator's gate admits the next groups) -> a row of rl_log.jsonl.
A completion run (finetune/grpo.py's train_grpo) is the synchronous run with CompletionEnv: each session one
SessionModel.complete call on the task's prompt ids, the step's calls gathered into one engine batch, graded by
the task's reward; its checkpoints are run_rl's state with the step, its log rows grpo.StepStats.
"""
