"""The engine: no retracing, per-round invariants, clear errors on bad input, greedy on the zoo."""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax import testing as suite
from specjax.engine import generate as gen
from specjax.engine import prefill as pre
from specjax.engine.autoregressive import autoregressive_generate
from specjax.engine.deployment import from_zoo
from specjax.engine.spec import DrafterSpec, EngineConfig, cross_vocab_maps
from specjax.errors import ConfigError
from specjax.models.synthetic import BigramLM

ZOO = Path(__file__).resolve().parents[1] / "specjax" / "zoo" / "manifest.json"


def _run(setup, cfg, n=16, seed=0, prompts=None, **kw):
    prompts = prompts or [[i % suite.V] for i in range(n)]
    dp = [[suite.drafter_prompts(p)[k] for p in prompts] for k in range(3)]
    return gen.speculative_generate(
        cfg,
        setup.verifier,
        setup.v_params,
        setup.drafters,
        setup.d_data,
        prompts,
        dp,
        gen.row_keys_for(seed, len(prompts)),
        **kw,
    )


def test_round_is_traced_once_per_shape():
    setup = suite.make_setup("random", seed=1)
    cfg = EngineConfig(
        gamma=3, rule="token_tree", verifier_temperature=1.0, n_slots=3, max_new_tokens=7
    )
    _run(setup, cfg, seed=0)
    size = gen.compiled_programs()
    for seed in range(1, 4):  # new values, same shapes: no retrace
        other = suite.make_setup("random", seed=10 + seed)
        _run(other, cfg, seed=seed)
    # New drafter temperatures / costs and a new verifier temperature: still no retrace.
    import dataclasses

    hot = dataclasses.replace(
        setup,
        drafters=tuple(
            dataclasses.replace(d, temperature=d.temperature + 0.3, cost=d.cost + 0.1)
            for d in setup.drafters
        ),
    )
    _run(hot, dataclasses.replace(cfg, verifier_temperature=0.5), seed=5)
    assert gen.compiled_programs() == size


@pytest.mark.parametrize(
    "rule,s",
    [("rejection", 1), ("block_verification", 1)]
    + [  # ~15 s per multi-slot rule
        pytest.param(r, 3, marks=pytest.mark.slow)
        for r in ("token_tree", "shared_block", "coupled", "coupled_block")
    ],
)
def test_committed_per_round_within_one_and_gamma_plus_one(rule, s):
    setup = suite.make_setup("random", seed=2)
    cfg = EngineConfig(gamma=4, rule=rule, verifier_temperature=1.0, n_slots=s, max_new_tokens=20)
    res = _run(setup, cfg, n=64)
    c = res.counters
    assert (c.committed == 20).all()
    assert (c.rounds >= 20 / 5).all() and (c.rounds <= 20).all()
    assert (c.from_draft <= 4 * c.rounds).all()
    assert (c.accepted <= c.proposed).all()


