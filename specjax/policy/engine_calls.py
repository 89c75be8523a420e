"""Engine calls of plan steps: row keys, one call per drafter set, carried state.

The plan runner (`specjax.policy.plan`) lays a step out as rows (plan, drafter set, key);
this module runs them from the plans' carried state (`specjax.policy.plan_state`): `run_carried`
makes one engine call per distinct drafter set, with only that set's drafters, padded to
1, 2, 4 or a multiple of 4 rows (few compiled programs, little padding:
`plan_state.padded_count`); `commit_carried` carries each plan's state past the step;
`autoregressive_carried` runs the verifier alone over every plan's row (the baseline) or
over the rows of the plans that fell back. Each call's work is counted by price key
(`specjax.measure.prices`): its forwards, the rest of its loop trips and its state programs. Inside
`shared_calls` (or after `enable_shared_calls`) identical stateless computations of
different policies (the KL check on a prefix) are computed once, and their measured
seconds are charged to every caller. `teacher_forced` scores every drafter of a deployment
teacher forced on committed text (`auto`'s teacher-forced scores, experiments/routing_room.py).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import hashlib
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from specjax.engine.autoregressive import autoregressive_generate
from specjax.engine.decode import consume_width
from specjax.engine.deployment import Deployment
from specjax.engine.gammas import check_gamma, drafter_gammas
from specjax.engine.generate import speculative_generate
from specjax.engine.spec import EngineConfig
from specjax.measure.price_programs import register_ar_round, register_round
from specjax.metrics import price_key
from specjax.policy.plan_config import PlanConfig
from specjax.policy.plan_state import CallState, padded_rows

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


def plan_keys(
    seed: int,
    plans: Sequence[int],
    step: int,
    branches: Sequence[int] | None = None,
    fallback: bool = False,
) -> np.ndarray:
    """u32[R, 2] key data: the key of (plan, step), folded with a branch index (≥ 0) or the
    fallback tag; branch −1 without the fallback tag is the plan's own key."""
    n = len(plans)
    b = np.full(n, -1) if branches is None else np.asarray(branches)
    tag = np.full(n, _TAG_FALLBACK if fallback else 0)
    return np.asarray(
        _fold_keys(
            jnp.int32(seed),
            jnp.asarray(plans, jnp.int32),
            jnp.full((n,), step, jnp.int32),
            jnp.asarray(b, jnp.int32),
            jnp.asarray(tag, jnp.uint32),
        )
    )


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
class CarriedRows:
    """Results of a step's rows run from the plans' carried state (`run_carried`)."""

    tokens: list  # per row: committed verifier tokens of the step
    counters: Any  # numpy counters over all K drafters, one row per row
    seconds: np.ndarray  # f64[R] each row's share of its call's measured seconds
    calls: list  # `plan_state.CallState` per distinct set
    where: list  # per row: (index into calls, row in that call)
    prefills: list  # per row: drafters prefilled for its plan before the call
    drafts_per_round: list  # per row: drafts its verifier block scores per round (Σ γ_i)
    priced: list = None  # per row: price key → its share of its call's forwards
    fills: list = None  # per row: verifier blocks run for its feature drafters' features


def call_forwards(states, sub, n_slots: int, gamma: int, rows: int, iterations: int) -> dict:
    """Price key → forwards of one speculative call (`speculative_round`, `iterations`
    loop trips over `rows` padded rows): per trip one verifier forward over the block
    (1 + the drafts of every chain) and, per drafter, one forward consuming committed
    tokens plus γ_i − 1 one-token drafting forwards."""
    gammas = [d.static.own_gamma(gamma) for d in sub.drafters]
    widest = max(gammas)
    out = {price_key("verify", "verifier", 1 + n_slots * widest, rows, states.v_cap): iterations}
    width = 2 if (len(sub.drafters) == 1 and n_slots == 1) else widest + 1
    for spec, data, g in zip(sub.drafters, sub.d_data, gammas):
        j = states.dep.index(spec.name)
        cap = states.d_capacity(j)
        w = consume_width(int(data.retok.shape[1]), min(width, widest + 1))
        for key, n in (
            (price_key("draft", spec.name, w, rows, cap), iterations),
            (price_key("draft", spec.name, 1, rows, cap), iterations * (g - 1)),
        ):
            if n:
                out[key] = out.get(key, 0) + n
    return out


