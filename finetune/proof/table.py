"""The proof's results, derived from the run folder only: the stage table (markdown + JSON) and the plots.

One row per measured stage, as the GLM-5 report's stage-by-stage tables: held-out resolved rate with its Wilson
95% interval, pass@1 and pass@k, mean turns per trial, tokens per trial, MTP acceptance of the server, and the
paired difference from the stage before (`glm5 bench compare`). Plots need matplotlib (an optional dependency):
without it the table says so and nothing else changes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from finetune.proof.commands import previous
from finetune.proof.config import STAGES, ProofConfig, rl_curve_steps

ROW_KEYS = ("resolved", "graded", "resolved_rate", "resolved_rate_ci95", "complete")  # of a curve's point


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def stage_row(run: Path, stage: str) -> dict[str, Any] | None:
    """The measured numbers of one stage, or None when its bench has no report yet."""
    bench = run / "bench" / stage
    report = _read_json(bench / "report.json")
    if report is None:
        return None
    s, k = report["summary"], report["k"]
    steps = []
    results = bench / "results.jsonl"
    if results.is_file():
        for line in results.read_text(encoding="utf-8").splitlines():
            if line.strip():
                steps.append(int(json.loads(line).get("steps") or 0))
    serve = _read_json(run / "bench" / f"{stage}.serve.json") or {}
    diff = _read_json(run / "bench" / f"compare-{stage}.json")
    return {
        "stage": stage,
        "complete": report.get("complete", False),
        "tasks": s["tasks"],
        "k": k,
        "trials": s["trials"],
        "resolved": s["resolved"],
        "graded": s["graded"],
        "resolved_rate": s["resolved_rate"],
        "resolved_rate_ci95": s["resolved_rate_ci95"],
        "pass@1": s["pass@1"],
        f"pass@{k}": s.get(f"pass@{k}"),
        "mean_turns": sum(steps) / len(steps) if steps else None,
        "tokens_per_trial": s.get("tokens_per_trial"),
        "mtp_accept_rate": serve.get("spec_accept_rate"),
        "vs_previous": (diff or {}).get("difference"),
    }


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def markdown(rows: list[dict[str, Any]], note: str = "") -> str:
    k = rows[0]["k"] if rows else 1
    pass_k = f" pass@{k} |" if k > 1 else ""
    out = [f"| stage | held-out resolved (95% CI) | pass@1 |{pass_k} mean turns | tokens / trial | MTP accept | "
           "vs previous stage (paired, 95% CI) |", "|---|---|---|" + "---|" * (k > 1) + "---|---|---|---|"]  # fmt: skip
    for r in rows:
        ci = r["resolved_rate_ci95"]
        res = f"{r['resolved']}/{r['graded']} = {_pct(r['resolved_rate'])}" + (
            f" ({_pct(ci[0])}-{_pct(ci[1])})" if ci else ""
        )
        d = r.get("vs_previous") or {}
        if d.get("mean_difference") is None:
            vs = "-"
        else:
            dci = d.get("ci95")
            vs = f"{100 * d['mean_difference']:+.1f} pts" + (
                f" ({100 * dci[0]:+.1f} to {100 * dci[1]:+.1f})" if dci else ""
            )
        turns = "n/a" if r["mean_turns"] is None else f"{r['mean_turns']:.2f}"
        tokens = "n/a" if r["tokens_per_trial"] is None else f"{r['tokens_per_trial']:.0f}"
        at_k = f" {_pct(r.get(f'pass@{k}'))} |" if k > 1 else ""
        out.append(f"| {r['stage']}{'' if r['complete'] else ' (incomplete)'} | {res} | {_pct(r['pass@1'])} |{at_k} "
                   f"{turns} | {tokens} | {_pct(r['mtp_accept_rate'])} | {vs} |")  # fmt: skip
    if note:
        out += ["", note]
    return "\n".join(out) + "\n"


def rl_curve(run: Path, name: str = "rl") -> list[dict[str, Any]]:
    path = run / "models" / name / "rl_log.jsonl"
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def dev_curve(rows: list[dict[str, Any]]) -> list[tuple[int, float]]:
    """(step, solved rate) of RL's in-run evaluations (`--eval-tasks`: the proof's dev split), step 0 first."""
    out = []
    before = rows[0].get("eval_before", {}).get("eval_solved_rate") if rows else None
    if before is not None:
        out.append((0, before))
    return out + [(r["step"], r["eval_solved_rate"]) for r in rows if r.get("eval_solved_rate") is not None]


def same_as_last(run: Path, name: str) -> Path:
    """The mark that RL step adapter `name` (rl-step-K) holds the same weights as RL's last step."""
    return run / "bench" / f"{name}.same.json"


def heldout_curve(run: Path, c: ProofConfig | None) -> list[dict[str, Any]]:
    """RL's learning curve measured by `glm5 bench` on held-out: step 0 is the stage RL started from, then each
    benched step adapter (RUN/bench/rl-step-K), then RL's own measurement at its last step. Points not measured
    yet are left out."""
    if c is None or "rl" not in c.stages:
        return []
    points = [(0, previous("rl", c.stages)), *((k, f"rl-step-{k}") for k in rl_curve_steps(c)), (c.rl_steps, "rl")]
    out = []
    for step, name in points:
        same = same_as_last(run, name).is_file()  # the last step's weights: RL's own measurement
        row = stage_row(run, "rl" if same else name)  # None until that point's bench has a report (`init` never)
        if row is not None:
            out.append({"step": step, "measured": "rl" if same else name, **{k: row[k] for k in ROW_KEYS},
                        **({"same_weights_as_step": c.rl_steps} if same else {})})  # fmt: skip
    return out


