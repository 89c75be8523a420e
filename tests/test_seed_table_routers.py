"""The seed table's router figures (`runner.seed_table`): the hindsight per-plan best single
drafter over the γ grid, each policy at its best γ by the run's primary figure, and a
routers-only run's page — read from tests/test_seed_compare.py's fixture rows. No model
runs here."""

from __future__ import annotations

import copy

import pytest
from test_seed_compare import (  # noqa: F401  (_few_resamples: the same autouse fixture)
    _cells,
    _config,
    _few_resamples,
    _line,
    _page,
    _regime,
    _rows,
    _sides,
)


def test_router_bound_is_the_hindsight_best_single_per_plan():
    """The bound picks, per plan, the single drafter with the most tokens per second and
    divides by the best single drafter over all plans; making another drafter the fastest
    on one plan raises it above 1 by exactly the hand-computed amount."""
    import numpy as np  # pylint: disable=import-outside-toplevel

    rows = _rows()
    names = list(rows[0]["pairing"])
    base = lambda rr, n, k: np.sum(  # noqa: E731
        [np.asarray(r["baselines"]["single"][n][k], float) for r in rr], axis=0
    )
    s0 = _sides(real_rows=rows)["real"]["summary"]
    best = s0["best_single_wall"]["drafter"]
    other = next(n for n in names if n != best)
    rows2 = copy.deepcopy(rows)
    for r in rows2:  # `other` becomes 10× faster on plan 0 only
        sec = r["baselines"]["single"][other]["seconds"]
        sec[0] = sec[0] / 10.0
    s2 = _sides(real_rows=rows2)["real"]["summary"]
    b = s2["router_bound"]["seconds"]
    best2 = s2["best_single_wall"]["drafter"]
    rates = {n: base(rows2, n, "tokens") / base(rows2, n, "seconds") for n in names}
    pick = [max(names, key=lambda n: rates[n][p]) for p in range(len(rates[names[0]]))]
    assert b["choice"] == pick and pick[0] == other
    tok = sum(base(rows2, n, "tokens")[p] for p, n in enumerate(pick))
    sec = sum(base(rows2, n, "seconds")[p] for p, n in enumerate(pick))
    want = (tok / sec) / (base(rows2, best2, "tokens").sum() / base(rows2, best2, "seconds").sum())
    assert b["value"] == pytest.approx(want, rel=1e-12)
    assert b["value"] > s0["router_bound"]["seconds"]["value"]
    line = _line(_page(real_rows=rows2), "| best single drafter per plan in hindsight")
    assert f"{want:.2f} [" in _cells(line)[2]


def test_router_bound_ranges_over_every_gamma_of_the_grid():
    """A γ grid makes the hindsight bound pick each plan's (drafter, γ): a drafter made 10×
    cheaper on plan 0 at a second γ only is that plan's choice, named ``drafter@γ``, and
    the bound is the hand-computed sum over the picks ÷ the best single at its γ."""
    import numpy as np  # pylint: disable=import-outside-toplevel

    rows = [r for r in _rows() if r.get("gamma") == 2]
    names = list(rows[0]["pairing"])
    twin = copy.deepcopy(rows)
    for r in twin:
        r["gamma"] = 5
        cost = r["baselines"]["single"][names[1]]["cost"]
        cost[0] = cost[0] / 10.0
    side = _sides(real_rows=rows + twin)["real"]
    s = side["summary"]
    b = s["router_bound"]["cost"]
    assert b["gammas"] == [2, 5]
    assert b["choice"][0] == f"{names[1]}@5"
    pool = {g: [r for r in rows + twin if r["gamma"] == g] for g in (2, 5)}
    base = lambda rr, n, k: np.sum(  # noqa: E731
        [np.asarray(r["baselines"]["single"][n][k], float) for r in rr], axis=0
    )
    tok = sec = 0.0
    for p, pick in enumerate(b["choice"]):
        n, g = pick.split("@")
        tok += base(pool[int(g)], n, "tokens")[p]
        sec += base(pool[int(g)], n, "cost")[p]
    g_best, n_best = s["best_single"]["gamma"], s["best_single"]["drafter"]
    best = base(pool[g_best], n_best, "tokens").sum() / base(pool[g_best], n_best, "cost").sum()
    assert b["value"] == pytest.approx((tok / sec) / best, rel=1e-12)
    assert "each plan's drafter and γ in [2, 5]" in side["markdown"]


def test_a_routers_only_run_is_titled_as_such_without_the_seeds_table():
    """A run with neither naive nor all-on (a routing run) has nothing of the seed's table
    to compare: its report is titled "Routers side by side", says why, and keeps every
    policy's row; a run with them keeps the seed's table and claims."""
    from specjax.runner import seed_table  # pylint: disable=import-outside-toplevel

    rows = [r for r in _rows() if r["policy"] == "auto"]
    md = seed_table.build(_config(), rows)["markdown"]
    assert md.startswith("# Routers side by side\n")
    assert "the seed's table and its four claims are not judged here" in md
    assert "| quantity | seed, naive |" not in md and "four claims, judged" not in md
    assert "\n| auto |" in md
    full = seed_table.build(_config(), _rows())["markdown"]
    assert full.startswith("# The seed's table, reproduced\n")
    assert "| quantity | seed, naive |" in full


@pytest.mark.parametrize("ratio, want", [(1.1, 5), (3.0, 2)])
def test_each_policy_is_at_its_best_gamma_by_the_primary_figure(ratio, want):
    """Where wall clock is primary (memory-bound rounds on a steady machine) a policy's row
    is at its best γ by wall clock, as the best single drafter is; else by the cost model.
    The twin γ 5 is 2× faster in wall clock and 10% dearer by the cost model."""
    import numpy as np  # pylint: disable=import-outside-toplevel

    rows = [r for r in _rows() if r.get("gamma") == 2]
    twin = copy.deepcopy(rows)
    for r in twin:
        r["gamma"] = 5
        if r["policy"] == "auto":
            r["per_plan"]["seconds"] = list(np.asarray(r["per_plan"]["seconds"]) / 2)
            r["per_plan"]["cost"] = list(np.asarray(r["per_plan"]["cost"]) * 1.1)
    for r in rows + twin:
        r["regime"] = _regime(ratio)
    side = _sides(real_rows=rows + twin)["real"]
    auto = side["summary"]["policies"]["auto"]
    assert side["primary"] == ("wall" if ratio < 1.5 else "cost")
    assert auto["gamma"] == want
    assert auto["gamma_chosen_by"] == (
        "wallclock_ratio_vs_single" if want == 5 else "throughput_ratio_vs_single"
    )
    assert ("Throughput by γ (wall clock): " in side["markdown"]) is True
