"""Engine calls of plan steps: row keys, shared (memoized) calls, one call per drafter set.

The plan runner (`specjax.policy.plan`) lays a step out as rows (plan, drafter set, key);
this module runs them: `run_rows` makes one engine call per distinct drafter set, with only
that set's drafters, padded to a power-of-two row count (few compiled programs), and
`autoregressive_rows` runs the verifier alone in a fixed-shape batch. Inside `shared_calls` (or
after `enable_shared_calls`) identical calls — of different policies, baselines and the
fallback — are computed once, and their measured seconds are charged to every caller.
"""
from __future__ import annotations

import collections
import contextlib
import dataclasses
import hashlib
from typing import TYPE_CHECKING, Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from specjax.engine.deployment import Deployment
from specjax.engine.generate import autoregressive_generate, speculative_generate
from specjax.engine.spec import EngineConfig

if TYPE_CHECKING:
    from specjax.policy.plan import PlanConfig

#: fold_in tags of the plan streams.
_TAG_PLANS, _TAG_FALLBACK = 0x706C616E, 0x66616C6C


# ---------------------------------------------------------------------------- keys

@jax.jit
def _fold_keys(seed, plan, step, branch, tag):
    def one(p, s, b, t):
        k = jax.random.fold_in(jax.random.fold_in(jax.random.key(seed), _TAG_PLANS), p)
        k = jax.random.fold_in(k, s)
        kb = jax.random.fold_in(jax.random.fold_in(k, t), b)
        return jnp.where((b < 0) & (t == 0), jax.random.key_data(k), jax.random.key_data(kb))
    return jax.vmap(one)(plan, step, branch, tag)


def plan_keys(seed: int, plans: Sequence[int], step: int, branches: Sequence[int] | None = None,
              fallback: bool = False) -> np.ndarray:
    """u32[R, 2] key data: the key of (plan, step), folded with a branch index (≥ 0) or the
    fallback tag; branch −1 without the fallback tag is the plan's own key."""
    n = len(plans)
    b = np.full(n, -1) if branches is None else np.asarray(branches)
    tag = np.full(n, _TAG_FALLBACK if fallback else 0)
    return np.asarray(_fold_keys(jnp.int32(seed), jnp.asarray(plans, jnp.int32),
                                 jnp.full((n,), step, jnp.int32), jnp.asarray(b, jnp.int32),
                                 jnp.asarray(tag, jnp.uint32)))


# ---------------------------------------------------------------------------- shared calls

class _CallMemo:
    """Identical engine calls of different policies in one process, computed once.

    Keyed by everything the call's output depends on (models by identity, kept alive by the
    entry, drafter set, rule, γ, temperatures, budget, widths, prompts, keys); the measured
    seconds of the first computation are stored with the result and charged to every
    policy that needs the call.
    """

    def __init__(self, size: int = 512):
        self.size, self.entries, self.hits, self.misses = size, collections.OrderedDict(), 0, 0

    def get(self, key):
        if key in self.entries:
            self.entries.move_to_end(key)
            self.hits += 1
            return self.entries[key][1]
        self.misses += 1
        return None

    def put(self, key, refs, value):
        self.entries[key] = (refs, value)
        while len(self.entries) > self.size:
            self.entries.popitem(last=False)


_MEMO: _CallMemo | None = None


@contextlib.contextmanager
def shared_calls(size: int = 512):
    """Within the block, identical engine calls (of different policies, baselines and the
    fallback) are computed once; yields the memo (``.hits`` / ``.misses``)."""
    global _MEMO
    prev, _MEMO = _MEMO, _CallMemo(size)
    try:
        yield _MEMO
    finally:
        _MEMO = prev


def enable_shared_calls(size: int = 512) -> None:
    """Turns on sharing of identical engine calls for the rest of the process (the runner
    does, so that the cells of a sweep share their common calls); a no-op when on."""
    global _MEMO
    if _MEMO is None:
        _MEMO = _CallMemo(size)


def digest(*arrays) -> str:
    h = hashlib.sha256()
    for a in arrays:
        a = np.ascontiguousarray(a)
        h.update(str((a.dtype, a.shape)).encode())
        h.update(a.tobytes())
    return h.hexdigest()


def memoized(key_parts, refs, compute):
    if _MEMO is None:
        return compute()
    key = tuple(key_parts)
    hit = _MEMO.get(key)
    if hit is not None:
        return hit
    value = compute()
    _MEMO.put(key, refs, value)
    return value


# ---------------------------------------------------------------------------- engine rows

@dataclasses.dataclass
class RowResults:
    """Results of a step's engine rows (one per distinct (plan, set, key))."""
    tokens: list            # per row: committed verifier tokens of the step
    counters: Any           # numpy counters over all K drafters, one row per row
    seconds: np.ndarray     # f64[R] each row's share of its call's measured seconds