def test_stop_token_ends_a_row_and_is_kept():
    setup = suite.make_setup("random", seed=3)
    stop = np.zeros(suite.V, bool)
    stop[2] = True
    cfg = EngineConfig(
        gamma=3, rule="token_tree", verifier_temperature=1.0, n_slots=3, max_new_tokens=30
    )
    res = _run(setup, cfg, n=200, stop_table=stop)
    for i in range(200):
        new = res.new_tokens(i)
        assert 2 not in new[:-1]
        assert new[-1] == 2 or len(new) == 30


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(gamma=0), "gamma"),
        (dict(verifier_temperature=-0.5), "verifier_temperature"),
        (dict(rule="wholesale"), "rule"),
        (dict(max_new_tokens=0), "max_new_tokens"),
    ],
)
def test_bad_engine_config(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        EngineConfig(**kwargs)


def test_bad_inputs_fail_before_work():
    setup = suite.make_setup("random", seed=4)
    cfg = EngineConfig(gamma=2, rule="token_tree", n_slots=3, max_new_tokens=4)
    # A drafter at a negative temperature.
    import dataclasses

    bad = dataclasses.replace(
        setup,
        drafters=(dataclasses.replace(setup.drafters[0], temperature=-1.0),) + setup.drafters[1:],
    )
    with pytest.raises(ConfigError, match="temperature"):
        _run(bad, cfg)
    # NaN logits.
    nan = dataclasses.replace(
        setup, v_params={"table": setup.v_params["table"].at[0, 0].set(jnp.nan)}
    )
    with pytest.raises(ConfigError, match="NaN"):
        _run(nan, cfg)
    # A drafter that shares no token with the verifier.
    with pytest.raises(ConfigError, match="shares no token"):
        cross_vocab_maps(
            {"table": jnp.zeros((3, 3))}, np.full(3, -1), np.zeros((5, 1)), np.ones(5), 5
        )
    # Prompts longer than the verifier's context.
    small = dataclasses.replace(setup, verifier=BigramLM(suite.V, max_len=8))
    with pytest.raises(ConfigError, match="context"):
        _run(small, cfg, prompts=[[1] * 6])
    # An empty prompt.
    with pytest.raises(ConfigError, match="empty"):
        _run(setup, cfg, prompts=[[]])


@pytest.mark.slow  # three ~25 s compilations of the three-drafter zoo; `make test-all`
@pytest.mark.skipif(not ZOO.exists(), reason="the zoo is not built")
def test_greedy_equality_on_the_zoo():
    """The naive block, the token tree and rule 1 on the real zoo (cross-tokenizer drafters
        included) equal greedy decoding. (The coupled forms are greedy-tested on the synthetic
    suite in test_verify and through every policy in test_policy; each rule here costs a
    ~25 s compilation of the three-drafter zoo on this CPU.)"""
    from specjax.data import load_prompts
    from specjax.models.zoo import load_zoo

    dep = from_zoo(load_zoo(ZOO.parent))
    texts = [p["prompt"] for p in load_prompts()][::9][:6]
    v = [dep.encode(t) for t in texts]
    d = [[enc(t) for t in texts] for enc in dep.drafter_encode]
    keys = gen.row_keys_for(0, len(v))
    ref = autoregressive_generate(
        dep.verifier, dep.v_params, v, keys, temperature=0.0, max_new_tokens=24, bucket=64
    )
    for rule, s in (("shared_block", 3), ("token_tree", 3), ("rejection", 1)):
        for slot_rows in [[0, 1, 2]] if s == 3 else [[0], [1], [2]]:
            cfg = EngineConfig(
                gamma=4, rule=rule, verifier_temperature=0.0, n_slots=s, max_new_tokens=24
            )
            res = gen.speculative_generate(
                cfg,
                dep.verifier,
                dep.v_params,
                dep.drafters,
                dep.d_data,
                v,
                d,
                keys,
                slots=np.tile(slot_rows, (len(v), 1)),
                bucket=64,
            )
            for i in range(len(v)):
                assert res.new_tokens(i) == ref.new_tokens(i), (rule, slot_rows, i)


# ----------------------------------------------------------------------------------------
# Issue 10: one host round-trip per call, cache carrying, per-drafter γ, value checks
# ----------------------------------------------------------------------------------------


def test_one_transfer_each_way_per_call(monkeypatch):
    """Under transfer_guard('disallow') nothing moves implicitly; the only transfers are the
    call's one device_put (inputs) and one device_get (tokens + counters)."""
    import jax

    setup = suite.make_setup("random", seed=5)
    cfg = EngineConfig(
        gamma=2, rule="token_tree", verifier_temperature=1.0, n_slots=3, max_new_tokens=6
    )
    _run(setup, cfg, n=8)  # compiles; parameters checked finite (memoised)
    ar_kw = dict(temperature=1.0, max_new_tokens=6)
    autoregressive_generate(
        setup.verifier, setup.v_params, [[1]] * 8, gen.row_keys_for(0, 8), **ar_kw
    )
    calls = {"put": 0, "get": 0}
    put, get = jax.device_put, jax.device_get

    def counting_put(*a, **k):
        calls["put"] += 1
        return put(*a, **k)

    def counting_get(*a, **k):
        calls["get"] += 1
        return get(*a, **k)

    monkeypatch.setattr(jax, "device_put", counting_put)
    monkeypatch.setattr(jax, "device_get", counting_get)
    keys = gen.row_keys_for(0, 8)
    prompts = [[i % suite.V] for i in range(8)]
    dp = [[suite.drafter_prompts(p)[k] for p in prompts] for k in range(3)]
    calls.update(put=0, get=0)
    with jax.transfer_guard("disallow"):
        res = gen.speculative_generate(
            cfg, setup.verifier, setup.v_params, setup.drafters, setup.d_data, prompts, dp, keys
        )
        assert calls == {"put": 1, "get": 1}
        autoregressive_generate(setup.verifier, setup.v_params, [[1]] * 8, keys, **ar_kw)
        assert calls == {"put": 2, "get": 2}
    assert (res.length - res.start == 6).all() and res.seconds > 0


@pytest.mark.parametrize(
    "rule,s,temp", [("token_tree", 2, 0.0), pytest.param("coupled", 2, 1.0, marks=pytest.mark.slow)]
)
def test_carried_caches_continue_exactly(rule, s, temp):
    """Cache carrying (plan steps): continuing a returned state gives exactly what one
    call gives, for rules whose output depends on positions only (greedy, coupled), through
    transformer caches (verifier compaction, drafter rollback) and a fallback in between.
    (Budgets and temperatures are inputs, not compiled in: 3 programs per rule.)"""
    v, vp, specs, data = suite.tiny_transformers()
    prompts = [[1, 2, 3], [4, 5], [6], [7, 8, 9, 10]]
    dp = [prompts, prompts]
    keys = gen.row_keys_for(3, len(prompts))

    def run(n, state):
        cfg = EngineConfig(
            gamma=3, rule=rule, verifier_temperature=temp, n_slots=s, max_new_tokens=n
        )
        if state is None:
            return gen.speculative_generate(
                cfg, v, vp, specs, data, prompts, dp, keys, reserve=12 - n, return_state=True
            )
        return gen.speculative_generate(
            cfg, v, vp, specs, data, None, None, keys, state=state, return_state=True
        )

    whole = run(12, None)
    part = run(5, None)
    rest = run(7, part.state)
    np.testing.assert_array_equal(rest.start, part.length)
    for i in range(len(prompts)):
        assert part.new_tokens(i) + rest.new_tokens(i) == whole.new_tokens(i), (rule, i)
    # A fallback in between (the verifier alone continues the state, the drafters'
    # caches fall behind and catch up), then speculative again: still the same text.
    ar = autoregressive_generate(
        v,
        vp,
        None,
        keys,
        temperature=temp,
        max_new_tokens=4,
        coupled=rule == "coupled",
        state=part.state,
        return_state=True,
    )
    again = run(3, ar.state)
    for i in range(len(prompts)):
        assert part.new_tokens(i) + ar.new_tokens(i) + again.new_tokens(i) == whole.new_tokens(i), (
            rule,
            "fallback",
            i,
        )
    # Rows of a state (a plan's committed branch copied into its branch rows).
    pick = np.array([2, 2, 0, 3])
    sub = gen.speculative_generate(
        EngineConfig(gamma=3, rule=rule, verifier_temperature=temp, n_slots=s, max_new_tokens=7),
        v,
        vp,
        specs,
        data,
        None,
        None,
        keys[pick],
        state=part.state.rows(pick),
        return_state=True,
    )
    for j, i in enumerate(pick):
        assert sub.new_tokens(j) == rest.new_tokens(i), (rule, "rows", j)


def test_autoregressive_continues_exactly():
    v, vp, _, _ = suite.tiny_transformers()
    prompts = [[1, 2, 3], [4]]
    keys = gen.row_keys_for(7, 2)
    kw = dict(temperature=1.0)
    whole = autoregressive_generate(v, vp, prompts, keys, max_new_tokens=10, **kw)
    part = autoregressive_generate(
        v, vp, prompts, keys, max_new_tokens=4, reserve=6, return_state=True, **kw
    )
    rest = autoregressive_generate(v, vp, None, keys, max_new_tokens=6, state=part.state, **kw)
    for i in range(2):
        assert part.new_tokens(i) + rest.new_tokens(i) == whole.new_tokens(i)


def test_capacity_follows_the_call():
    """Caches are sized to the call, not to max_len; the output does not depend on it."""
    v, vp, specs, data = suite.tiny_transformers(max_len=256)
    prompts = [[1, 2, 3], [4, 5]]
    keys = gen.row_keys_for(1, 2)
    cfg = EngineConfig(gamma=2, rule="rejection", verifier_temperature=0.0, max_new_tokens=6)
    res = gen.speculative_generate(
        cfg, v, vp, specs[:1], data[:1], prompts, [prompts], keys, return_state=True
    )
    assert res.state.vcache.max_len < 32 and res.state.dcaches[0].max_len < 32
    ref = autoregressive_generate(v, vp, prompts, keys, temperature=0.0, max_new_tokens=6)
    for i in range(2):
        assert res.new_tokens(i) == ref.new_tokens(i)


@pytest.mark.parametrize("rule", ["rejection", "coupled", "block_verification"])
def test_per_drafter_gamma_is_lossless(rule):
    """γ_i per drafter (SPEC §2), rows of one chain: χ² against the exact target law (the
    statistical design of test_verify: N = 100,000 rows, α = 1e-3) and exact greedy."""
    import dataclasses
    import zlib

    from test_verify import ALPHA, LENGTH, START, chi2_pvalue

    from specjax.testing import sequence_distribution

    n = 100_000
    setup = suite.make_setup("random", seed=21)
    drafters = tuple(dataclasses.replace(d, gamma=g) for d, g in zip(setup.drafters, (1, 3, 2)))
    cfg = EngineConfig(
        gamma=2, rule=rule, verifier_temperature=1.0, n_slots=1, max_new_tokens=LENGTH
    )
    slots = (np.arange(n) % 3)[:, None]
    res = gen.speculative_generate(
        cfg,
        setup.verifier,
        setup.v_params,
        drafters,
        setup.d_data,
        [[START]] * n,
        [[p] * n for p in suite.drafter_prompts([START])],
        gen.row_keys_for(zlib.crc32(rule.encode()), n),
        slots=slots,
    )
    c = res.counters
    assert (c.proposed[:, 0] <= c.rounds).all()  # drafter 0 drafts 1 token per round
    per_round = c.committed / c.rounds
    windows = np.array([1, 3, 2])[slots[:, 0]]
    assert (per_round >= 1).all() and (per_round <= windows + 1).all()
    assert (c.own_reached_at[:, 0, 1:] == 0).all()  # positions drafter 0 never has
    exact = sequence_distribution(setup.v_table, 1.0, START, LENGTH)
    p = chi2_pvalue(res.tokens[:, 1 : 1 + LENGTH], exact)
    assert p >= ALPHA, f"χ² rejects per-drafter γ under {rule!r}: p = {p}"
    if rule == "coupled":  # drafter-invariant: the verifier's own Gumbel-max sample
        ar = autoregressive_generate(
            setup.verifier,
            setup.v_params,
            [[START]] * n,
            gen.row_keys_for(zlib.crc32(rule.encode()), n),
            temperature=1.0,
            max_new_tokens=LENGTH,
            coupled=True,
        )
        np.testing.assert_array_equal(res.tokens[:, : 1 + LENGTH], ar.tokens[:, : 1 + LENGTH])


def test_per_drafter_gamma_needs_one_chain_per_row():
    import dataclasses

    setup = suite.make_setup("random", seed=4)
    drafters = (dataclasses.replace(setup.drafters[0], gamma=2),) + setup.drafters[1:]
    bad = dataclasses.replace(setup, drafters=drafters)
    with pytest.raises(ConfigError, match="gamma"):
        _run(bad, EngineConfig(gamma=3, rule="token_tree", n_slots=3, max_new_tokens=4))
    with pytest.raises(ConfigError, match="gamma"):
        DrafterSpec("x", setup.drafters[0].lm, gamma=0).static and gen.speculative_generate(
            EngineConfig(max_new_tokens=2),
            setup.verifier,
            setup.v_params,
            (DrafterSpec("x", setup.drafters[0].lm, gamma=0),),
            setup.d_data[:1],
            [[1]],
            [[[1]]],
            gen.row_keys_for(0, 1),
        )


@pytest.mark.parametrize(
    "rule,s",
    [("token_tree", 2), ("rejection", 1)]
    + [
        pytest.param(r, 2, marks=pytest.mark.slow)
        for r in ("shared_block", "coupled", "coupled_block")
    ],
)
def test_value_checks_pass_in_the_code_paths(rule, s):
    """SPEC §9 value checks (committed length within [1, γ+1], caches rolled back, p and q
    distributions) traced in with `specjax.runtime.debug` on, on transformer caches, for every rule
    (`make test` runs the others with checks off; `make test-all` runs everything checked)."""
    from specjax.runtime import debug

    v, vp, specs, data = suite.tiny_transformers()
    prompts = [[1, 2, 3], [4, 5]]
    was = debug.enabled()
    debug.set_enabled(True)
    try:
        cfg = EngineConfig(
            gamma=3, rule=rule, verifier_temperature=1.0, n_slots=s, max_new_tokens=8
        )
        res = gen.speculative_generate(
            cfg, v, vp, specs[:s], data[:s], prompts, [prompts] * s, gen.row_keys_for(2, 2)
        )
        assert (res.length - res.start == 8).all()
    finally:
        debug.set_enabled(was)


def test_prefill_groups_layout():
    """Ragged prefill layout: sorted rows in ≤ 4 runs at their own widths, or None."""
    assert pre.prefill_groups([5, 9, 3], 16) is None  # too few rows
    assert pre.prefill_groups([40] * 8, 48) is None  # nothing to skip
    lens = [33, 0, 20, 1, 12, 2, 7, 4]
    assert pre.prefill_groups(lens, 34) == ((6, 16), (2, 34))
    assert pre.prefill_groups(lens, 34, bucket=32) is None  # quantum 32: 3/4 kept
    groups = pre.prefill_groups(np.arange(32) * 4, 128, bucket=16)
    assert sum(r for r, _ in groups) == 32 and [w for _, w in groups] == [32, 64, 96, 128]


def test_ragged_prefill_is_the_padded_one(monkeypatch):
    """Grouped prefill writes the same committed cache slots and last logits as one padded
    block, in the rows' own order; generate calls give the same tokens either way."""
    v, vp, specs, data = suite.tiny_transformers()
    prompts = [
        [(3 * i + j) % 31 + 1 for j in range(n)] for i, n in enumerate([34, 1, 21, 2, 13, 3, 8, 5])
    ]
    arr, plen = gen.pad_prompts(prompts)
    n = plen - 1
    groups = pre.prefill_groups(n, arr.shape[1])
    assert groups is not None and len(groups) > 1
    fill = jax.jit(pre.prefill_cache, static_argnums=(0, 4, 5))
    one, last1 = fill(v, vp, jnp.asarray(arr), jnp.asarray(n), 48, None)
    grp, last2 = fill(v, vp, jnp.asarray(arr), jnp.asarray(n), 48, groups)
    np.testing.assert_array_equal(grp.length, n)
    for r, m in enumerate(n):
        for k1, k2 in zip(one.k, grp.k):
            np.testing.assert_allclose(k2[r, ..., :m], k1[r, ..., :m], rtol=1e-5, atol=1e-6)
        for v1, v2 in zip(one.v, grp.v):
            np.testing.assert_allclose(v2[r, :, :m], v1[r, :, :m], rtol=1e-5, atol=1e-6)
        if m:
            np.testing.assert_allclose(last2[r], last1[r], rtol=1e-4, atol=1e-5)

    # Through the generate calls (greedy): the ragged AR and speculative programs give the
    # padded AR program's tokens.
    keys = gen.row_keys_for(5, len(prompts))

    def ar():
        res = autoregressive_generate(v, vp, prompts, keys, temperature=0.0, max_new_tokens=5)
        return [res.new_tokens(i) for i in range(8)]

    cfg = EngineConfig(gamma=3, rule="rejection", verifier_temperature=0.0, max_new_tokens=5)
    spec = gen.speculative_generate(cfg, v, vp, specs[:1], data[:1], prompts, [prompts], keys)
    ragged = ar()
    assert [spec.new_tokens(i) for i in range(8)] == ragged
    monkeypatch.setattr(pre, "PREFILL_GROUPS", 1)
    assert pre.prefill_groups(n, arr.shape[1]) is None
    assert ar() == ragged
