"""ProofConfig: every knob of a proof run, saved in RUN/proof.json (a resumed run must ask for the same).

`ProofConfig()` is the full proof's setting; `ProofConfig.smoke()` the seconds-to-minutes one the tests and a
first try use (the `tiny` model, a few tasks, one step per stage). Nothing here is tuned on the held-out split:
counts, steps and rates are fixed before a run and the same for every stage.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.profiles import PROFILES

# the model stages, in order; each is measured on held-out after it is trained. `forget` is full SFT on another
# task kind (renames, no repair) that is expected to make the model lose part of what SFT and RL taught;
# `distill` wins it back: on-policy distillation of forget's model from the stage before forget (GLM-5's last,
# cross-stage step), on the contexts of every turn of the expert's train sessions.
STAGES = ("base", "sft", "rl", "forget", "distill")
# The proof's model: `tiny` grown to ~4.6M parameters: MLA, MoE with 8 routed experts (2 active), MTP, and a DSA
# indexer whose top-512 is below a session's ~700-1,500 tokens, so it drops keys. Widths are multiples of INT4's
# group of 128 where INT4 applies. (Hidden 256 trained 1.5x slower per token for nothing the pilots could see.)
PROOF_MODEL = ("hidden_size=128", "intermediate_size=384", "moe_intermediate_size=128", "num_hidden_layers=4",
               "num_attention_heads=4", "num_key_value_heads=4", "q_lora_rank=128", "kv_lora_rank=64",
               "qk_nope_head_dim=32", "qk_rope_head_dim=16", "v_head_dim=32", "index_topk=512",
               "index_n_heads=4", "index_head_dim=32", "n_routed_experts=8", "num_experts_per_tok=2",
               "max_position_embeddings=8192")  # fmt: skip


@dataclass(frozen=True)
class ProofConfig:
    seed: int = 0
    n_train: int = 1000  # train-split tasks: the expert's trajectories and RL's tasks
    n_heldout: int = 25  # held-out tasks (x k attempts): the measurement, never trained on
    # dev tasks: instances of their own drawn from the held-out split's function names (repair_family's `dev`
    # split), never trained on and never the measurement: RL's in-run evaluation (`--eval-tasks`, rl_eval_samples
    # sessions each, at step 0, every rl_curve_every steps and the last), by which RL's settings are chosen
    n_dev: int = 25
    preset: str = "tiny"  # `glm5 model init --preset`, changed by `model` (--set KEY=VALUE)
    model: tuple[str, ...] = PROOF_MODEL
    # the base model: trained from scratch on the synthetic corpus, as GLM-5 was: dense attention first
    # (`finetune sft --dense-attention`, packed rows of base_pack_len), then `finetune dsa-warmup` (the indexers
    # learn each layer's attention, then a sparse stage) gives it DSA. With an untrained indexer from the start,
    # a query past index_topk lost ~1 in 4 of the 30 keys before it in layer 0 and the model never learned to
    # copy a path from the issue (pilots: 0 of 8 copies after 400 steps; benchmarks/RESULTS.md).
    corpus_size: int = 4000
    # short exchanges without the agent prompt that ask for a path, a name or a line of code back ("Echo `X`."),
    # or two lines ("Replace `X` with `Y`."): copying, dense
    drill_size: int = 60000
    # the share of drills that are a pair inside a block of the family's code with look-alike lines (a repair's
    # edit: two quoted lines among lines that share their names; ~120 tokens each, the others ~29). Off by default:
    # with 2,000 sessions and 13% of 70,000 drills in code, dev SFT wrote the right edit twice as often (21/100
    # against 11/100, teacher-forced) but ran the right test less often (50 against 64), and its held-out SFT
    # resolved 4/100 against 5/100; only the default has a complete stage table (benchmarks/RESULTS.md)
    drill_in_code: float = 0.0
    # the share of the drills' function names that are new to every split (words the family never uses, or
    # nonsense): the base trained on train names alone copied them 22/24 times and a name of unseen words 0/24.
    # Off: at 0.5 the base still copied 0/24 unseen names and only 10/24 train names (it learnt the fresh words as
    # one more vocabulary; benchmarks/RESULTS.md)
    drill_fresh_names: float = 0.0
    # the share of drills whose names, arguments and paths are made up (nonsense words, alone or beside a family
    # word): only a copy from the prompt answers them. They keep what the copy phase grew: after it, the corpus
    # with none of them left a base that echoed train names 40/40 but made-up names 0/40 (it wrote the names it
    # knew); with 0.5, 40/40 and 21/40 (a family word beside a made-up one: 36-38/40). Without the copy phase,
    # 0.5 grew no copying in 300 steps (0/40; benchmarks/RESULTS.md)
    drill_nonsense: float = 0.5
    # the share of drills that are a comparison line with its two-digit constant, echoed or paired with another
    # operator (`write_drills(numbers=)`): seed 1's base echoed such a line 28/40 times (a path 40/40), and every one
    # of SFT's failed dev sessions was a copy error, the number among them. A dev run (p16's base-copy, a fifth of
    # the drills such lines, then the same base and SFT commands): the line 40/40, SFT on dev 86/100 against
    # 50/100 (25 x 4, served as deployed). The full run with them (p18, seed 1): SFT on held-out 67/100 (pass@4
    # 92%) against 56/100 (68%) without. Drills of every bug kind's quoted pair instead (p20, seed 0: the base
    # then wrote an off-by-one pair right 40/40 times, from 0/40) left SFT on dev where it was (32/100 against 34;
    # off-by-one 1/24 against 0/24): not adopted (benchmarks/RESULTS.md)
    drill_numbers: float = 0.2
    # before the corpus, a copy phase: copy_steps of drills whose every name is made up (`write_drills(nonsense=1)`,
    # copy_size of them), so that only a copy from the prompt lowers the loss. From scratch on that alone the model
    # grows the heads that copy (loss 3.5 at step 40, 1.0 at 240, 0.23 at 400; made-up names echoed 21/40, unseen
    # name words 2-6/40), where the corpus mix with or without made-up drills grew none in 300 steps. 0: no phase
    copy_steps: int = 400
    copy_size: int = 60000
    copy_lr: float = 2e-3
    base_steps: int = 300
    base_lr: float = 2e-3
    base_pack_len: int = 1024
    dsa_warmup_steps: int = 60
    dsa_warmup_lr: float = 1e-3
    dsa_sparse_steps: int = 40
    dsa_sparse_lr: float = 3e-4
    # the share of train tasks on which the expert first makes 1 or 2 failed edits (a wrong copy of the line, the
    # path left out), then the right one: SFT sees each slip and its error as context, masked out of the loss,
    # and learns the correction (expert.py). On dev tasks (train distribution, another seed; p7's base, 250 SFT
    # steps) SFT resolved 26/100 with 0.5 against 9/100 with none: a copy the small model gets wrong is retried
    expert_slips: float = 0.5
    # SFT on the expert's resolved train trajectories (full fine-tuning, MTP trained along)
    sft_steps: int = 250  # 2 epochs of the expert's 1,000 sessions
    sft_lr: float = 1e-3
    # agentic RL on the train split (GLM-5's async rules: `glm5 finetune rl --env swe`). No setting measured
    # raises the solve rate above SFT's, on held-out or on dev (benchmarks/RESULTS.md): from p12's SFT, dev
    # 32-34% before; 6 steps of 2 groups 32% (0 groups with signal in 5 of the 6 steps); 20 of 4: 34, 32, 26% at
    # steps 10, 15, 20; with dynamic sampling (4 groups with signal a step when the limit allows), lr 2e-4: 30% at
    # step 10; lr 5e-4 at temperature 0.7: 30, 34% at steps 5, 10; lr 2e-3: 26% at step 5. A small rate moves
    # nothing, a large one loses: ~2 groups with signal a step are too few. Dynamic sampling is kept so that
    # every step trains on signal (without it most of the proof's steps had none); 8 steps fit the hour. At lr
    # 5e-4: p14 (seed 0) held-out 47 -> 44, dev 34 -> 30%; p15 (seed 1) 56 -> 46, dev 54 -> 40%. At 2e-4, seed 1's
    # dev went 56 -> 62% once and 54 -> 54% (p16, held-out 56 -> 54) again: 2e-4 does not lose, nothing gains.
    # Groups of 8, not 4: with dynamic sampling a group without signal is rollout time thrown away, and a task
    # solved with p = 0.9 (or 0.05) gives a group of 4 signal 34% (19%) of the time, one of 8 57% (34%). On
    # seed 1's dev runs (16 steps) groups of 8 trained 0.53 sessions with signal per second of RL, groups of 4
    # 0.33-0.39; the dev curves of both were within noise (56 -> 62 -> 58%, 56 -> 56 -> 62%). p17 (these
    # defaults): held-out 56 -> 56 -> 56, dev 52 -> 54 -> 56%. 32 steps (dev run I) rose 56 -> 60 -> 62 -> 62 -> 64%
    # on dev, but RL and its sync baseline would take ~45 min of the hour
    rl_steps: int = 8
    rl_group_size: int = 8
    rl_groups_per_step: int = 2
    # DAPO's dynamic sampling (`--dynamic-sampling`): a group whose sessions all got the same reward is dropped
    # and another task drawn, up to this many x rl_groups_per_step a step; 0: off. On the train split a quarter
    # of the tasks (wrong_comparison) is never solved and a quarter (wrong_return) nearly always: ~1 group in 5
    # has signal
    rl_dynamic_sampling: int = 3
    # LoRA's rate (the CLI's default 2e-5 is for a large model: a few steps of it move a small one nowhere;
    # 5e-4 lost on dev, above)
    rl_lr: float = 2e-4
    rl_eval_samples: int = 2  # sessions per dev task at each of RL's in-run evaluations
    # RL's rollouts (and its dev evaluations) sample at the measurement's temperature: what RL sharpens is the
    # policy as deployed, and its dev curve reads like the bench's numbers
    rl_temperature: float = 0.7
    rl_sync_baseline: bool = True  # also run RL synchronously from the same SFT checkpoint: its curve beside async's
    # the learning curve through `glm5 bench`: every this many RL steps the step's adapter (`--save-every`) is
    # served and benched on held-out exactly as a stage is (step 0 is the stage before RL, the last step RL's
    # own measurement); 0: none. Each point is a bench run of its own (~100 s)
    rl_curve_every: int = 4
    # the forgetting stage: full SFT on rename sessions only (corpus.py's "rename" kind), a different task kind
    forget_size: int = 1000
    forget_steps: int = 30
    forget_lr: float = 3e-4
    # cross-stage distillation (`glm5 finetune distill --full`): student forget, teacher the stage before forget;
    # 96 steps, chosen on dev sessions (train distribution, another seed): 48 brought the edit back, not the test run
    distill_steps: int = 96
    distill_prompts_per_step: int = 4
    distill_lr: float = 1e-4
    # the agent profile (agent/profiles.py) of every session: the expert's, the corpus's (copied from the
    # expert's), RL's and the measurement's. `compact` (4 tools, a short prompt) makes an expert session
    # 954 tokens instead of 2,075 (the prefix 560 instead of 1,681); what was trained is what is measured.
    agent_profile: str = "compact"
    # torch threads of every subprocess (OMP_NUM_THREADS); 0: each stage's glm5 chooses by the cores free when it
    # starts (glm5cli/threads.py). On a machine shared with other jobs 1 was 3.7-7.2x faster than 2 for a compact
    # session's training step (benchmarks/RESULTS.md)
    threads: int = 0
    # every session with thinking off (`chat_template_kwargs.enable_thinking=false` at the bench's server, RL's
    # --no-thinking, the distillation prompts'): the expert and the corpus write no reasoning, so their turns are
    # trained as `<|assistant|></think>...`, and a thinking-on generation prompt (`<|assistant|><think>`) would
    # put every stage in a state it never saw (the first pilot's base answered "):</arg_value></tool_call>")
    thinking: bool = False
    batch_size: int = 8
    max_len: int = 2560
    # every full fine-tuning stage trains the MTP layer by GLM-5's MTP loss (`--train-mtp`), over this many
    # recursive steps: 1 (DeepSeek-V3's depth) costs ~1.25x an LM-only step on the proof's 4-layer model, GLM-5's 3
    # ~1.75x. Without it the MTP layer kept its random init and drafts were accepted 0.1% of the time.
    mtp_steps: int = 1
    # the measurement: each stage served as deployed, benched on held-out
    k: int = 4
    # trials at once (and RL's sessions): 4 benched dev tasks 1.47x faster than 2 on 2 cores (the server
    # batches their decoding while another trial's tests run)
    concurrency: int = 4
    max_turns: int = 6
    # every model response is cut here (the expert's longest is ~100 tokens): a stage that never stops costs
    # the same bounded time per turn instead of filling the context; the same cap for every stage and for RL
    max_response_tokens: int = 256
    temperature: float = 0.7
    quant: str = "int4"
    speculative: str = "mtp"
    stages: tuple[str, ...] = STAGES

    @classmethod
    def smoke(cls, **over: Any) -> ProofConfig:
        """The smallest run that goes through every step: minutes on a busy 2-core machine."""
        small = dict(n_train=2, n_heldout=1, n_dev=1, preset="tiny", model=(), corpus_size=8, drill_size=8,
                     copy_steps=1, copy_size=8, base_steps=1, dsa_warmup_steps=1, dsa_sparse_steps=1, sft_steps=1,
                     rl_steps=1, rl_sync_baseline=False, rl_dynamic_sampling=0, forget_size=4, forget_steps=1,
                     rl_group_size=2, rl_groups_per_step=1, distill_steps=1, distill_prompts_per_step=1,
                     batch_size=2, max_len=2560, k=1, concurrency=1, max_turns=2)  # fmt: skip
        return cls(**{**small, **over})

    def __post_init__(self) -> None:
        bad = [s for s in self.stages if s not in STAGES]
        if bad:
            raise ValueError(f"unknown stage(s) {', '.join(bad)}; the stages are {', '.join(STAGES)}")
        if list(self.stages) != sorted(self.stages, key=STAGES.index) or len(set(self.stages)) != len(self.stages):
            raise ValueError(f"stages {', '.join(self.stages)}: give each once, in the order {', '.join(STAGES)}")
        if "distill" in self.stages and teacher_of(self.stages) is None:
            raise ValueError("stage distill needs forget before it and a stage before forget (its teacher: rl or "
                             "sft), e.g. --stages base,sft,rl,forget,distill")  # fmt: skip
        if self.agent_profile not in PROFILES:
            raise ValueError(f"agent_profile {self.agent_profile!r}: expected one of {', '.join(PROFILES)}")
        for name in ("n_train", "n_heldout", "n_dev", "k", "concurrency", "max_turns", "batch_size",
                     "max_response_tokens", "mtp_steps", "distill_steps", "distill_prompts_per_step", "base_steps",
                     "sft_steps", "rl_steps", "rl_group_size", "rl_groups_per_step", "forget_steps", "forget_size",
                     "dsa_warmup_steps", "max_len"):  # fmt: skip
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, not {getattr(self, name)}")
        if self.copy_steps < 0 or (self.copy_steps and self.copy_size < 1):
            raise ValueError(f"copy_steps must be >= 0 (0: no copy phase) and copy_size >= 1 with a copy phase, not "
                             f"{self.copy_steps} and {self.copy_size}")  # fmt: skip
        if self.rl_eval_samples < 2 or self.rl_dynamic_sampling < 0:
            raise ValueError(f"rl_eval_samples must be >= 2 (a group) and rl_dynamic_sampling >= 0, not "
                             f"{self.rl_eval_samples} and {self.rl_dynamic_sampling}")  # fmt: skip
        if self.rl_curve_every < 0:
            raise ValueError(f"rl_curve_every must be >= 0 (0: no held-out curve), not {self.rl_curve_every}")
        if self.threads < 0:
            raise ValueError(f"threads must be >= 0 (0: torch's default), not {self.threads}")
        if self.preset not in ("tiny", "small"):
            raise ValueError(f"preset {self.preset!r}: expected tiny or small")

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["stages"], d["model"] = list(self.stages), list(self.model)
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ProofConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        d = {k: v for k, v in d.items() if k in known}
        for key in ("stages", "model"):
            if key in d:
                d[key] = tuple(d[key])
        return cls(**d)


def rl_curve_steps(c: ProofConfig) -> list[int]:
    """The RL steps benched on held-out besides the stage's own measurement (its last step)."""
    if "rl" not in c.stages or c.rl_curve_every == 0:
        return []
    return list(range(c.rl_curve_every, c.rl_steps, c.rl_curve_every))


