"""The metrics of SPEC §7, one function per definition. The definitions are part of the API.

Inputs are counters (Python numbers, numpy or jax arrays); ratios are computed element by
element and returned as jax arrays, so the functions work on host counters and inside
`jit` alike. To pool counters over rounds, batches or runs pass `pool_axis`: the numerator
and denominator are summed over it first — a ratio of sums, never a mean of ratios.

Empty counters: a rate whose denominator is 0 (no opportunity to measure it — a drafter
that proposed nothing, a run with no verifier call) is NaN, "no data", never 0 or 1.
Two exceptions, stated where they occur: `mean_truncation_depth` with no truncation is 0
(nothing was discarded), and `rejection_attribution` with no rejection gives every drafter
a share of 0.

The KL max/mean per pair lives in `specjax.policy.kl` (`kl_summary`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

import chex
import jax
import jax.numpy as jnp
import numpy as np

Axis = int | Sequence[int] | None

# Cost of one consensus round, in verifier calls, unless the caller says otherwise: a
# round is a synchronisation of every branch, charged like one verifier step of latency.
DEFAULT_CONSENSUS_COST = 1.0


def _float(x) -> jax.Array:
    return jnp.asarray(x, dtype=jnp.result_type(float))


def _is_concrete(x) -> bool:
    return not isinstance(x, jax.core.Tracer)


def _check_range(function: str, name: str, x, low=None, high=None) -> None:
    """Raises ValueError for values outside [low, high] (NaN included); concrete inputs only."""
    if not _is_concrete(x):
        return
    values = np.asarray(x, dtype=np.float64)
    bad = ~np.isfinite(values)  # NaN and ±inf are never valid counters or rates.
    if low is not None:
        bad |= values < low
    if high is not None:
        bad |= values > high
    if np.any(bad):
        allowed = (
            f"finite, in [{'-inf' if low is None else low}, {'inf' if high is None else high}]"
        )
        raise ValueError(
            f"{function}: {name}={values[bad].ravel()[:4].tolist()} is not allowed; "
            f"allowed: {allowed}."
        )


def _ratio(numerator, denominator, pool_axis: Axis, empty: float) -> jax.Array:
    numerator = _float(numerator)
    denominator = _float(denominator)
    if pool_axis is not None:
        axis = pool_axis if isinstance(pool_axis, int) else tuple(pool_axis)
        numerator = jnp.sum(numerator, axis=axis)
        denominator = jnp.sum(denominator, axis=axis)
    nonzero = denominator != 0
    return jnp.where(nonzero, numerator / jnp.where(nonzero, denominator, 1.0), empty)


# ------------------------------------------------------------------------- acceptance


def acceptance(accepted, proposed, *, pool_axis: Axis = None) -> jax.Array:
    """Acceptance `α_i` = accepted draft tokens / proposed draft tokens (per drafter).

    Args:
        accepted: accepted draft tokens, any shape (e.g. `[K]` per drafter).
        proposed: proposed draft tokens, same shape.
        pool_axis: axes to sum over before dividing (pooling), or None.

    Returns:
        The ratio; NaN where nothing was proposed.
    """
    return _ratio(accepted, proposed, pool_axis, jnp.nan)


def per_position_acceptance(accepted_at_k, reached_k, drafts) -> tuple[jax.Array, jax.Array]:
    """Acceptance at each draft position `k` = 1..γ (index `k − 1` of the last axis).

    * conditional = accepted at `k` / reached `k` (the chain got to position `k`, i.e. all
        earlier positions were accepted): the per-position acceptance rate;
    * unconditional = accepted at `k` / drafts (every drafted chain in the denominator):
        the probability that a chain's `k`-th token is accepted, so its sum over `k` is the
        mean accepted draft length per chain.

    Args:
        accepted_at_k: f32[..., γ], accepted tokens at each position.
        reached_k: f32[..., γ], chains that reached each position (`reached_k[..., 0]` is
            normally `drafts`).
        drafts: f32[...], drafted chains (broadcast against the leading axes).

    Returns:
        (conditional, unconditional), each f32[..., γ]; NaN where the denominator is 0.
    """
    chex.assert_equal_shape([jnp.asarray(accepted_at_k), jnp.asarray(reached_k)])
    conditional = _ratio(accepted_at_k, reached_k, None, jnp.nan)
    drafts = _float(drafts)[..., None]
    unconditional = _ratio(accepted_at_k, drafts, None, jnp.nan)
    return conditional, unconditional


def joint_acceptance(
    shared_committed_from_draft, shared_reached, *, pool_axis: Axis = None
) -> jax.Array:
    """Joint acceptance conditioned on a shared committed prefix (the seed's 0.19 → 0.52).

    = positions of the shared block committed from drafted tokens / positions of the shared
    block that verification reached, counted over the rounds in which ≥ 2 drafters extended
    the same committed prefix (the caller counts only those rounds). Per-position and
    conditional; pool per-round counters with `pool_axis=0`.

    Returns:
        The ratio; NaN where no shared position was reached.
    """
    return _ratio(shared_committed_from_draft, shared_reached, pool_axis, jnp.nan)


def rejection_attribution(rejected_by_drafter) -> dict:
    """Rejected positions bucketed by the proposing drafter, as shares of all rejections.

    Args:
        rejected_by_drafter: a mapping drafter name → rejected positions, or a sequence /
            array `[K]` (keys are then the indices). A value may itself be an array (e.g. per
            position); it is summed.

    Returns:
        drafter → share of all rejected positions (floats summing to 1); every share is 0.0
        when nothing was rejected.
    """
    if isinstance(rejected_by_drafter, Mapping):
        items = list(rejected_by_drafter.items())
    else:
        items = list(enumerate(np.asarray(rejected_by_drafter)))
    counts = {key: float(np.sum(np.asarray(value, dtype=np.float64))) for key, value in items}
    for key, count in counts.items():
        if not (np.isfinite(count) and count >= 0):
            raise ValueError(
                f"rejection_attribution: drafter {key!r} has {count!r} rejections; allowed: ≥ 0."
            )
    total = sum(counts.values())
    if total == 0:
        return {key: 0.0 for key in counts}
    return {key: count / total for key, count in counts.items()}


# ------------------------------------------------------------------------- lengths


def mean_accepted_length(committed_tokens, verifier_calls, *, pool_axis: Axis = None):
    """Mean accepted length = tokens committed per verifier call, bonus token included.

    Autoregressive decoding scores 1; a speculative round commits between 1 and γ + 1.
    NaN with no verifier call.
    """
    return _ratio(committed_tokens, verifier_calls, pool_axis, jnp.nan)


def block_efficiency(committed_tokens, verifier_calls, *, pool_axis: Axis = None):
    """Block efficiency, taken as tokens committed per verifier call (bonus included).

    This is the same number as `mean_accepted_length` (Leviathan et al.'s "expected tokens
    per iteration", SpecInfer's "average number of tokens verified per decoding step"); it
    is kept under both names because papers report both. Compare it with
    `leviathan_expected_tokens`.
    """
    return mean_accepted_length(committed_tokens, verifier_calls, pool_axis=pool_axis)


def mean_truncation_depth(discarded_tokens, truncations, *, pool_axis: Axis = None):
    """Mean truncation depth = draft tokens discarded per truncation.

    A truncation cuts a chain at a rejection; the discarded tokens are the rejected one and
    every drafted token after it. With no truncation the depth is 0.0 (nothing discarded),
    not NaN, so it can feed the decision boundary's depth ceiling directly.
    """
    return _ratio(discarded_tokens, truncations, pool_axis, 0.0)


def consensus_fallback_rate(fallback_steps, plan_steps, *, pool_axis: Axis = None):
    """Consensus-fallback rate = plan steps that fell back / plan steps. NaN with no step."""
    return _ratio(fallback_steps, plan_steps, pool_axis, jnp.nan)


# ------------------------------------------------------------------------- throughput


def tokens_per_second(committed_tokens, seconds, *, pool_axis: Axis = None):
    """Wall-clock throughput = committed tokens / seconds. NaN for zero seconds."""
    return _ratio(committed_tokens, seconds, pool_axis, jnp.nan)


# ---------------------------------------------------------------- the one cost function

#: The items of the modelled cost, in the order `itemised_cost` reports them.
COST_ITEMS = (
    "verifier_calls",
    "verifier_tokens",
    "verifier_prefills",
    "drafter_tokens",
    "drafter_prefills",
    "kl_passes",
    "consensus_rounds",
)


def itemised_cost(
    counts: Mapping[str, Any],
    c: Sequence[float],
    consensus_cost: float = DEFAULT_CONSENSUS_COST,
    score_cost: float = 0.0,
) -> dict[str, np.ndarray]:
    """The modelled cost of a run, itemised, in units of one verifier call (SPEC §7).

    Every figure that prices work (throughput per unit cost, the ratios to the baselines,
    the projection to the seed's model sizes) calls this function; nothing else prices.

    ====================  =====================================================  =========
    item                  what is counted (`specjax.policy.counters` counters)   price
    ====================  =====================================================  =========
    verifier_calls        one per round, and one per token of a fallback step;   1
                          with ``share_verifier_call`` (the default) the
                          branches of a plan are batched into one call per
                          round, otherwise each branch's rounds are calls
    verifier_tokens       tokens the verifier scored beyond one per call: the    score_cost
                          block's γ·S drafts of a round (S chains); 0 for an
                          autoregressive step
    verifier_prefills     prompt prefills of the verifier: one per plan (later   1
                          steps continue its carried cache)
    drafter_tokens        tokens drafted by drafter i (γ per round it drafted)   c_i
    drafter_prefills      prefills of drafter i (one per plan, at its first      c_i
                          use) and its catch-up passes, as the engine ran
                          them (one per γ + 1 committed tokens it missed,
                          e.g. a step sat out; more where another
                          tokenizer's pieces do not fit one block)
    kl_passes             forward passes of drafter i for the KL check           c_i
                          (charged only to policies with the KL ceiling on)
    consensus_rounds      consensus rounds charged by fallback steps             consensus_cost
    ====================  =====================================================  =========

    Args:
      counts: the counters above, each an array whose first axis may be the plan (then the
        items are per plan) with drafter counters ``[..., K]``.
      c: the K drafters' cost coefficients (per-token cost relative to a verifier call).
      consensus_cost: the price of a consensus round, in verifier calls (≥ 0).
      score_cost: the price of one more token scored in a call, in verifier calls (≥ 0).
        0 is the seed's model — a call over a few tokens of a large verifier is
        memory-bound, its price the weights' read whatever the block; a compute-bound
        machine (a CPU, large batches) measures it: (T_score / T_step − 1) / (γ·S).
        Counters written before this item existed price it at 0.

    Returns:
      item → cost (arrays shaped like the counters' plan axis), plus ``'total'``.
    """
    c = _checked_prices(c, consensus_cost, score_cost)
    out = {item: _item_cost(item, counts, c, consensus_cost, score_cost) for item in COST_ITEMS}
    out["total"] = sum(out[i] for i in COST_ITEMS)
    return out


def _checked_prices(c, consensus_cost: float, score_cost: float) -> np.ndarray:
    """The drafters' cost coefficients as a float64 vector, after checking them and the two
    prices (a `ValueError` naming the one not allowed)."""
    c = np.asarray(c, np.float64)
    if c.ndim != 1 or not np.all(np.isfinite(c)) or np.any(c < 0):
        raise ValueError(
            f"itemised_cost: c={c.tolist()!r} is not allowed; allowed: one finite "
            "cost ≥ 0 per drafter"
        )
    for name, price in (("consensus_cost", consensus_cost), ("score_cost", score_cost)):
        if not (math.isfinite(price) and price >= 0):
            raise ValueError(
                f"itemised_cost: {name}={price!r} is not allowed; allowed: a finite number ≥ 0"
            )
    return c


def _item_cost(item: str, counts, c: np.ndarray, consensus_cost: float, score_cost: float):
    """One item of `itemised_cost`: its counts at its price."""
    if item == "verifier_tokens" and item not in counts:
        x = np.zeros_like(np.asarray(counts["verifier_calls"], np.float64))
    else:
        x = np.asarray(counts[item], np.float64)
    if np.any(x < 0):
        raise ValueError(f"itemised_cost: {item} has negative counts")
    if item in ("drafter_tokens", "drafter_prefills", "kl_passes"):
        if x.shape[-1] != len(c):
            raise ValueError(f"itemised_cost: {item} has {x.shape[-1]} drafters, c has {len(c)}")
        return x @ c
    if item == "consensus_rounds":
        return x * float(consensus_cost)
    if item == "verifier_tokens":
        return x * float(score_cost)
    return x


# ---------------------------------------------------------------- machine prices

#: What a price key prices: a verifier or a drafter forward; the rest of one loop trip of
#: an engine call (sampling, the rule, the commit: `round`); a state program (`state`:
#: gathering, committing and placing the carried state of plan steps).
PRICE_KINDS = ("verify", "draft", "round", "state")
_PRICE_KEY = re.compile(
    r"^(verify|draft|round|state):(.+):([1-9][0-9]*)x([1-9][0-9]*)@([1-9][0-9]*)$"
)


def price_key(kind: str, model: str, width: int, rows: int, capacity: int) -> str:
    """The name of one priced unit of work: ``kind:model:WIDTHxROWS@CAPACITY`` — a forward
    of `width` tokens per row over `rows` padded rows into a cache of `capacity` slots, by
    the verifier (``kind='verify'``, model ``'verifier'``) or drafter `model` (``'draft'``);
    for ``'round'`` the rest of one loop trip of the program `model` names (its block
    width), for ``'state'`` one run of the state program `model` names (`specjax.measure.prices`)."""
    key = f"{kind}:{model}:{int(width)}x{int(rows)}@{int(capacity)}"
    parse_price_key(key)
    return key


def parse_price_key(key: str) -> tuple[str, str, int, int, int]:
    """(kind, model, width, rows, capacity) of a `price_key`; ValueError if malformed."""
    m = _PRICE_KEY.match(str(key))
    if m is None:
        raise ValueError(
            f"price key: got {key!r}, allowed: '{'|'.join(PRICE_KINDS)}:<model>:"
            "<width>x<rows>@<capacity>'"
            " with positive integers"
        )
    return m.group(1), m.group(2), int(m.group(3)), int(m.group(4)), int(m.group(5))


def check_prices(prices: Mapping[str, float], field: str = "prices") -> dict[str, float]:
    """`prices` (price key → seconds of one forward) checked: every key a `price_key`,
    every price a finite number ≥ 0; a one-line ValueError names the first bad entry."""
    out = {}
    for key, price in dict(prices).items():
        parse_price_key(key)
        ok = isinstance(price, (int, float, np.floating, np.integer)) and not isinstance(
            price, bool
        )
        if not ok or not (math.isfinite(float(price)) and float(price) >= 0):
            raise ValueError(
                f"{field}[{key!r}]: got {price!r}, allowed: a finite number of seconds ≥ 0"
            )
        out[str(key)] = float(price)
    return out


def itemised_seconds(
    priced: Mapping[str, Any], prices: Mapping[str, float]
) -> dict[str, np.ndarray]:
    """Predicted wall-clock seconds of a run: Σ counts × machine prices, itemised.

    The machine prices' counterpart of `itemised_cost`: where that prices work in verifier
    calls by the cost model, this prices the same run's forward passes at the seconds this
    machine measured for each shape (`specjax.measure.prices.measure_prices`), so that predicted ÷
    wall checks the cost model against the clock (SPEC §10).

    Args:
      priced: price key (`price_key`) → how many such forwards the run made (an array
        whose first axis may be the plan; fractional where a call's forwards are shared
        evenly among its rows, as its seconds are).
      prices: price key → seconds of one such forward (finite, ≥ 0); every key of
        `priced` must have one.

    Returns:
      ``'verify'`` and ``'draft'`` (seconds of the verifier's and the drafters' forwards),
      ``'round'`` (the rest of the engine calls' loop trips), ``'state'`` (the state
      programs) and ``'total'``, each shaped like the counts.
    """
    prices = check_prices(prices)
    shape = None
    out = {k: 0.0 for k in PRICE_KINDS}
    for key, counts in priced.items():
        kind = parse_price_key(key)[0]
        x = np.asarray(counts, np.float64)
        if np.any(x < 0) or not np.all(np.isfinite(x)):
            raise ValueError(f"itemised_seconds: priced[{key!r}] has negative or non-finite counts")
        if key not in prices:
            raise ValueError(
                f"itemised_seconds: no price for {key!r}; allowed: a prices table with every "
                f"priced key ({len(priced)} keys, {len(prices)} prices)"
            )
        shape = x.shape if shape is None else shape
        out[kind] = out[kind] + x * prices[key]
    out = {k: np.broadcast_to(np.asarray(v, np.float64), shape or ()) for k, v in out.items()}
    out["total"] = sum(out[k] for k in PRICE_KINDS)
    return out


# ---------------------------------------------------------------- uncertainty


def bootstrap_ci(
    units: int, statistic, n_resamples: int = 1000, level: float = 0.95, seed: int = 0
) -> tuple[float, float]:
    """Percentile bootstrap interval of `statistic` over resampled units (plans).

    Args:
      units: the number of units U (plans; with several seeds, a plan's seeds stay
        together, so a unit is a plan).
      statistic: f(idx: i64[U]) → float, the figure computed on the units `idx` (drawn
        with replacement); it must pool counts over the units (a ratio of sums), as the
        point estimate does.
      n_resamples / level / seed: resamples, coverage, and the resampling seed.

    Returns:
      (low, high); NaN where the statistic is undefined on most resamples.
    """
    if units < 1:
        return float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    vals = np.array(
        [statistic(rng.integers(0, units, units)) for _ in range(n_resamples)], np.float64
    )
    vals = vals[np.isfinite(vals)]
    if len(vals) < n_resamples / 2:
        return float("nan"), float("nan")
    a = (1.0 - level) / 2.0
    return float(np.quantile(vals, a)), float(np.quantile(vals, 1.0 - a))


def ratio_of_sums(num, den, idx=None) -> float:
    """Σ num / Σ den over the units `idx` (all units when None); NaN for a zero sum."""
    num, den = np.asarray(num, np.float64), np.asarray(den, np.float64)
    if idx is not None:
        num, den = num[idx], den[idx]
    d = den.sum()
    return float(num.sum() / d) if d else float("nan")


def speedup_interval(spec_calls, ar_calls, level: float = 0.95) -> tuple[float, float]:
    """Bootstrap interval of speculative ÷ autoregressive tokens/s over calls (a call's
    (tokens, seconds) rows, f[U, 2] each, paired by call): every resample pools the chosen
    calls' tokens and seconds for both, so it covers which prompts — and at τ > 0 which
    sample paths — were measured, not only timing noise."""
    spec_calls, ar_calls = np.asarray(spec_calls), np.asarray(ar_calls)

    def ratio(idx):
        spec = ratio_of_sums(spec_calls[:, 0], spec_calls[:, 1], idx)
        return spec / ratio_of_sums(ar_calls[:, 0], ar_calls[:, 1], idx)

    return bootstrap_ci(len(spec_calls), ratio, n_resamples=2000, level=level)


def kept_per_round(counters) -> tuple[float | None, float | None]:
    """(this rule's, rule 1's) expected drafts kept per round over `counters` (engine
    `Counters`, one per call): the one-chain rules' `kept_expected` and `kept_rule1` on
    the same blocks, ÷ rounds — None where the rule does not report them (multi-chain)."""
    rounds = sum(float(np.asarray(c.rounds).sum()) for c in counters)
    kept = sum(float(np.asarray(c.kept_expected).sum()) for c in counters)
    kept1 = sum(float(np.asarray(c.kept_rule1).sum()) for c in counters)
    if not rounds or not kept1:
        return None, None
    return kept / rounds, kept1 / rounds


# ------------------------------------------------------------------------- theory


def leviathan_expected_tokens(alpha, gamma) -> jax.Array:
    """Leviathan et al.'s expected tokens per verifier call, `(1 − α^{γ+1}) / (1 − α)`.

    Computed as `expm1((γ+1)·log α) / expm1(log α)`, which is accurate near α = 1; the
    α = 1 limit is γ + 1, and α = 0 gives 1 (the verifier's own token).

    Args:
        alpha: acceptance rate(s) in [0, 1].
        gamma: draft window(s) ≥ 0.
    """
    _check_range("leviathan_expected_tokens", "alpha", alpha, 0.0, 1.0)
    _check_range("leviathan_expected_tokens", "gamma", gamma, 0.0)
    alpha = _float(alpha)
    gamma = _float(gamma)
    one = alpha == 1.0
    safe = jnp.where(one, 0.5, alpha)
    log_alpha = jnp.log(safe)  # −inf at α = 0, where expm1 gives −1/−1 = 1.
    ratio = jnp.expm1((gamma + 1.0) * log_alpha) / jnp.expm1(log_alpha)
    return jnp.where(one, gamma + 1.0, ratio)


def leviathan_speedup(alpha, gamma, c) -> jax.Array:
    """Leviathan et al.'s expected wall-time speedup, `(1 − α^{γ+1}) / ((1 − α)(γc + 1))`.

    `c` is the drafter's cost per token relative to one verifier call.
    """
    _check_range("leviathan_speedup", "c", c, 0.0)
    return leviathan_expected_tokens(alpha, gamma) / (_float(gamma) * _float(c) + 1.0)


def hardware_aware_speedup(expected_tokens, t_step, t_draft, t_score, gamma) -> jax.Array:
    """Predicted speedup from measured times, `E · T_step / (γ · T_draft + T_score)`.

    Args:
        expected_tokens: E, committed tokens per round (measured or
            `leviathan_expected_tokens`).
        t_step: the verifier's one-token autoregressive step time.
        t_draft: the drafter's time per drafted token.
        t_score: the verifier's scoring pass over the γ + 1 block — not free on a CPU (2–3×
            a one-token step), which is why this replaces `γc + 1`.
        gamma: the draft window.
    """
    for name, value in (
        ("t_step", t_step),
        ("t_draft", t_draft),
        ("t_score", t_score),
        ("gamma", gamma),
        ("expected_tokens", expected_tokens),
    ):
        _check_range("hardware_aware_speedup", name, value, 0.0)
    return (_float(expected_tokens) * _float(t_step)) / (
        _float(gamma) * _float(t_draft) + _float(t_score)
    )


# ------------------------------------------------------------------------- distributions


def tv_distance(p, q) -> jax.Array:
    """Total variation distance `½ Σ_x |p(x) − q(x)|` over the last axis (batched).

    Args:
        p, q: f32[..., V] distributions of the same shape.

    Returns:
        f32[...], in [0, 1].
    """
    p, q = _float(p), _float(q)
    chex.assert_equal_shape([p, q])
    return 0.5 * jnp.sum(jnp.abs(p - q), axis=-1)


def alpha_from_distributions(p, q) -> jax.Array:
    """Expected acceptance of rejection sampling, `α = Σ_x min(p(x), q(x))` (= 1 − TV).

    Args:
        p: f32[..., V] the verifier's distribution; q: f32[..., V] the drafter's.

    Returns:
        f32[...], in [0, 1].
    """
    p, q = _float(p), _float(q)
    chex.assert_equal_shape([p, q])
    return jnp.sum(jnp.minimum(p, q), axis=-1)
