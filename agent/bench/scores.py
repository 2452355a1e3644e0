"""Scores from trial results: resolved rate with a 95% Wilson interval, pass@k (the unbiased estimator), pass^k,
mean reward, tokens, cost and time; and the paired difference between two runs.

Infra errors are not trials the agent failed: they are left out of every score and counted beside it.
pass@k = mean over tasks of 1 - C(n-c, k)/C(n, k) (Chen et al. 2021; inspect's pass_at_k, Harbor's pass@k), over
the tasks with at least k graded attempts; pass^k = mean of C(c, k)/C(n, k) (all k succeed: τ-bench's reliability).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

Z95 = 1.959963984540054


def wilson(successes: int, n: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval for a binomial proportion (sound at 0, 1 and small n, unlike p ± z·se)."""
    if n == 0:
        return (0.0, 1.0)
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return (max(0.0, centre - half), min(1.0, centre + half))


def pass_at_k(n: int, c: int, k: int) -> float:
    """P(at least one of k attempts drawn from n resolves), c of the n having resolved."""
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def pass_hat_k(n: int, c: int, k: int) -> float:
    """P(all k attempts drawn from n resolve)."""
    return math.comb(c, k) / math.comb(n, k) if n >= k else 0.0


def per_task(results: Iterable[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """instance_id -> {n (graded attempts), c (resolved), infra, rewards, attempts: [results by attempt]}."""
    out: dict[str, dict[str, Any]] = defaultdict(lambda: {"n": 0, "c": 0, "infra": 0, "rewards": [], "attempts": []})
    for r in results:
        t = out[r["instance_id"]]
        t["attempts"].append(r)
        if r["status"] == "infra_error":
            t["infra"] += 1
        else:
            t["n"] += 1
            t["c"] += 1 if r["resolved"] else 0
            t["rewards"].append(float(r.get("reward") or 0.0))
    for t in out.values():
        t["attempts"].sort(key=lambda r: r["attempt"])
    return dict(out)


def summarize(results: list[dict[str, Any]], k: int, n_tasks: int | None = None) -> dict[str, Any]:
    tasks = per_task(results)
    graded = [r for r in results if r["status"] != "infra_error"]
    resolved = sum(1 for r in graded if r["resolved"])
    lo, hi = wilson(resolved, len(graded))
    with_k = [t for t in tasks.values() if t["n"] >= k]
    with_1 = [t for t in tasks.values() if t["n"] >= 1]
    rewards = [x for t in tasks.values() for x in t["rewards"]]
    n = len(results)
    return {
        "tasks": n_tasks if n_tasks is not None else len(tasks),
        "tasks_with_results": len(tasks),
        "trials": n,
        "graded": len(graded),
        "resolved": resolved,
        "unresolved": len(graded) - resolved,
        "infra_errors": n - len(graded),
        "resolved_rate": resolved / len(graded) if graded else None,
        "resolved_rate_ci95": [lo, hi] if graded else None,
        "pass@1": sum(t["c"] / t["n"] for t in with_1) / len(with_1) if with_1 else None,
        f"pass@{k}": sum(pass_at_k(t["n"], t["c"], k) for t in with_k) / len(with_k) if with_k else None,
        f"pass^{k}": sum(pass_hat_k(t["n"], t["c"], k) for t in with_k) / len(with_k) if with_k else None,
        "mean_reward": sum(rewards) / len(rewards) if rewards else None,
        "flaky_trials": sum(1 for r in graded if r.get("flaky_tests")),
        # resolved trials whose prediction changed test configuration (conftest.py, ...): worth a look
        "resolved_with_test_config_changed": sum(
            1 for r in graded if r.get("resolved") and r.get("test_config_changed")
        ),
        "prompt_tokens": sum(int(r.get("prompt_tokens") or 0) for r in results),
        "completion_tokens": sum(int(r.get("completion_tokens") or 0) for r in results),
        "cost_usd": round(sum(float(r.get("cost_usd") or 0.0) for r in results), 6),
        "seconds_total": round(sum(float(r.get("seconds") or 0.0) for r in results), 3),
        "seconds_per_trial": round(sum(float(r.get("seconds") or 0.0) for r in results) / n, 3) if n else None,
        "tokens_per_trial": (
            sum(int(r.get("prompt_tokens") or 0) + int(r.get("completion_tokens") or 0) for r in results) / n
        )
        if n
        else None,  # fmt: skip
    }


def paired_difference(a: dict[str, dict], b: dict[str, dict]) -> dict[str, Any]:
    """B minus A in per-task resolved fraction over the tasks both graded: mean, 95% interval (Newcombe's, below),
    flips."""
    common = sorted(t for t in a if t in b and a[t]["n"] and b[t]["n"])
    pa = [a[t]["c"] / a[t]["n"] for t in common]
    pb = [b[t]["c"] / b[t]["n"] for t in common]
    m = len(common)
    mean = (sum(pb) - sum(pa)) / m if m else None
    out: dict[str, Any] = {"tasks_compared": m, "mean_difference": mean, "ci95": newcombe_paired(pa, pb)}
    out["gained"] = [t for t in common if a[t]["c"] == 0 and b[t]["c"] > 0]  # A never, B at least once
    out["lost"] = [t for t in common if a[t]["c"] > 0 and b[t]["c"] == 0]
    out["only_in_a"] = sorted(t for t in a if t not in b)
    out["only_in_b"] = sorted(t for t in b if t not in a)
    return out


def newcombe_paired(pa: list[float], pb: list[float], z: float = Z95) -> list[float] | None:
    """95% interval of mean(pb) - mean(pa) over paired tasks: Newcombe's method 10 (Stat. Med. 1998, 17:2635),
    each run's rate by its Wilson interval, joined through the pairs' correlation. Unlike mean ± t·sd it is honest
    when every pair differs alike: 15 tasks all gained give 0.71 to 1.00, not +1 to +1. Per-task fractions (k > 1
    attempts) enter as they are. None for fewer than 2 tasks."""
    m = len(pa)
    if m < 2:
        return None
    ma, mb = sum(pa) / m, sum(pb) / m
    la, ua = wilson(sum(pa), m, z)
    lb, ub = wilson(sum(pb), m, z)
    va = sum((x - ma) ** 2 for x in pa)
    vb = sum((y - mb) ** 2 for y in pb)
    cov = sum((x - ma) * (y - mb) for x, y in zip(pa, pb, strict=True))
    phi = cov / math.sqrt(va * vb) if va > 0 and vb > 0 else 0.0
    d = mb - ma
    lo = d - math.sqrt(max(0.0, (mb - lb) ** 2 - 2 * phi * (mb - lb) * (ua - ma) + (ua - ma) ** 2))
    hi = d + math.sqrt(max(0.0, (ub - mb) ** 2 - 2 * phi * (ub - mb) * (ma - la) + (ma - la) ** 2))
    return [max(-1.0, lo), min(1.0, hi)]
