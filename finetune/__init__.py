"""Fine-tuning: trajectories -> token ids + loss masks, SFT (LoRA / full), MTP alignment, RL.

Module map:
- train_loop.py      the explicit loop every recipe runs (forward -> loss -> backward -> clip -> step), AdamW with
                     warm-up + cosine (OptimConfig), LossTerms, exact-resume training states
- mtp_objective.py   GLM-5's LM + chained MTP loss (mtp_loss: loss masks, MTP-only mode, self-distillation
                     targets) and train_mtp (MTPTrainConfig)
- mtp_align.py       align the MTP layer with its main model (its generations or recorded responses; MTP layer
                     only) and rank a draft vocabulary
- recipe.py          what every recipe shares with whoever runs it: Run (the run folder, resume lines), the Reporter
                     protocol (lines, spinners, progress; Quiet shows nothing)
- errors.py          RunError (the run cannot go on) and UsageError (the input is wrong), each with a hint
- loading.py         what a recipe reads: the checkpoint in fp32 (INT4 refused), its tokenizer, the data and prompt
                     files (bad input as UsageError)
- artifacts.py       what a run writes: adapter (peft + transformers layout), merged / full / sharded / QLoRA / QAT
                     checkpoints, step adapters, train log, the run's record; the one atomic-write helper
- sft.py             supervised fine-tuning (SFTConfig, sft_loss, train_sft): masked next-token loss on the model's
                     turns, micro-batches, packing, LoRA or full
- sft_run.py         the recipe of `glm5 finetune sft` (SFTJob, SFTRun): torchrun, LoRA / full / QLoRA set-up, QAT,
                     resume, writing, the summary
- mtp_align_run.py   the recipe of `glm5 finetune align-mtp` (AlignJob, run_align_mtp)
- dsa_warmup_run.py  the recipe of `glm5 finetune dsa-warmup`: both stages as one job and its resume state machine
                     (warmup -> warmup_done -> sparse), the step log
- grpo_run.py        the recipe of `glm5 finetune rl --env completion` (CompletionJob, completion_config: the CLI's
                     options -> RLConfig, run_completion_rl)
- full.py            full fine-tuning: what trains (MTP layer and indexer frozen by default), the routers' bias
                     by the balancing rule (RouterBalancer)
- lora.py            peft LoRA on GLM-5: add_lora, save/load_adapter (the base's path and weights fingerprint,
                     checked on load), merge_lora
- lora_hf.py         export_hf_adapter: the adapter in transformers' layout (fused experts via peft target_parameters),
                     OUT/adapter_hf, which peft loads into GlmMoeDsaForCausalLM
- distill.py         cross-stage on-policy distillation (report Eq. 2): student samples, teachers by domain (a
                     checkpoint, or the student's base with its LoRA off) score them, per-token reverse KL
- distill_run.py     what `glm5 finetune distill` runs: teachers and prompt files by domain, the step log, the
                     recipe (DistillJob, DistillRun)
- dsa_warmup.py      DSA adaptation (DeepSeek-V3.2's recipe): the indexers' dense warm-up (KL to the attention
                     summed over heads, the model frozen), then sparse training with the indexers' loss detached
- qat.py             INT4 quantization-aware training: fake-quant linears through model.quant_int4's quantizer,
                     straight-through gradients; the INT4 checkpoint written with the trained scheme
- run_dir.py         a resumable run's folder (.OUT.partial -> OUT, settings, data, checkpoints), marked by this machine
- resume_state.py    state.pt read without running code (weights_only) and checked before a run resumes from it
- distributed.py     torchrun + FSDP2: the process group, fully_shard per decoder layer + a loss root, each
                     rank's rows of the global batch with a summed gradient (the one-process curve), rank 0 writes;
                     `lockstep` and `call` for recipes whose ranks do unequal work (distill's sampling and scoring)
- plan.py            `glm5 finetune plan`: per-GPU memory of a layout (weights, adapter, gradients, optimizer, FSDP
                     gathers, activations) for the real sizes, the advice when it does not fit; the training
                     commands' check before they load. No torch: it counts lora.py's DEFAULT_TARGETS from the config
- qlora.py           frozen base linears kept FP8 / INT4 / bf16 and dequantised per linear in forward and backward,
                     the modules peft's LoRA wraps for --qlora
- sharded_load.py    --qlora's load: the model on meta, Frozen* swaps, LoRA, checkpointing per layer, FSDP2, and each
                     rank reading only its rows of each tensor from the safetensors files (no LoRA: a frozen teacher)
- slime/             glm5 inside slime: the custom generate-function hook (a glm5 agent session in the bench's
                     environment), task and SFT data conversion, the GLM-5 launch script (see slime/__init__.py)
- dist_checkpoint.py DCP checkpoints in the run folder (dcp-STEP/), read back as the loop's state at any world
                     size; a plain process reads them too, and a torchrun run reads a plain one's state.pt
- data/              training data in: glm5 trajectories, bench runs, OpenAI chat JSONL, mini-swe-agent, Harbor
                     ATIF -> one sequence per session branch with target masks (TITO where recorded); batches,
                     packing, prompt files; one JSON/JSONL reader for all of them, data/jsonl.py (its own module map)
- grpo.py            RL on single completions (GRPO + IcePop, on-policy): train_grpo wires rl/'s run_rl (sync) with
                     rl/completion.py's CompletionEnv; RL_TARGETS, RLTask, StepStats (the completion run's log row)
- rl/                the one RL: orchestrator -> buffer -> trainer -> weight push, sync or async, on agent sessions
                     or single completions (see rl/__init__.py)
- proof/             `glm5 bench proof`: base -> SFT -> RL on a generated repair family, each stage a glm5 command,
                     served and benched on held-out (see proof/__init__.py)

The life of `glm5 finetune sft` (sft_run.py): recipe.Run opens (or resumes) the run folder -> loading.py reads
every file into (ids, target mask) sequences and a report (data/sources.py) -> lora.py adds adapters (or
full.py picks the parameters) -> sft.train_sft runs train_loop.train on sft_loss (padded or packed batches,
micro-batched), checkpointing into the run folder -> artifacts.py writes OUT/adapter (or OUT becomes a
checkpoint) and train_log.jsonl -> run_dir renames it to OUT.
Under `torchrun --nproc-per-node N -m glm5cli finetune sft`, distributed.py shards the model after LoRA (or
prepare_full), each rank trains on its rows, dist_checkpoint.py checkpoints, and rank 0 writes OUT. With --qlora,
sharded_load.py builds the sharded model from the checkpoint instead (no rank loads it whole) and OUT/adapter
is the only output. `finetune distill --qlora` loads its student and teacher checkpoints the same way.
"""
