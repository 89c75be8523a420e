"""RunStats → the SPEC §7 figures, named as in the spec (the fields of summary.json).

All rates are ratios of pooled counters (`specjax.metrics`). Per-drafter acceptance comes
in two forms: `acceptance` (SPEC §7: accepted / proposed drafts, in the run's own shared
block) and `per_token_acceptance` (each drafter's chain tested alone against p: accepted /
reached positions — the per-drafter dashboard figure and Leviathan's α).
"""
from __future__ import annotations

import math

import numpy as np

from specjax import metrics
from specjax.policy.plan import RunStats


def _f(x) -> float:
    x = float(np.asarray(x))
    return x if math.isfinite(x) else float("nan")


THRESHOLDS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)


def summarize(stats: RunStats, names, *, single: dict[str, RunStats] | None = None,
              autoregressive: RunStats | None = None) -> dict:
    """The figures of one run; ratios to the baselines when they are given.

    Joint acceptance is pooled over rounds in which ≥ 2 drafters extended one committed
    prefix (`joint_acceptance_basis = 'shared_blocks'`); when a policy never shares a block
    (every branch has one drafter) it is pooled over all rounds and the basis says
    'single_drafter_branches'.
    """
    k = len(names)
    own_acc = stats.own_accepted_at.sum(1)
    own_reach = stats.own_reached_at.sum(1)
    if stats.multi_reached:
        joint = stats.multi_from_draft / stats.multi_reached
        basis = "shared_blocks"
    else:
        joint = stats.from_draft / stats.reached if stats.reached else float("nan")
        basis = "single_drafter_branches"
    out = {
        "acceptance": {n: _f(metrics.acceptance(stats.accepted[i], stats.proposed[i]))
                       for i, n in enumerate(names) if stats.proposed[i]},
        "per_token_acceptance": {n: _f(metrics.acceptance(own_acc[i], own_reach[i]))
                                 for i, n in enumerate(names) if own_reach[i]},
        "per_position_acceptance": {
            n: [_f(x) for x in np.asarray(metrics.per_position_acceptance(
                stats.own_accepted_at[i], stats.own_reached_at[i],
                max(stats.proposed[i] // max(stats.gamma, 1), 1))[0])]
            for i, n in enumerate(names) if stats.proposed[i]},
        "joint_acceptance": _f(joint),
        "joint_acceptance_basis": basis,
        "rejection_attribution": {n: int(stats.rejected[i]) for i, n in enumerate(names)},
        "mean_accepted_length": _f(stats.tokens / stats.verifier_calls)
        if stats.verifier_calls else float("nan"),
        "mean_truncation_depth": _f(metrics.mean_truncation_depth(stats.discarded,
                                                                  stats.truncations)),
        "consensus_fallback_rate": _f(stats.fallbacks / stats.steps) if stats.steps else 0.0,
        "kl_max": _f(max(stats.kl_max)) if stats.kl_max else float("nan"),
        "kl_mean": _f(np.mean(stats.kl_mean)) if stats.kl_mean else float("nan"),
        "collapses": stats.collapses.counts() if hasattr(stats.collapses, "counts") else {},
        "boundary_independent_batches": sum(not d.decision for b in stats.decisions for d in b),
        "boundary_evaluations": sum(len(b) for b in stats.decisions),
        "committed_tokens": int(stats.tokens),
        "verifier_calls": int(stats.verifier_calls),
        "drafter_tokens": {n: int(stats.drafter_tokens[i]) for i, n in enumerate(names)},
        "modelled_cost": _f(stats.cost),
        "seconds": _f(stats.seconds),
        "throughput_cost": _f(stats.tokens / stats.cost) if stats.cost else float("nan"),
        "tokens_per_second": _f(stats.tokens / stats.seconds) if stats.seconds else float("nan"),
        "plan_steps": int(stats.steps),
        "fallback_steps": int(stats.fallbacks),
        # The vote's plurality support per step: its mean, and the fallback rate the same
        # steps would have had at other thresholds (exact where the committed text does not
        # depend on the vote: τ = 0 or the coupled rule; otherwise a first-order what-if).
        "consensus_support_mean": _f(np.mean(stats.supports)) if stats.supports else float("nan"),
        "fallback_rate_by_threshold": {
            f"{t:.1f}": _f(np.mean(np.asarray(stats.supports) < t)) for t in THRESHOLDS}
        if stats.supports else {},
    }
    shared = out["joint_acceptance"]
    out["shared_prefix_acceptance"] = shared
    indep = own_acc.sum() / own_reach.sum() if own_reach.sum() else float("nan")
    out["independent_branch_acceptance"] = _f(indep)
    if single:
        best = max(single, key=lambda n: single[n].tokens / single[n].cost)
        b = single[best]
        out["single_baseline_drafter"] = best
        out["throughput_ratio_vs_single"] = _f(out["throughput_cost"] / (b.tokens / b.cost))
        out["wallclock_ratio_vs_single"] = _f(out["tokens_per_second"] / (b.tokens / b.seconds))
    if autoregressive is not None:
        a = autoregressive
        out["throughput_ratio_vs_autoregressive"] = _f(out["throughput_cost"] / (a.tokens / a.cost))
        out["wallclock_ratio_vs_autoregressive"] = _f(out["tokens_per_second"]
                                                      / (a.tokens / a.seconds))
    return out


def leviathan(alpha: float, gamma: int, c: float) -> dict:
    """Leviathan's expected tokens per call and speedup for α, γ, c (SPEC §7 'theory')."""
    return {"expected_tokens_per_call": _f(metrics.leviathan_expected_tokens(alpha, gamma)),
            "speedup": _f(metrics.leviathan_speedup(alpha, gamma, c))}