def plots(run: Path, rows: list[dict[str, Any]], heldout: list[dict[str, Any]] | None = None) -> list[Path] | str:
    """Write RUN/plots/*.png; the paths, or a note when matplotlib is not installed."""
    try:  # matplotlib is the optional `proof` extra: imported here, where plots are drawn
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "plots skipped: matplotlib is not installed (pip install matplotlib)"
    out_dir = run / "plots"
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    if rows:
        fig, ax = plt.subplots(figsize=(5, 3.2))
        rates = [100 * (r["resolved_rate"] or 0) for r in rows]
        ci = [r["resolved_rate_ci95"] or [r["resolved_rate"] or 0] * 2 for r in rows]
        lo = [max(0.0, 100 * ((r["resolved_rate"] or 0) - c[0])) for r, c in zip(rows, ci, strict=True)]
        hi = [max(0.0, 100 * (c[1] - (r["resolved_rate"] or 0))) for r, c in zip(rows, ci, strict=True)]
        ax.bar([r["stage"] for r in rows], rates, yerr=[lo, hi], capsize=4, color="#4c78a8")
        ax.set_ylabel("held-out resolved, % (95% CI)")
        ax.set_ylim(0, 100)
        ax.set_title("glm5 proof: solve rate by stage")
        fig.tight_layout()
        written.append(out_dir / "stages.png")
        fig.savefig(written[-1], dpi=120)
        plt.close(fig)
    curves = {name: rl_curve(run, name) for name in ("rl", "rl-sync")}
    curves = {k: v for k, v in curves.items() if v}
    if curves:
        fig, axes = plt.subplots(1, 3, figsize=(12, 3.2))
        for name, rows_ in curves.items():
            steps = [r["step"] for r in rows_]
            # with dynamic sampling, what each step drew (its no-signal groups included), not only what it kept
            axes[0].plot(steps, [r.get("drawn_reward_mean", r.get("reward_mean")) for r in rows_], marker="o",
                         label=name)  # fmt: skip
            axes[1].plot(steps, [r.get("drawn_solved_rate", r.get("solved_rate")) for r in rows_], marker="o",
                         label=name)  # fmt: skip
            dev = dev_curve(rows_)
            if dev:
                axes[2].plot([k for k, _ in dev], [v for _, v in dev], marker="o", label=name)
        axes[0].set_title("RL: mean reward per step (train)")
        axes[1].set_title("RL: solved rate per step (train)")
        axes[2].set_title("RL: solved rate on dev tasks")
        for i, ax in enumerate(axes):
            ax.set_ylim(-0.05, 1.05)  # rewards and rates are in [0, 1]: a flat curve stays readable
            # a train point is the tasks that step drew (others each step), not a trend; dev is one fixed set
            ax.set_xlabel("step (each draws other tasks)" if i < 2 else "step (the same dev tasks)")
            ax.legend()
        fig.tight_layout()
        written.append(out_dir / "rl_curves.png")
        fig.savefig(written[-1], dpi=120)
        plt.close(fig)
    if heldout:
        fig, ax = plt.subplots(figsize=(5, 3.2))
        rate = [100 * (p["resolved_rate"] or 0) for p in heldout]
        ci = [p["resolved_rate_ci95"] or [p["resolved_rate"] or 0] * 2 for p in heldout]
        lo = [max(0.0, r - 100 * c[0]) for r, c in zip(rate, ci, strict=True)]
        hi = [max(0.0, 100 * c[1] - r) for r, c in zip(rate, ci, strict=True)]
        ax.errorbar([p["step"] for p in heldout], rate, yerr=[lo, hi], marker="o", capsize=4, color="#4c78a8")
        ax.set_ylim(0, 100)
        ax.set_xlabel("RL step")
        ax.set_ylabel("held-out resolved, % (95% CI)")
        ax.set_title("glm5 proof: RL measured by glm5 bench (held-out)")
        fig.tight_layout()
        written.append(out_dir / "rl_heldout.png")
        fig.savefig(written[-1], dpi=120)
        plt.close(fig)
    return written


def write_table(run: Path, stages: tuple[str, ...] = STAGES, c: ProofConfig | None = None) -> dict[str, Any]:
    """RUN/table.json and RUN/table.md (+ plots) from what the run folder holds now; with the run's config `c`,
    RL's held-out curve (`heldout_curve`) too."""
    rows = [r for r in (stage_row(run, s) for s in stages) if r is not None]
    curve = heldout_curve(run, c)
    made = plots(run, rows, curve)
    note = made if isinstance(made, str) else "plots: " + ", ".join(str(p.relative_to(run)) for p in made)
    dev = {name: dev_curve(rl_curve(run, name)) for name in ("rl", "rl-sync")}
    dev = {k: v for k, v in dev.items() if v}
    if dev:
        shown = "; ".join(f"{name} " + ", ".join(f"step {k} {v:.0%}" for k, v in pts) for name, pts in dev.items())
        note = f"RL on dev tasks (its in-run evaluation, not the measurement): {shown}\n\n{note}"
    if len(curve) > 1:
        points = ", ".join(f"step {p['step']} {p['resolved']}/{p['graded']}"
                           + (f" (step {p['same_weights_as_step']}'s weights)" if "same_weights_as_step" in p else "")
                           for p in curve)  # fmt: skip
        note = f"RL on held-out through glm5 bench: {points}\n\n{note}"
    body = {
        "stages": rows,
        "rl_heldout_curve": curve,
        "rl_dev_curve": {k: [list(p) for p in v] for k, v in dev.items()},
        "plots": [] if isinstance(made, str) else [str(p) for p in made],
        "note": note,
    }
    (run / "table.json").write_text(json.dumps(body, indent=1) + "\n", encoding="utf-8")
    (run / "table.md").write_text(markdown(rows, note), encoding="utf-8")
    return body
