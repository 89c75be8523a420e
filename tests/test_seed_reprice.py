"""`seed_reprice.reprice`: the seed table's throughput column priced afresh from a run's
per-plan counts (``per_plan['n:<item>']``), as the TPU planner prices it at a slice's c_i."""

from __future__ import annotations

import numpy as np
import pytest

from specjax import metrics
from specjax.runner import seed_reprice, seed_table

NAMES = ["a", "b"]


def _counts(rng, plans=4):
    return {
        "verifier_calls": rng.integers(5, 20, plans),
        "verifier_tokens": rng.integers(0, 40, plans),
        "verifier_prefills": np.ones(plans, int),
        "drafter_tokens": rng.integers(0, 60, (plans, 2)),
        "drafter_prefills": rng.integers(0, 3, (plans, 2)),
        "kl_passes": rng.integers(0, 5, (plans, 2)),
        "consensus_rounds": rng.integers(0, 3, plans),
    }


def _totals(rng, plans=4):
    c = _counts(rng, plans)
    out = {f"n:{k}": np.asarray(v).tolist() for k, v in c.items()}
    out["tokens"] = rng.integers(20, 80, plans).tolist()
    out["seconds"] = rng.uniform(1, 2, plans).tolist()
    out["cost"] = [1.0] * plans
    return out, c


def _rows(seed=0):
    rng = np.random.default_rng(seed)
    rows = []
    singles = {}
    for g in (2, 3):
        singles[g] = {n: _totals(rng) for n in NAMES}
        for policy in ("naive", "all_on"):
            per_plan, counts = _totals(rng)
            rows.append(
                {
                    "policy": policy,
                    "gamma": g,
                    "pairing": NAMES,
                    "per_plan": per_plan,
                    "_counts": counts,
                    "baselines": {"single": {n: singles[g][n][0] for n in NAMES}},
                    "_single_counts": {n: singles[g][n][1] for n in NAMES},
                }
            )
    return rows


@pytest.fixture(autouse=True)
def _few_resamples(monkeypatch):
    monkeypatch.setattr(seed_table, "N_BOOT", 50)


def _rate(tokens, counts, c, score, cons):
    return sum(tokens) / metrics.itemised_cost(counts, c, cons, score)["total"].sum()


@pytest.mark.parametrize("costs", [{"a": 0.05, "b": 0.3}, {"a": 0.4, "b": 0.01}])
def test_reprice_is_the_itemised_cost_of_the_counts(costs):
    rows = _rows()
    score, cons = 0.02, 1.5
    got = seed_reprice.reprice(rows, costs, score_cost=score, consensus_cost=cons)
    c = [costs[n] for n in NAMES]
    # the best single drafter over the γ grid at these prices, by hand
    singles = {
        (r["gamma"], n): _rate(
            r["baselines"]["single"][n]["tokens"], r["_single_counts"][n], c, score, cons
        )
        for r in rows
        for n in NAMES
    }
    (g_best, n_best), best = max(singles.items(), key=lambda kv: kv[1])
    assert got["_best_single"] == {"drafter": n_best, "gamma": g_best}
    for policy in ("naive", "all_on"):
        by_g = {
            r["gamma"]: _rate(r["per_plan"]["tokens"], r["_counts"], c, score, cons) / best
            for r in rows
            if r["policy"] == policy
        }
        g = max(by_g, key=by_g.get)
        assert got[policy]["gamma"] == g
        assert got[policy]["value"] == pytest.approx(by_g[g], rel=1e-12)
        lo, hi = got[policy]["ci"]
        assert lo <= got[policy]["value"] <= hi


def test_rows_without_counts_or_costs_are_refused():
    rows = _rows()
    with pytest.raises(ValueError, match=r"lack drafters \['b'\]"):
        seed_reprice.reprice(rows, {"a": 0.1}, consensus_cost=1.0)
    old = [
        dict(r, per_plan={k: v for k, v in r["per_plan"].items() if not k.startswith("n:")})
        for r in rows
    ]
    with pytest.raises(ValueError, match="no priced counts"):
        seed_reprice.reprice(old, {"a": 0.1, "b": 0.1}, consensus_cost=1.0)
    with pytest.raises(ValueError, match="no `plans` rows"):
        seed_reprice.reprice([{"x": 1}], {"a": 0.1, "b": 0.1}, consensus_cost=1.0)
