"""Cross-stage on-policy distillation (GLM-5 report §3.5, Eq. 2): the student samples, a teacher scores the same
tokens, and the student is pulled towards the teacher where it sampled.

    teachers = {"math": Teacher.checkpoint(net_a), "code": Teacher.base()}   # base: the student's adapter off
    train_distill(student, prompts, teachers, DistillConfig(OptimConfig(steps=100, lr=1e-4, warmup=5)))

The loss is the report's: Eq. 1 (GRPO) with the advantage replaced by
    A_t = sg[log pi_teacher(y_t | x, y_<t) - log pi_student(y_t | x, y_<t)]
on the student's own sampled tokens y (group size 1). On-policy, one update per sample, the importance ratio is 1
and the loss is -mean_t A_t * log pi_student(y_t): a policy-gradient estimate of the gradient of the per-token
*sampled* reverse KL, E_y~student[log pi_student - log pi_teacher] (tinker-cookbook and slime's OPD use the same).
`kl="full"` instead minimises the full-vocabulary reverse KL sum_v pi_s(v) (log pi_s(v) - log pi_t(v)) at each
sampled position (TRL's GKD with beta=1, verl's GKD OPD): the same minimiser on the same (student-sampled) states.

"full" is the default because it is the one that brings a lost skill back. The sampled loss's gradient at a
position is A (onehot(y) - pi_s) on the logits: it moves the one token the student sampled and scales every other
token by the student's own probabilities. Where a skill is lost the student rarely samples the teacher's token,
so most steps only push down the student's wrong guess in favour of its other guesses, and the teacher's choice
is found by chance, a bandit over the vocabulary; the full KL reads the teacher's whole row and pulls its tokens
up directly. Measured (tests/finetune/test_distill.py's recovery test set-up: tiny preset, skill A's mean answer
log-prob about -2.5 after stage B, 8 prompts x <= 4 tokens a step, LoRA r8, lr 3e-3, 30 steps): after 20 steps full had brought A
back to -0.00 and kept B at -0.00 (its base teacher); sampled left A at -1.9 and took B from -0.00 to -2.5 (at
lr 1e-3, on a milder set-up, 30 steps: A -2.1 -> -1.6, B -0.06 -> -0.8). GLM-5 runs the sampled loss with 1024
prompts a step on a student a stage away from its teachers, where the teacher's tokens are still sampled. The
full KL needs the teacher's whole row at each position; the sampled one only the sampled token's log-prob (what a
served teacher returns): choose it for such a teacher, with many prompts a step.

A teacher is an earlier stage's checkpoint (a model of its own), or "base": the student with its LoRA adapters
switched off, which costs no second copy of the weights (peft's adapter switch, `adapters_off`). Each prompt has
a domain; each domain its teacher (tinker-cookbook's one teacher per dataset, GLM-5's mixed RL prompt sets).
The metric logged as `lm` is the sampled reverse KL estimate, mean over tokens of log pi_s - log pi_t.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Callable
from dataclasses import dataclass

import torch

from finetune.train_loop import LossTerms, OptimConfig, backward_each, train


@dataclass(frozen=True)
class DistillConfig:
    optim: OptimConfig = OptimConfig(steps=100, lr=1e-4, warmup=5)
    prompts_per_step: int = 4
    max_new_tokens: int = 64
    temperature: float = 1.0
    kl: str = "full"  # "full" (full-vocabulary reverse KL) or "sampled" (the report's Eq. 2): see above
    seed: int = 0

    def __post_init__(self) -> None:
        if self.kl not in ("sampled", "full"):
            raise ValueError(f"kl must be 'sampled' or 'full', not {self.kl!r}")


@dataclass(frozen=True)
class Prompt:
    ids: list[int]
    domain: str = "default"


@dataclass
class Teacher:
    """`model` None: the student itself with its adapters off (the student's base)."""

    model: object | None = None

    @classmethod
    def base(cls) -> Teacher:
        return cls(None)

    @classmethod
    def checkpoint(cls, model) -> Teacher:
        model.eval()
        for p in model.parameters():
            p.requires_grad_(False)
        return cls(model)


@contextlib.contextmanager
def adapters_off(model):
    """The model without its LoRA deltas for the duration (peft's per-layer adapter switch, which peft's
    `disable_adapter()` context flips on a PeftModel; our adapters are injected, so the layers are switched)."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    layers = [m for m in model.modules() if isinstance(m, BaseTunerLayer)]
    if not layers:
        raise ValueError("teacher 'base' needs a student with a LoRA adapter (there is none to switch off)")
    for m in layers:
        m.enable_adapters(False)
    try:
        yield model
    finally:
        for m in layers:
            m.enable_adapters(True)
            # enable_adapters(True) marks the active adapters trainable again; only LoRA factors were.
        for n, p in model.named_parameters():
            p.requires_grad_("lora_" in n)


@torch.no_grad()
def sample_batch(model, prompts: list[list[int]], max_new: int, temperature: float, gen, stop=(),
                 dist=None) -> list[list[int]]:  # fmt: skip
    """Completions of `prompts`, those of one length sampled together (no padding, so each row's logits are its
    own), decoded over a KV cache: the prompt's prefill once, then one token per forward. Sampling without a
    cache recomputed the whole prefix per token (256 forwards of a ~900-token proof prompt); the cached logits
    equal the recomputed ones to fp32 rounding (a test checks greedy choices agree), and the trained log-probs
    are recomputed by the scoring pass anyway. A row that stopped is no longer extended.

    `gen`: one generator for the batch, or one per prompt (each row then draws from its own, so what it samples
    does not depend on what it was batched with: a torchrun rank samples its prompts as one process would).
    `dist` (the model sharded by finetune/distributed.py): every rank runs as many forwards as the others, FSDP
    gathering each layer in its forward: as many length groups (a rank with fewer runs a one-token dummy) and
    decode steps while a row is live on any rank."""
    from model.kv_cache import KVCache

    out: list[list[int]] = [[] for _ in prompts]
    groups: dict[int, list[int]] = {}
    for i, p in enumerate(prompts):
        groups.setdefault(len(p), []).append(i)
    order = list(groups.values())
    n_groups = len(order) if dist is None else dist.max_int(len(order))
    was = model.training
    model.eval()
    try:
        for g in range(n_groups):
            rows = order[g] if g < len(order) else []
            cache = KVCache.for_config(model.config)
            ids_BT = torch.tensor([prompts[i] for i in rows] or [[0]])
            logits_BV = _last_logits(model, dist, ids_BT, cache, logits_to_keep=1)
            live = torch.tensor([True] * len(rows) or [False])
            for n in range(max_new):
                tok_B = _pick(logits_BV, temperature, gen, rows)
                for r, i in enumerate(rows):
                    if live[r]:
                        out[i].append(int(tok_B[r]))
                        live[r] = int(tok_B[r]) not in stop
                if n == max_new - 1 or not (live.any() if dist is None else dist.any(bool(live.any()))):
                    break
                logits_BV = _last_logits(model, dist, tok_B[:, None], cache)
    finally:
        model.train(was)
    return out


def _last_logits(model, dist, ids_BT: torch.Tensor, cache, **kw) -> torch.Tensor:
    run = lambda ids: model(ids, cache=cache, **kw)[:, -1].float()  # noqa: E731
    return run(ids_BT) if dist is None else dist.call(run, ids_BT, model)


def _pick(logits_BV: torch.Tensor, temperature: float, gen, rows: list[int]) -> torch.Tensor:
    if temperature <= 0 or not rows:
        return logits_BV.argmax(-1)
    probs_BV = torch.softmax(logits_BV / temperature, -1)
    if isinstance(gen, list):
        return torch.cat([torch.multinomial(probs_BV[r], 1, generator=gen[i]) for r, i in enumerate(rows)])
    return torch.multinomial(probs_BV, 1, generator=gen)[:, 0]


def completion_logprobs(model, prompt: list[int], completion: list[int], temperature: float = 1.0,
                        dist=None) -> torch.Tensor:  # fmt: skip
    """Log-softmax rows [N, V] of the positions that predict `completion`'s N tokens (`dist`: through the FSDP
    root of `model`, a collective)."""

    def run(ids_BT: torch.Tensor) -> torch.Tensor:
        logits = model(ids_BT)[0, len(prompt) - 1 : len(prompt) - 1 + len(completion)]
        return torch.log_softmax(logits.float() / (temperature if temperature > 0 else 1.0), -1)

    ids_BT = torch.tensor([prompt + completion])
    return run(ids_BT) if dist is None else dist.call(run, ids_BT, model)


def distill_loss(student_lp: torch.Tensor, teacher_lp: torch.Tensor, tokens: torch.Tensor, kl: str) -> torch.Tensor:
    """Per-token reverse KL loss, summed over tokens. student_lp / teacher_lp [N, V] log-probs, tokens [N].
    sampled: -sg[lp_t(y) - lp_s(y)] * lp_s(y) (Eq. 2's advantage in the on-policy policy gradient);
    full: sum_v p_s(v) (lp_s(v) - lp_t(v))."""
    teacher_lp = teacher_lp.detach()
    if kl == "full":
        return (student_lp.exp() * (student_lp - teacher_lp)).sum()
    s = student_lp.gather(-1, tokens[:, None])[:, 0]
    t = teacher_lp.gather(-1, tokens[:, None])[:, 0]
    return -((t - s).detach() * s).sum()


def teacher_logprobs(student, teacher: Teacher, prompt, completion, temperature, dist=None) -> torch.Tensor:
    with torch.no_grad():
        if teacher.model is None:
            with adapters_off(student):
                return completion_logprobs(student, prompt, completion, temperature, dist)
        return completion_logprobs(teacher.model, prompt, completion, temperature, dist)


def _scored(student, teachers: dict, cfg: DistillConfig, n: int, dist, domain: str | None = None):
    """The loss of one (prompt, completion): its teacher's log-probs, the student's, the KL loss over `n`, the
    step's sampled tokens on every rank; None (a rank with fewer completions of `domain` than another): a
    one-token dummy through the same models' forwards (`domain`'s teacher, the student), loss 0."""

    def one(item) -> LossTerms:
        p, c = item if item is not None else (Prompt([0], domain), [0])
        t_lp = teacher_logprobs(student, teachers[p.domain], p.ids, c, cfg.temperature, dist)
        s_lp = completion_logprobs(student, p.ids, c, cfg.temperature, dist)
        if item is None:
            return LossTerms(s_lp.sum() * 0.0, 0.0, tokens=0)
        tok = torch.tensor(c)
        loss = distill_loss(s_lp, t_lp, tok, cfg.kl) / n
        kl = float((s_lp.detach().gather(-1, tok[:, None]) - t_lp.gather(-1, tok[:, None])).sum())
        return LossTerms(loss, kl / n, tokens=len(p.ids) + len(c))

    return one


def train_distill(
    student,
    prompts: list[Prompt],
    teachers: dict[str, Teacher],
    cfg: DistillConfig = DistillConfig(),
    stop: tuple[int, ...] = (),
    resume: dict | None = None,
    save: Callable[[dict], None] | None = None,
    save_every: int = 0,
    on_step=None,
    named: list[tuple[str, torch.Tensor]] | None = None,
    dist=None,
) -> list[LossTerms]:
    """`cfg.optim.steps` steps of on-policy distillation over `prompts`, `cfg.prompts_per_step` a step, each scored by
    its domain's teacher (a domain without one is an error before anything runs). Sampling is seeded by
    (seed, step, prompt), so a resumed run samples what the interrupted one would have. `dist` (under torchrun, the
    student sharded by finetune/distributed.py, a checkpoint teacher too): each rank samples and scores its
    share of the step's prompts; the gradient is one process's (summed, over the step's sampled tokens)."""
    missing = sorted({p.domain for p in prompts} - set(teachers))
    if missing:
        raise ValueError(f"no teacher for domain(s) {missing}: give a --teacher for each (known: {sorted(teachers)})")
    named = named if named is not None else [(n, p) for n, p in student.named_parameters() if p.requires_grad]
    if not any(p.requires_grad for _, p in named):
        raise ValueError("nothing to train: add_lora first")

    def batches():
        order = list(range(len(prompts)))
        for step in range(cfg.optim.steps):
            rng = random.Random(cfg.seed * 1_000_003 + step)
            yield step, [prompts[i] for i in rng.sample(order, min(cfg.prompts_per_step, len(order)))]

    def loss_fn(batch) -> LossTerms:
        step, chosen = batch
        # one generator per prompt of the step: a torchrun rank samples its share as one process would
        gens = [torch.Generator().manual_seed((cfg.seed * 1_000_003 + step) * 1_009 + k) for k in range(len(chosen))]
        start, stop_ = (0, len(chosen)) if dist is None else dist.rows(len(chosen))
        mine = chosen[start:stop_]
        comps = sample_batch(student, [p.ids for p in mine], cfg.max_new_tokens, cfg.temperature, gens[start:stop_],
                             stop, dist)  # fmt: skip
        n_local = sum(len(c) for c in comps)
        n = max(1, n_local if dist is None else round(dist.sum(n_local)))
        items = [(p, c) for p, c in zip(mine, comps, strict=True) if c]
        # backpropagated per prompt (one prompt's activations at a time); the loop sees a detached loss
        if dist is not None:  # teacher by teacher: every rank's forwards gather the same model's layers
            return dist.lockstep([([x for x in items if x[0].domain == d], _scored(student, teachers, cfg, n, dist, d))
                                  for d in sorted(teachers)])  # fmt: skip
        one = _scored(student, teachers, cfg, n, dist)
        if not items:
            return LossTerms(torch.zeros(()), 0.0, tokens=0)
        out = backward_each(items, one)
        return LossTerms(out.loss, out.lm, tokens=out.tokens)

    return train(
        student, named, batches(), loss_fn, cfg.optim, resume=resume, save=save, save_every=save_every, on_step=on_step
    )
