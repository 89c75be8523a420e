"""Reading result rows: the values a table or a plot takes from a row of ``results.jsonl``.

Shared by the sweep report (`specjax.runner.report`) and its plots (`specjax.runner.plots`,
`specjax.runner.plots_kit`), which import it (it imports none of them). A row records the
KL ceiling and the decision boundary's thresholds its cell ran with (``kl_ceiling``,
``thresholds``); a row written before rows did falls back to the ceiling its policy name
parses to, and to the config's ``boundary`` block (else the field report's thresholds).
"""

from __future__ import annotations

import math
import statistics
from typing import Any, Iterable, Sequence

from specjax.errors import ConfigError
from specjax.policy import names as policy_names
from specjax.policy.boundary import BoundaryThresholds

Row = dict[str, Any]
# The largest magnitude a plot draws (a larger value, like inf or nan, is in the tables).
PLOT_LIMIT = 1e12


def label(value: Any) -> str:
    """A short display name: ``code+prose`` for a pairing, a policy's canonical name
    (`specjax.policy.names.label`), ``0.5`` for a float."""
    if value is None:
        return "–"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (list, tuple)):
        return "+".join(label(v) for v in value)
    if isinstance(value, dict):
        if "name" in value or policy_names.is_policy_dict(value):
            return policy_names.label(value)
        return ",".join(f"{k}={label(v)}" for k, v in value.items())
    return str(value)


def kl_ceiling(row: Row) -> float | None:
    """The KL ceiling (nats) the row's cell ran with; None when switch 4 was off (or the
    row is a router's). A row without the field: the ceiling its policy name parses to."""
    if "kl_ceiling" in row:
        value = as_float(row["kl_ceiling"])
        return value if value is not None and math.isfinite(value) else None
    return policy_names.kl_ceiling(row.get("policy"))


def thresholds(row: Row, config: dict | None = None) -> BoundaryThresholds:
    """The decision boundary's thresholds the row's cell ran with. A row without the field:
    the config's ``boundary`` block, else the field report's thresholds."""
    given = row.get("thresholds")
    if not isinstance(given, dict):
        block = (config or {}).get("boundary")
        given = block if isinstance(block, dict) else {}
    fields = ("truncation_overhead_ratio", "acceptance_floor", "depth_ceiling")
    values = {k: as_float(given.get(k)) for k in fields}
    try:
        return BoundaryThresholds(**{k: v for k, v in values.items() if v is not None})
    except ConfigError:  # a damaged row is displayed with the field report's thresholds
        return BoundaryThresholds()


def has(rows: Sequence[Row], key: str) -> bool:
    """Whether some row has a value for `key`."""
    return any(r.get(key) is not None for r in rows)


def as_float(x: Any) -> float | None:
    """`x` as a float when it is a number (an int too large for a float is ±inf), else None."""
    if not isinstance(x, (int, float)) or isinstance(x, bool):
        return None
    try:
        return float(x)
    except OverflowError:
        return math.inf if x > 0 else -math.inf


def is_number(x: Any) -> bool:
    """A number a plot can place: finite, of magnitude at most `PLOT_LIMIT`."""
    f = as_float(x)
    return f is not None and math.isfinite(f) and abs(f) <= PLOT_LIMIT


def numbers(values: Iterable[Any]) -> list[float]:
    """The numbers among `values` a plot can place (`is_number`), as floats."""
    return [
        f
        for f in map(as_float, values)
        if f is not None and math.isfinite(f) and abs(f) <= PLOT_LIMIT
    ]


def numeric(values: Iterable[Any]) -> list[float]:
    """The numbers among `values`, finite or not (what a table writes), as floats."""
    return [f for f in map(as_float, values) if f is not None]


def mean(values: Sequence[float]) -> float:
    """Their mean; inf or nan when a value is, or when the sum overflows (never raises)."""
    try:
        return statistics.fmean(values)
    except (OverflowError, ValueError):  # inf + -inf, or a sum beyond the floats
        return sum(values) / len(values)


def sd(values: Sequence[float]) -> float:
    """The standard deviation of the plottable numbers among `values` (0 for fewer than 2)."""
    values = numbers(values)
    return statistics.stdev(values) if len(values) > 1 else 0.0


def unique(items: Iterable[Any]) -> list[Any]:
    """`items` without repeats, in first-seen order."""
    return list(dict.fromkeys(items))
