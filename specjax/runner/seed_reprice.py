"""The seed table's throughput column priced afresh from a run's per-plan counts, at other
drafter costs c_i and another price of a scored token (`reprice`): the TPU planner's seed
table at a slice's prices (`specjax.tpu.page`), and a check that a run's own column is its
counts at its own c_i. Intervals and the best-γ choice are the seed table's
(`runner.seed_table`)."""

from __future__ import annotations

import numpy as np

from specjax import metrics
from specjax.runner import seed_table

__all__ = ["reprice"]


def reprice(
    results: list[dict],
    costs: dict,
    *,
    score_cost: float = 0.0,
    consensus_cost: float | None = None,
) -> dict:
    """The seed table's throughput column at other prices, from a run's rows alone.

    Each row's per-plan priced counts (``per_plan['n:<item>']``, kept since baselines
    format 5) are priced by `metrics.itemised_cost` at ``costs`` (drafter name → c_i, one
    per drafter of the pairing), ``score_cost`` (one more token scored in a verifier call,
    in verifier calls) and ``consensus_cost`` (default: the run's); every policy is then
    taken at its best γ and divided by the best single drafter at the same prices (over
    the γ grid), as `build` does at the deployment's c_i.

    Returns {policy: {'value', 'ci' (95%, bootstrap over plans), 'gamma'}}, plus
    '_best_single': {'drafter', 'gamma'}. ValueError when a row has no priced counts (a
    run written before they were kept: rerun it) or ``costs`` lacks a drafter.
    """
    results = [r for r in results if isinstance(r, dict) and "per_plan" in r]
    if not results:
        raise ValueError("reprice: no `plans` rows to price")
    priced = []
    for r in results:
        names = list(r["pairing"])
        missing = [n for n in names if n not in costs]
        if missing:
            raise ValueError(
                f"reprice: costs={sorted(costs)} lack drafters {missing} of the pairing {names}"
            )
        c = [float(costs[n]) for n in names]
        cons = consensus_cost if consensus_cost is not None else r.get("consensus_cost")
        r = dict(r, per_plan=dict(r["per_plan"]), baselines=dict(r["baselines"]))
        r["per_plan"]["cost_repriced"] = _priced_total(r["per_plan"], c, score_cost, cons, r)
        r["baselines"]["single"] = {
            n: dict(b, cost_repriced=_priced_total(b, c, score_cost, cons, r))
            for n, b in r["baselines"]["single"].items()
        }
        priced.append(r)
    groups = seed_table._group(priced)
    best = seed_table._best_single(seed_table._baselines(groups), keys=("cost_repriced",)).get(
        "cost_repriced"
    )
    if best is None:
        raise ValueError("reprice: no single-drafter baseline has a finite rate")
    out = {"_best_single": {"drafter": best[1], "gamma": best[0].gamma}}
    for k, (name, per_gamma) in enumerate(sorted(groups.items())):
        scored = {}
        for g, rows in per_gamma.items():
            u = seed_table._Units(rows)

            def f(idx=None, u=u):
                return seed_table._div(
                    u.rate("cost_repriced", idx),
                    seed_table._single_rate(best[0], best[1], "cost_repriced", idx),
                )

            scored[g] = (f(), f, len(u.p["tokens"]))
        g = max(scored, key=lambda g: seed_table._nan_low(scored[g][0]))
        value, f, units = scored[g]
        out[name] = {
            "value": value,
            "ci": metrics.bootstrap_ci(units, f, seed_table.N_BOOT, seed=k),
            "gamma": g,
        }
    return out


def _priced_total(per_plan: dict, c, score_cost: float, consensus_cost, row) -> list:
    counts = {}
    for item in metrics.COST_ITEMS:
        if f"n:{item}" in per_plan:
            counts[item] = np.asarray(per_plan[f"n:{item}"], np.float64)
    need = set(metrics.COST_ITEMS) - {"verifier_tokens"}
    if not need <= set(counts):
        raise ValueError(
            f"reprice: the row of policy={row.get('policy')!r}, gamma={row.get('gamma')!r} "
            f"has no priced counts {sorted(need - set(counts))}; allowed: rows written since "
            "per-plan counts are kept (rerun the experiment)"
        )
    if consensus_cost is None:
        raise ValueError("reprice: consensus_cost is not in the rows; pass it")
    return metrics.itemised_cost(counts, c, float(consensus_cost), float(score_cost))[
        "total"
    ].tolist()