def run_carried(
    states,
    dep: Deployment,
    cfg: PlanConfig,
    rule: str,
    sets: Sequence[tuple[int, ...]],
    plans: Sequence[int],
    keys: np.ndarray,
    gammas: Sequence[int | None] | None = None,
) -> CarriedRows:
    """Rows (plan, drafter set, key) continued from the plans' carried state
    (`specjax.policy.plan_state.PlanStates`), one engine call per distinct set (as `run_rows`).

    `plans[i]` is row i's plan (an index into the run's plans). A drafter that has not run
    for a plan is prefilled first; one behind the plan's text catches up inside the call.
    `gammas[i]` (optional, lone drafters only; None: its own γ_i) is the γ row i's drafter
    drafts: rows of one set at different γ are different calls (one program per (drafter,
    γ, padded rows)); it is bounded by the carried state's window (`states.gamma`).
    """
    n = len(sets)
    gammas = _row_gammas(states, sets, gammas)
    tokens, seconds = [None] * n, np.zeros(n)
    where, prefills, priced = [None] * n, [()] * n, [{} for _ in range(n)]
    fills = [0] * n
    counters, calls, block = None, [], [0] * n
    for u, g_row in dict.fromkeys(zip(sets, gammas)):
        rows = [i for i in range(n) if sets[i] == u and gammas[i] == g_row]
        run = _run_set(states, dep, cfg, rule, u, g_row, rows, plans, keys)
        calls.append(run.call)
        if counters is None:
            counters = _counter_table(run.counters, n, states.gamma)
        for j, i in enumerate(rows):
            tokens[i] = run.call.new_tokens[j]
            seconds[i] = run.seconds / len(rows)  # padding copies are charged too
            priced[i] = {key: x / len(rows) for key, x in run.forwards.items()}
            where[i] = (len(calls) - 1, j)
            prefills[i] = run.prefills[j]
            fills[i] = run.fills[j]
            block[i] = run.drafts_per_round
            counters = _set_row(counters, run.counters, i, j)
    return CarriedRows(
        tokens=tokens,
        counters=counters,
        seconds=seconds,
        calls=calls,
        where=where,
        prefills=prefills,
        drafts_per_round=block,
        priced=priced,
        fills=fills,
    )


def _row_gammas(states, sets, gammas) -> list:
    """`run_carried`'s per-row γ checked (None: the drafter's own): within the carried
    state's window, and for lone drafters only."""
    n = len(sets)
    gammas = [None] * n if gammas is None else list(gammas)
    if len(gammas) != n:
        raise ValueError(f"run_carried: gammas has {len(gammas)} entries for {n} rows")
    for i, g in enumerate(gammas):
        if g is not None:
            check_gamma(g, "row gamma", states.gamma)
            if len(sets[i]) != 1:
                raise ValueError(
                    f"row gamma: got {g!r} for the set {tuple(sets[i])!r}, allowed: a γ for a "
                    "lone drafter only (drafters sharing a block draft the config's γ)"
                )
    return gammas


@dataclasses.dataclass
class _SetRun:
    """One engine call of `run_carried`: a drafter set's rows (at one γ) from carried state."""

    call: CallState  # the call's state and new tokens, one row per padded row
    counters: Any  # numpy counters over all K drafters, one row per padded row
    seconds: float  # the call's measured seconds and its state programs'
    forwards: dict  # price key → units of the call's work (its rows' and padding's)
    prefills: list  # per row: drafters prefilled for its plan before the call
    drafts_per_round: int  # drafts the verifier's block scores per round (Σ γ_i)
    fills: list  # per row: verifier blocks run for its plan's feature drafters' features


