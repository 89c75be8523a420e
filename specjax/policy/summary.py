"""RunStats → the SPEC §7 figures of one run, named as in the spec (the result row's fields).

Every figure is a `specjax.metrics` definition applied to pooled counters (ratios of sums
over plans), and every price comes from `metrics.itemised_cost`. Per-plan counts are kept
in the row (``per_plan``) so that the seed table can bootstrap intervals over plans.

Two acceptances per drafter, never mixed up:
  * ``per_drafter_alpha`` — the seed's and Leviathan's α: the drafter's chain tested alone
    against p with the rejection rule (fresh uniforms), per position; under every rule;
  * ``coupled_match_rate`` — under the coupled rule only: how often the drafter's Gumbel-max
    token equals the verifier's (≤ Σ min(p, q)); a different, smaller figure.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from specjax import metrics
from specjax.policy import boundary as boundary_lib
from specjax.policy.counters import RunStats

#: Threshold grids of the step-decision explanation (each moved alone, the others at the
#: run's values).
FLOOR_GRID = (0.0, 0.15, 0.3, 0.45, 0.6)
DEPTH_GRID = (1.5, 2.0, 2.5, 3.0, 4.0, 1e9)
OVERHEAD_GRID = (-1.0, -0.05, 0.0, 0.05, 0.15)
QUORUM_GRID = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
#: Per-plan counters kept in a row for the bootstrap.
PLAN_FIELDS = (
    "tokens",
    "seconds",
    "steps",
    "fallbacks",
    "verifier_calls",
    "multi_from_draft",
    "multi_reached",
)


def _f(x) -> float:
    x = float(np.asarray(x))
    return x if math.isfinite(x) else float("nan")


def plan_totals(
    counts: Mapping[str, np.ndarray],
    costs: Sequence[float],
    seed_costs: Sequence[float] | None,
    consensus_cost: float,
) -> dict:
    """Per-plan counts a bootstrap needs: the PLAN_FIELDS, each drafter's own-test counts,
    the cost totals at the zoo's c_i and (if given) the seed's, and the priced counts
    (``n:<item>`` for each of `metrics.COST_ITEMS`)."""
    out = {f: np.asarray(counts[f]).tolist() for f in PLAN_FIELDS}
    out["own_accepted"] = np.asarray(counts["own_accepted_at"]).sum(-1).tolist()
    out["own_reached"] = np.asarray(counts["own_reached_at"]).sum(-1).tolist()
    out["cost"] = metrics.itemised_cost(counts, costs, consensus_cost)["total"].tolist()
    # The priced counts themselves, per plan (``n:<item>``, drafter items [P, K]): a run
    # can be priced afresh at other c_i (another machine's, a TPU plan's) from its rows
    # (`specjax.runner.seed_reprice.reprice`).
    for item in metrics.COST_ITEMS:
        if item in counts:
            out[f"n:{item}"] = np.asarray(counts[item]).tolist()
    if seed_costs is not None:
        out["cost_seed"] = metrics.itemised_cost(counts, seed_costs, consensus_cost)[
            "total"
        ].tolist()
    return out


def _quantiles(x) -> dict:
    x = np.asarray([v for v in x if isinstance(v, (int, float)) and math.isfinite(v)])
    if not len(x):
        return {}
    return {
        "mean": _f(x.mean()),
        "p10": _f(np.quantile(x, 0.1)),
        "p50": _f(np.quantile(x, 0.5)),
        "p90": _f(np.quantile(x, 0.9)),
        "positive_over_overhead": _f(np.mean(x > 0)),
    }


def step_decision_figures(stats: RunStats, thresholds: boundary_lib.BoundaryThresholds) -> dict:
    """The step decision explained (SPEC §7): shares of True / False / collapses, the gain
    s_b − i_b, and the fallback rate as each threshold moves, replayed from the records."""
    recs = stats.branch_records
    if not recs:
        return {}
    base = boundary_lib.replay_step_decisions(recs, thresholds)
    n = max(base["branches"], 1)
    out = {
        "branch_decisions": {k: base[k] / n for k in ("true", "false") + boundary_lib.REASONS},
        "gain": _quantiles(
            [
                r["s"] - r["i"]
                for r in recs
                if isinstance(r["s"], float) and isinstance(r["i"], float)
            ]
        ),
        "fallback_rate_seed": base["fallback_rate"],
    }
    kw = thresholds.kwargs()
    sweeps = {
        "acceptance_floor": FLOOR_GRID,
        "depth_ceiling": DEPTH_GRID,
        "truncation_overhead_ratio": OVERHEAD_GRID,
    }
    out["fallback_rate_by_threshold"] = {
        name: {
            str(v): boundary_lib.replay_step_decisions(
                recs, boundary_lib.BoundaryThresholds(**dict(kw, **{name: v}))
            )["fallback_rate"]
            for v in grid
        }
        for name, grid in sweeps.items()
    }
    steps = stats.step_records
    sup = [s["quorum_support"] for s in steps]
    out["fallback_rate_quorum_by_threshold"] = (
        {str(t): _f(np.mean(np.asarray(sup) < t)) for t in QUORUM_GRID} if sup else {}
    )
    return out


def summarize(
    stats: RunStats,
    names: Sequence[str],
    costs: Sequence[float],
    *,
    seed_costs: Sequence[float] | None = None,
    consensus_cost: float = 1.0,
    consensus: str = "seed",
    consensus_threshold: float = 0.5,
    thresholds: boundary_lib.BoundaryThresholds | None = None,
    single: Mapping[str, Mapping] | None = None,
    autoregressive: Mapping | None = None,
    prices: Mapping[str, float] | None = None,
) -> dict:
    """The figures of one run; ratios to the baselines when their plan totals are given.

    Args:
      stats: the run's counters.
      names / costs / seed_costs: the drafters, their c_i, and c_i at the seed's sizes.
      single / autoregressive: `plan_totals` of the single-drafter baselines (by name) and
        of the verifier alone, over the same plans.
      prices: machine prices (price key → seconds of one forward, `specjax.measure.prices`) of
        every key in `stats.priced`; when given, the row has ``predicted_seconds`` (Σ counts
        × prices, `metrics.itemised_seconds`), its items, ``predicted_over_wall`` (÷ the
        measured ``seconds``) and the per-plan predicted seconds.
    """
    thresholds = thresholds or boundary_lib.BoundaryThresholds()
    c = stats.counts
    own_acc = c["own_accepted_at"].sum((0, 2))
    own_reach = c["own_reached_at"].sum((0, 2))
    tokens = int(c["tokens"].sum())
    out = {
        **_drafter_figures(c, names, stats.gamma),
        **_acceptance_figures(stats, tokens),
        **_consensus_figures(stats, consensus),
        **_cost_figures(stats, costs, consensus_cost, tokens),
    }
    if seed_costs is not None:
        seed_total = float(metrics.itemised_cost(c, seed_costs, consensus_cost)["total"].sum())
        out["throughput_cost_seed"] = _f(tokens / seed_total) if seed_total else float("nan")
    out.update(step_decision_figures(stats, thresholds))
    if stats.step_records:
        sup = np.asarray([s["quorum_support"] for s in stats.step_records])
        out["fallback_rate_quorum"] = _f(np.mean(sup < consensus_threshold))
        out["consensus_support_mean"] = _f(sup.mean())
    out["independent_branch_acceptance"] = _f(metrics.acceptance(own_acc.sum(), own_reach.sum()))
    out["per_plan"] = plan_totals(c, costs, seed_costs, consensus_cost)
    out.update(predicted_figures(stats, prices))
    if "predicted_seconds" in out:
        out["per_plan"]["predicted_seconds"] = out.pop("_predicted_per_plan")
    out.update(_baseline_ratios(out, single, autoregressive, seed_costs is not None))
    return out


def _acceptance_figures(stats: RunStats, tokens: int) -> dict:
    """Joint acceptance, shared rounds, tokens per verifier call, truncation and pruning
    depths."""
    c = stats.counts
    multi = int(c["multi_rounds"].sum())
    return {
        # Joint acceptance only where a prefix was shared (≥ 2 drafters in a block).
        "joint_acceptance": (
            _f(
                metrics.joint_acceptance(
                    int(c["multi_from_draft"].sum()), int(c["multi_reached"].sum())
                )
            )
            if multi
            else None
        ),
        "shared_rounds": multi,
        "mean_accepted_length": _f(metrics.mean_accepted_length(tokens, stats.verifier_calls))
        if stats.verifier_calls
        else float("nan"),
        "mean_truncation_depth": _f(
            metrics.mean_truncation_depth(stats.discarded, stats.truncations)
        ),
        "pruned_depth": _f(metrics.mean_truncation_depth(stats.pruned_discarded, stats.pruned))
        if stats.pruned
        else None,
    }


def _consensus_figures(stats: RunStats, consensus: str) -> dict:
    """The step decision's fallbacks, the KL checks, the collapses and the boundary's
    evaluations."""
    return {
        "consensus_fallback_rate": _f(metrics.consensus_fallback_rate(stats.fallbacks, stats.steps))
        if stats.steps
        else 0.0,
        "consensus": consensus,
        "kl_max": _f(max(stats.kl_max)) if stats.kl_max else None,
        "kl_mean": _f(np.mean(stats.kl_mean)) if stats.kl_mean else None,
        "kl_outside_mass": _f(max(stats.kl_outside)) if stats.kl_outside else None,
        "collapses": stats.collapses.counts(),
        "boundary_independent_batches": sum(not d.decision for b in stats.decisions for d in b),
        "boundary_evaluations": sum(len(b) for b in stats.decisions),
    }


def _cost_figures(stats: RunStats, costs, consensus_cost: float, tokens: int) -> dict:
    """Committed tokens, verifier calls, the itemised modelled cost, seconds, the two
    throughputs and the plan steps."""
    c = stats.counts
    cost = metrics.itemised_cost(c, costs, consensus_cost)
    total = float(cost["total"].sum())
    seconds = float(c["seconds"].sum())
    return {
        "committed_tokens": tokens,
        "verifier_calls": int(stats.verifier_calls),
        "cost_items": {k: _f(v.sum()) for k, v in cost.items()},
        "modelled_cost": total,
        "seconds": seconds,
        "throughput_cost": _f(tokens / total) if total else float("nan"),
        "tokens_per_second": _f(tokens / seconds) if seconds else float("nan"),
        "plan_steps": int(stats.steps),
        "fallback_steps": int(stats.fallbacks),
    }


def predicted_figures(stats: RunStats, prices: Mapping[str, float] | None) -> dict:
    """Predicted seconds (Σ priced counts × machine prices) and predicted ÷ wall; {} without
    prices. The wall is the run's ``seconds`` counter: warm programs only
    (`specjax.engine.programs.run_program`), no compilation."""
    if prices is None:
        return {}
    pred = metrics.itemised_seconds(stats.priced, prices)
    total = float(np.sum(pred["total"]))
    seconds = float(stats.counts["seconds"].sum())
    return {
        "predicted_seconds": total,
        "predicted_seconds_items": {k: _f(np.sum(v)) for k, v in pred.items() if k != "total"},
        "predicted_over_wall": _f(total / seconds) if seconds else float("nan"),
        "priced_forwards": {k: _f(v.sum()) for k, v in sorted(stats.priced.items())},
        "_predicted_per_plan": np.broadcast_to(pred["total"], (stats.n_plans,)).tolist(),
    }


def _drafter_figures(c: Mapping[str, np.ndarray], names: Sequence[str], gamma: int) -> dict:
    """Each drafter's figures: Leviathan's α, the coupled match rate, accepted / proposed,
    α per position, rejections attributed to it and tokens it drafted."""
    own_acc, own_reach = c["own_accepted_at"].sum((0, 2)), c["own_reached_at"].sum((0, 2))
    match_acc, match_reach = c["match_at"].sum((0, 2)), c["match_reached_at"].sum((0, 2))
    proposed, accepted = c["proposed"].sum(0), c["accepted"].sum(0)
    return {
        "per_drafter_alpha": {
            n: _f(metrics.acceptance(own_acc[i], own_reach[i]))
            for i, n in enumerate(names)
            if own_reach[i]
        },
        "coupled_match_rate": {
            n: _f(metrics.acceptance(match_acc[i], match_reach[i]))
            for i, n in enumerate(names)
            if match_reach[i]
        },
        "acceptance": {
            n: _f(metrics.acceptance(accepted[i], proposed[i]))
            for i, n in enumerate(names)
            if proposed[i]
        },
        "per_position_acceptance": {
            n: [
                _f(x)
                for x in np.asarray(
                    metrics.per_position_acceptance(
                        c["own_accepted_at"].sum(0)[i],
                        c["own_reached_at"].sum(0)[i],
                        max(int(proposed[i]) // max(gamma, 1), 1),
                    )[0]
                )
            ]
            for i, n in enumerate(names)
            if proposed[i]
        },
        "rejection_attribution": {n: int(c["rejected"].sum(0)[i]) for i, n in enumerate(names)},
        "drafter_tokens": {n: int(c["drafter_tokens"].sum(0)[i]) for i, n in enumerate(names)},
    }


def _baseline_ratios(
    out: Mapping,
    single: Mapping[str, Mapping] | None,
    autoregressive: Mapping | None,
    at_seed_sizes: bool,
) -> dict:
    """The run's throughput over the best single drafter's (cost model, wall clock, and the
    cost model at the field report's sizes) and over the verifier alone's."""
    ratios = {}
    if single:

        def rate(t, key):
            return metrics.ratio_of_sums(t["tokens"], t[key])

        best = max(single, key=lambda n: rate(single[n], "cost"))
        b = single[best]
        ratios["single_baseline_drafter"] = best
        ratios["throughput_ratio_vs_single"] = _f(out["throughput_cost"] / rate(b, "cost"))
        ratios["wallclock_ratio_vs_single"] = _f(out["tokens_per_second"] / rate(b, "seconds"))
        if at_seed_sizes:
            best_s = max(single, key=lambda n: rate(single[n], "cost_seed"))
            ratios["throughput_ratio_vs_single_at_seed_sizes"] = _f(
                out["throughput_cost_seed"] / rate(single[best_s], "cost_seed")
            )
    if autoregressive is not None:
        a = autoregressive
        ratios["throughput_ratio_vs_autoregressive"] = _f(
            out["throughput_cost"] / metrics.ratio_of_sums(a["tokens"], a["cost"])
        )
        ratios["wallclock_ratio_vs_autoregressive"] = _f(
            out["tokens_per_second"] / metrics.ratio_of_sums(a["tokens"], a["seconds"])
        )
    return ratios


def leviathan(alpha: float, gamma: int, c: float) -> dict:
    """Leviathan's expected tokens per call and speedup for α, γ, c (SPEC §7 'theory')."""
    return {
        "expected_tokens_per_call": _f(metrics.leviathan_expected_tokens(alpha, gamma)),
        "speedup": _f(metrics.leviathan_speedup(alpha, gamma, c)),
    }