def teacher_of(stages: tuple[str, ...]) -> str | None:
    """The distillation's teacher: the stage before forget (what forget made the model lose), or None."""
    if "forget" not in stages or stages.index("forget") == 0:
        return None
    return stages[stages.index("forget") - 1]


class ProofConfigMismatch(ValueError):
    pass


def claim(run: Path, config: ProofConfig, force: bool = False) -> None:
    """Write RUN/proof.json, or check that a resumed run asks for the same (unless force)."""
    path = Path(run) / "proof.json"
    run.mkdir(parents=True, exist_ok=True)
    if path.is_file() and not force:
        stored, new = json.loads(path.read_text()), config.to_json()
        old = ProofConfig.from_json(stored).to_json()
        # a setting the folder does not record was made by an older glm5, which did without it: not today's default
        diff = [f"{k}: not recorded -> {v!r}" for k, v in new.items() if k not in stored]
        diff += [f"{k}: {old[k]!r} -> {v!r}" for k, v in new.items() if k in stored and old[k] != v]
        if diff:
            raise ProofConfigMismatch(
                f"{run} holds a proof run with another configuration ({'; '.join(diff)}); "
                "use a new --out folder, or --force to continue with the new one"
            )
        return
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(config.to_json(), indent=1) + "\n")
    tmp.replace(path)
