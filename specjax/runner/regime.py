"""Which throughput figure is primary for a run: wall clock where its verifier is a real
model and its rounds were measured memory-bound, else the cost model (SPEC §10)."""

from __future__ import annotations

import math

from specjax import metrics
from specjax.runner import deployments

__all__ = [
    "WALL_CLOCK_PRIMARY",
    "MEMORY_BOUND_RATIO",
    "WALL_DRIFT_TOLERANCE",
    "regime_ratio",
    "wall_drift",
    "drift_excessive",
    "primary_figure",
]

#: Deployments whose verifier is a pretrained model (their kind's `pretrained`): wall clock
#: is their primary throughput figure where their rounds are memory-bound (elsewhere the
#: cost model is).
WALL_CLOCK_PRIMARY = tuple(k.name for k in deployments.all_kinds() if k.pretrained)
#: T_score(γ+1) / T_step at or below which a run's rounds are read as memory-bound: wall
#: clock is then the real deployment's primary throughput figure (else the cost model, the
#: wall clock its check: SPEC §10).
MEMORY_BOUND_RATIO = 1.5
#: How far a drafter's wall-clock rate may move between the run's baseline (measured with its
#: first cell) and the same drafter's own `single:<name>` cell (measured later) before wall
#: clock is read as the machine's load rather than the policies: beyond a factor
#: 1 ± this, the cost model is the primary figure and wall clock only its check.
WALL_DRIFT_TOLERANCE = 0.15


def _ok(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def regime_ratio(rows: list[dict]) -> tuple[float, int, list[int]] | None:
    """(mean T_score(γ+1) / T_step, rows it is the mean of, padded row counts) over the
    rows that carry it: a row's ``regime`` (measured by the runner at the padded rows of
    its rounds), else a same-shape pair among its ``machine_prices``; None when no row does."""
    ratios, batches = [], set()
    for row in rows:
        reg = row.get("regime") if isinstance(row.get("regime"), dict) else row
        ts, tt = reg.get("t_score"), reg.get("t_step")
        if _ok(ts) and _ok(tt) and tt > 0:
            ratios.append(ts / tt)
            if isinstance(reg.get("rows"), int):
                batches.add(reg["rows"])
            continue
        got = _machine_ratio(row)
        if got is not None:
            ratios.append(got[0])
            batches.add(got[1])
    if not ratios:
        return None
    return sum(ratios) / len(ratios), len(ratios), sorted(batches)


def _machine_ratio(row: dict) -> tuple[float, int] | None:
    """(T_score(γ+1) / T_step, padded rows) from a row's measured machine prices: the
    verifier's (γ+1)-token and one-token forwards at the same padded rows and cache, the
    widest batch that has both; None when the row has no such pair."""
    prices, gamma = row.get("machine_prices"), row.get("gamma")
    if not isinstance(prices, dict) or not isinstance(gamma, int):
        return None
    by = {}
    for key, sec in prices.items():
        try:
            kind_, _, width, rows, cap = metrics.parse_price_key(key)
        except ValueError:
            continue
        if kind_ == "verify" and width in (1, gamma + 1) and _ok(sec):
            by.setdefault((rows, cap), {})[width] = sec
    pairs = [(rc, w) for rc, w in by.items() if 1 in w and gamma + 1 in w and w[1] > 0]
    if not pairs:
        return None
    (rows, _), w = max(pairs, key=lambda p: p[0][0])
    return w[gamma + 1] / w[1], rows


def wall_drift(rows: list[dict]) -> dict[str, float]:
    """Drafter → its `single:<drafter>` cell's tokens per second ÷ the same drafter's
    baseline tokens per second (``baselines.single``, run with the first cell at the same γ):
    the same program measured twice, so 1.00 on a steady machine. Both are sums over the same
    plans of warm wall clock. Rows without such a pair are skipped; the worst γ per drafter."""
    out: dict[str, float] = {}
    for row in rows:
        pol = row.get("policy")
        if not isinstance(pol, str) or not pol.startswith("single:"):
            continue
        name = pol.split(":", 1)[1]
        try:
            base = row["baselines"]["single"][name]
            own = row["per_plan"]
            r_own = sum(own["tokens"]) / sum(own["seconds"])
            r_base = sum(base["tokens"]) / sum(base["seconds"])
        except (KeyError, TypeError, ZeroDivisionError):
            continue
        if not (_ok(r_own) and _ok(r_base)) or r_base <= 0:
            continue
        d = r_own / r_base
        if name not in out or abs(math.log(d)) > abs(math.log(out[name])):
            out[name] = d
    return out


def drift_excessive(drift: dict | None) -> bool:
    """True when some drafter's wall-clock rate moved by more than WALL_DRIFT_TOLERANCE."""
    return any(
        not (1 - WALL_DRIFT_TOLERANCE <= d <= 1 / (1 - WALL_DRIFT_TOLERANCE))
        for d in (drift or {}).values()
    )


def primary_figure(deployment, measured, drift: dict | None = None) -> str:
    """'wall' or 'cost': wall clock for a real verifier whose rounds were not measured
    compute-bound (`measured`: `regime_ratio`'s result or None) and whose wall clock held
    steady over the run (`drift`: `wall_drift`'s result), else the cost model."""
    if deployment not in WALL_CLOCK_PRIMARY or drift_excessive(drift):
        return "cost"
    return "wall" if measured is None or measured[0] <= MEMORY_BOUND_RATIO else "cost"