def _set_engine(dep: Deployment, cfg: PlanConfig, rule: str, u: tuple, g_row):
    """(the sub-deployment, the engine config) of drafter set `u` at row γ `g_row`: chains
    of one block share its width (the config's γ); one chain runs the plan's one-drafter
    rule (rule 1, block verification, coupled)."""
    sub = dep.subset([dep.names[j] for j in u])
    if len(u) > 1:
        sub = sub.with_gammas([None] * len(u))
    elif g_row is not None:
        sub = sub.with_gammas([g_row])
    set_rule = cfg.call_rule(1) if len(u) == 1 else rule
    ecfg = EngineConfig(
        gamma=cfg.gamma,
        rule=set_rule,
        verifier_temperature=cfg.verifier_temperature,
        n_slots=len(u),
        max_new_tokens=cfg.max_step_tokens,
    )
    return sub, ecfg


def _run_set(states, dep, cfg, rule, u: tuple, g_row, rows: list, plans, keys) -> _SetRun:
    """The engine call of `rows` (drafter set `u` at γ `g_row`), padded to `padded_rows`:
    drafters that have not run for a row's plan prefilled first, the plans' states
    gathered, the call run and priced (`_call_prices`)."""
    sub, ecfg = _set_engine(dep, cfg, rule, u, g_row)
    drafts_per_round = sum(drafter_gammas(cfg.gamma, [d.gamma for d in sub.drafters]))
    done = states.ensure(u, [plans[i] for i in rows])
    states.sync_features(u, [plans[i] for i in rows])  # feature drafters: missed features
    fills = states.take_fills()
    prefilled = [tuple(j for j in u if plans[i] in done.get(j, ())) for i in rows]
    padded = padded_rows(rows)
    call_plans = [plans[i] for i in padded]
    state = states.gather(call_plans, list(u))
    round_key = register_round(
        ecfg,
        sub.verifier,
        sub.v_params,
        sub.drafters,
        sub.d_data,
        state,
        keys[np.asarray(padded)],
        dep.stop_table,
        states.v_cap,
    )
    res = speculative_generate(
        ecfg,
        sub.verifier,
        sub.v_params,
        sub.drafters,
        sub.d_data,
        None,
        None,
        keys[np.asarray(padded)],
        stop_table=dep.stop_table,
        state=state,
        return_state=True,
    )
    call = CallState(
        state=res.state,
        drafters=tuple(u),
        plans=call_plans,
        new_tokens=[res.new_tokens(r) for r in range(len(padded))],
        dsynced=np.asarray(res.state.dsynced),
    )
    c = _expand_counters(jax.tree.map(np.asarray, res.counters), list(u), len(dep.drafters))
    state_secs, state_priced = states.take_charges()
    trips = int(c.rounds.max())
    fwd = call_forwards(states, sub, len(u), cfg.gamma, len(padded), trips)
    fwd[round_key] = trips
    for key, x in state_priced.items():
        fwd[key] = fwd.get(key, 0) + x
    _add_prefill_prices(fwd, states, dep, done)
    return _SetRun(
        call=call,
        counters=c,
        seconds=float(res.seconds) + state_secs,
        forwards=fwd,
        prefills=prefilled,
        drafts_per_round=drafts_per_round,
        fills=[fills.pop(plans[i], 0) for i in rows],  # a plan's first row carries them
    )


def _add_prefill_prices(fwd: dict, states, dep: Deployment, done: dict) -> None:
    """Adds to `fwd` the drafter prefills run before a call (`done`: drafter → the plans
    it was prefilled for), one forward each over their padded rows."""
    for j_d, need in done.items():
        key = price_key(
            "draft",
            dep.names[j_d],
            states.d_width[j_d],
            len(padded_rows(need)),
            states.d_capacity(j_d),
        )
        fwd[key] = fwd.get(key, 0) + 1


def _counter_table(c, n: int, gamma: int):
    """Zero counters of `c`'s layout for `n` rows, per-position counters sized for the
    widest window (`gamma`: a call with a shorter one fills them in part)."""
    return jax.tree.map(
        lambda x: np.zeros(
            (n,) + x.shape[1:-1] + (max(x.shape[-1], gamma),)
            if x.ndim >= 3
            else (n,) + x.shape[1:],
            x.dtype,
        ),
        c,
    )