def run_rows(dep: Deployment, cfg: PlanConfig, rule: str, sets: Sequence[tuple[int, ...]],
              plans: Sequence[int], keys: np.ndarray, v, d, widths) -> RowResults:
    """Rows (plan, drafter set, key), one engine call per distinct set.

    Each call runs only its set's drafters (a sub-deployment), so no row pays for drafters
    it does not use; a one-drafter set uses rule 1 (`rejection`, or `coupled`): with one
    chain every rule reduces to it, and the call is that drafter's single baseline's.
    """
    k = len(dep.drafters)
    n = len(sets)
    tokens, seconds = [None] * n, np.zeros(n)
    counters = None
    for u in dict.fromkeys(sets):
        rows = [i for i in range(n) if sets[i] == u]
        sub = dep.subset([dep.names[j] for j in u])
        set_rule = (("coupled" if rule.startswith("coupled") else "rejection")
                    if len(u) == 1 else rule)
        ecfg = EngineConfig(gamma=cfg.gamma, rule=set_rule,
                            verifier_temperature=cfg.verifier_temperature, n_slots=len(u),
                            max_new_tokens=cfg.max_step_tokens)
        # Pad the call to a power-of-two row count (repeating its first row; the copies'
        # results are dropped), so calls whose sets hold a varying number of plans (the
        # routed policies) reuse a few compiled programs instead of one per row count.
        padded = rows + [rows[0]] * (_pow2(len(rows)) - len(rows))
        v_rows = [v[plans[i]] for i in padded]
        d_rows = [[d[j][plans[i]] for i in padded] for j in u]
        r_keys = keys[np.asarray(padded)]
        wd = [widths[1][j] for j in u]

        def compute(sub=sub, ecfg=ecfg, v_rows=v_rows, d_rows=d_rows, r_keys=r_keys, wd=wd):
            res = speculative_generate(
                ecfg, sub.verifier, sub.v_params, sub.drafters, sub.d_data, v_rows, d_rows,
                r_keys, stop_table=dep.stop_table, bucket=cfg.bucket, min_width=widths[0],
                drafter_min_width=wd)
            c = jax.tree.map(np.asarray, res.counters)
            return ([res.new_tokens(i) for i in range(len(v_rows))], c, float(res.seconds))

        key = ("spec", id(dep.v_params), tuple(id(sub_d.params) for sub_d in sub.d_data),
               tuple(sub.drafters), set_rule, cfg.gamma, cfg.verifier_temperature,
               cfg.max_step_tokens, cfg.bucket, widths[0], tuple(wd),
               drafter_temperatures(sub),
               digest(r_keys, *[np.asarray(x, np.int64) for x in v_rows],
                       *[np.asarray(x, np.int64) for dr in d_rows for x in dr]))
        new, c, secs = memoized(key, (dep.v_params, sub.d_data), compute)
        c = _expand_counters(c, list(u), k)
        if counters is None:
            counters = jax.tree.map(lambda x: np.zeros((n,) + x.shape[1:], x.dtype), c)
        for j, i in enumerate(rows):
            tokens[i] = new[j]
            seconds[i] = secs / len(rows)   # padding copies are charged too
            counters = _set_row(counters, c, i, j)
    return RowResults(tokens=tokens, counters=counters, seconds=seconds)


def _pow2(n: int) -> int:
    return 1 << max(int(n) - 1, 0).bit_length()


def drafter_temperatures(dep) -> tuple:
    out = []
    for spec, data in zip(dep.drafters, dep.d_data):
        t = getattr(data, "temperature", None)
        out.append(float(np.asarray(t)) if t is not None else float(spec.temperature))
    return tuple(out)


def _set_row(dst, src, i, j):
    for f in dataclasses.fields(dst):
        getattr(dst, f.name)[i] = getattr(src, f.name)[j]
    return dst


def _expand_counters(c, index, k):
    """Counters of a sub-deployment (drafters `index`) laid out over all K drafters."""
    if list(index) == list(range(k)):
        return c

    def widen(x):
        if x.ndim < 2:
            return x
        out = np.zeros((x.shape[0], k) + x.shape[2:], x.dtype)
        out[:, index] = x
        return out
    per_drafter = ("proposed", "accepted", "rejected", "own_accepted_at", "own_reached_at",
                   "match_at", "match_reached_at")
    return c.replace(**{f: widen(getattr(c, f)) for f in per_drafter})


def autoregressive_rows(dep: Deployment, cfg: PlanConfig, texts: Sequence[str], plans, keys,
                    width: int, n_rows: int | None = None):
    """The verifier alone on `texts` (rows `plans` of a fixed-shape batch, so the compiled
    program never changes); returns (new token lists, seconds)."""
    v = [dep.encode(t) for t in texts]
    n_rows = n_rows or len(v)
    full = [v[0]] * n_rows
    rows = list(range(len(v))) if len(v) == n_rows else list(plans)
    row_keys = np.zeros((n_rows,) + keys.shape[1:], keys.dtype)
    active = np.zeros((n_rows,), bool)
    for j, r in enumerate(rows):
        full[r], row_keys[r], active[r] = v[j], keys[j], True

    def compute():
        res = autoregressive_generate(dep.verifier, dep.v_params, full, row_keys,
                                      temperature=cfg.verifier_temperature,
                                      max_new_tokens=cfg.max_step_tokens,
                                      stop_table=dep.stop_table, coupled=cfg.coupled,
                                      bucket=cfg.bucket, min_width=width, active=active)
        return [res.new_tokens(r) for r in rows], float(res.seconds)

    key = ("ar", id(dep.v_params), cfg.verifier_temperature, cfg.coupled, cfg.max_step_tokens,
           cfg.bucket, width, n_rows,
           digest(row_keys, active, *[np.asarray(x, np.int64) for x in full]))
    return memoized(key, (dep.v_params,), compute)
