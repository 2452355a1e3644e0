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
# two-sided 95% Student t quantiles for small samples (df 1..30); beyond 30 the normal value is close enough
T95 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
       2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)  # fmt: skip


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
    """B minus A in per-task resolved fraction over the tasks both graded: mean, 95% t interval, flips."""
    common = sorted(t for t in a if t in b and a[t]["n"] and b[t]["n"])
    d = [b[t]["c"] / b[t]["n"] - a[t]["c"] / a[t]["n"] for t in common]
    m = len(d)
    out: dict[str, Any] = {"tasks_compared": m, "mean_difference": sum(d) / m if m else None, "ci95": None}
    if m >= 2:
        mean = sum(d) / m
        sd = math.sqrt(sum((x - mean) ** 2 for x in d) / (m - 1))
        q = T95[m - 2] if m - 1 <= len(T95) else Z95
        out["ci95"] = [mean - q * sd / math.sqrt(m), mean + q * sd / math.sqrt(m)]
    out["gained"] = [t for t in common if a[t]["c"] == 0 and b[t]["c"] > 0]  # A never, B at least once
    out["lost"] = [t for t in common if a[t]["c"] > 0 and b[t]["c"] == 0]
    out["only_in_a"] = sorted(t for t in a if t not in b)
    out["only_in_b"] = sorted(t for t in b if t not in a)
    return out