def commit_carried(
    states,
    res: CarriedRows,
    plan_of_row: Sequence[int],
    committed: dict[int, int | None],
    final: dict[int, list],
) -> None:
    """Carries each plan's state past its step: the verifier from its committed row
    (`committed[p]`, None when it fell back: its verifier state is already the fallback's),
    and every drafter of the plan from a row whose step equals the committed tokens
    `final[p]` (other drafters stay behind and catch up when they next run)."""
    per_call = [({}, {}) for _ in res.calls]
    for p, r in committed.items():
        if r is not None:
            ci, li = res.where[r]
            per_call[ci][0][p] = li
    for r, (ci, li) in enumerate(res.where):
        p = plan_of_row[r]
        if list(res.tokens[r]) != list(final[p]):
            continue
        for j in res.calls[ci].drafters:
            if not any((p, j) in d for _, d in per_call):
                per_call[ci][1][(p, j)] = li
    for call, (v_rows, d_rows) in zip(res.calls, per_call):
        states.commit(call, v_rows, d_rows)


def autoregressive_carried(
    states, dep: Deployment, cfg: PlanConfig, plans: Sequence[int], keys: np.ndarray
):
    """The verifier alone continues `plans` from their carried state; returns (plan → new
    tokens, seconds, price key → units of the work).

    Every plan (the baseline): one call over the carried batch, as it is. Some plans (a
    fallback): their rows gathered into a call of `padded_count` rows, run, and committed
    back — a fallback of one plan costs a one-row loop, not one over every plan's row."""
    plans = list(plans)
    if sorted(plans) == list(range(states.n_plans)):
        rows = states.n_plans
        row_keys = np.zeros((rows,) + keys.shape[1:], keys.dtype)
        for j, p in enumerate(plans):
            row_keys[p] = keys[j]
        state, call_rows = states.v, None
    else:
        call_rows = padded_rows(plans)
        rows = len(call_rows)
        row_keys = np.asarray(keys)[[plans.index(p) for p in call_rows]]
        state = states.gather(call_rows, [])
    round_key = register_ar_round(
        dep.verifier,
        dep.v_params,
        state,
        row_keys,
        dep.stop_table,
        states.v_cap,
        coupled=cfg.coupled,
    )
    res = autoregressive_generate(
        dep.verifier,
        dep.v_params,
        None,
        row_keys,
        temperature=cfg.verifier_temperature,
        max_new_tokens=cfg.max_step_tokens,
        stop_table=dep.stop_table,
        coupled=cfg.coupled,
        state=state,
        return_state=True,
    )
    if call_rows is None:
        new = {p: res.new_tokens(p) for p in plans}
        states.commit_verifier(res.state, plans, new)
    else:
        new = {p: res.new_tokens(j) for j, p in enumerate(plans)}
        call = CallState(
            state=res.state,
            drafters=(),
            plans=call_rows,
            new_tokens=[res.new_tokens(j) for j in range(rows)],
            dsynced=np.zeros((0, rows), np.int32),
        )
        states.commit(call, {p: j for j, p in enumerate(plans)}, {})
    state_secs, priced = states.take_charges()
    # One trip per token of the longest step: a one-token verifier forward over the call's
    # rows and the rest of the step (sampling over the vocabulary, the commit).
    trips = max((len(t) for t in new.values()), default=0)
    if trips:
        priced[price_key("verify", "verifier", 1, rows, states.v_cap)] = trips
        priced[round_key] = trips
    return new, float(res.seconds) + state_secs, priced


def drafter_temperatures(dep) -> tuple:
    out = []
    for spec, data in zip(dep.drafters, dep.d_data):
        t = getattr(data, "temperature", None)
        out.append(float(np.asarray(t)) if t is not None else float(spec.temperature))
    return tuple(out)


def _set_row(dst, src, i, j):
    for f in dataclasses.fields(dst):
        d, x = getattr(dst, f.name), getattr(src, f.name)[j]
        if x.shape != d.shape[1:]:  # a call with a shorter window: zeros beyond it
            x = np.pad(x, [(0, w - m) for m, w in zip(x.shape, d.shape[1:])])
        d[i] = x
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

    per_drafter = (
        "proposed",
        "accepted",
        "rejected",
        "own_accepted_at",
        "own_reached_at",
        "match_at",
        "match_reached_at",
        "catchups",
    )
    return c.replace(**{f: widen(getattr(c, f)) for f in per_drafter})


# ---------------------------------------------------------------------------- teacher forced
