"""Machine prices: this machine's seconds per forward pass, by shape, measured in the run.

SPEC §10: on the real verifier throughput is wall clock, and the itemised cost model with
this machine's measured prices is its check (predicted ÷ wall within 25%). A run's counters
(`RunStats.priced`) name every forward pass its calls made by a price key
(`specjax.metrics.price_key`: verifier or drafter, block width, padded rows, cache
capacity); `measure_prices` times one forward of each such shape, and
`specjax.metrics.itemised_seconds` prices the counts: predicted seconds = Σ counts × prices.

How a price is measured: a compiled `lax.scan` loop of `reps` forwards of the shape (the
model's own `forward`, its cache carried through the loop as the engine carries it, over a
cache filled to half its capacity), compiled ahead of time and run once before it is timed
(`specjax.measure.timing.forward_timer`): no compilation and no first execution is in a price; the
price is the minimum over `repeats` runs. Prices are measured in the run's own process and
window (the runner measures a cell's keys right before the cell is priced, and the router
`auto` measures its candidates' before the cell runs), cached per process by (model
parameters, key), and recorded in the result row (``machine_prices``), so the predicted
figure is traceable.

The rest of a timed program is priced too (`specjax.measure.price_programs`): a ``round`` key is
one loop trip of an engine call without its forwards (sampling, the rule, the counters and
the commit, timed by the engine's own round with free models), a ``state`` key one run of a
carried-state program (gather, commit, place a prefill). Their templates are registered by
the programs as they run, so a run prices exactly the programs it ran.

What the prices do not contain: the catch-up of a drafter at the start of a call, prefill
groups (priced as one forward at the widest group's width), the loop's exit test, and host
Python (the step decision, a consensus round: never in a row's ``seconds`` either).
"""

from __future__ import annotations

from collections.abc import Iterable

from specjax import metrics
from specjax.measure import price_programs
from specjax.measure.timing import forward_timer

#: (id(params), price key) → (params kept alive, seconds).
_CACHE: dict = {}


def _model(dep, kind: str, name: str):
    if kind == "verify":
        return dep.verifier, dep.v_params
    if name not in dep.names:
        raise ValueError(
            f"price key: drafter {name!r} is not in the deployment; allowed: {list(dep.names)}"
        )
    i = dep.names.index(name)
    return dep.drafters[i].lm, dep.d_data[i].params


def measure_prices(dep, keys: Iterable[str], *, reps: int = 8, repeats: int = 3) -> dict:
    """Seconds of one forward for each price key (see the module docstring).

    Args:
      dep: the deployment whose models the keys name.
      keys: price keys (`specjax.metrics.price_key`).
      reps / repeats: forwards per timed loop, and timed loops (the minimum is kept).
    """
    out = {}
    for key in dict.fromkeys(keys):
        kind, name, width, rows, cap = metrics.parse_price_key(key)
        if kind in ("round", "state"):
            # The key's shapes and statics name the work (free models, zeros of the
            # arrays' shapes): one price per key and process.
            hit = _CACHE.get((None, key))
            if hit is None:
                hit = (None, price_programs.time_key(key, repeats))
                _CACHE[(None, key)] = hit
            out[key] = float(hit[1])
            continue
        lm, params = _model(dep, kind, name)
        ck = (id(params), key)
        hit = _CACHE.get(ck)
        if hit is None or hit[0] is not params:
            context = max(min(cap // 2, cap - width), 0)
            run = forward_timer(lm, params, rows, width, context, cap, reps)
            hit = (params, min(run() for _ in range(max(repeats, 1))))
            _CACHE[ck] = hit
        out[key] = float(hit[1])
    return metrics.check_prices(out)


def predicted_seconds(priced, prices) -> dict:
    """`metrics.itemised_seconds` of a run's priced counts (per plan, itemised)."""
    return metrics.itemised_seconds(priced, prices)
