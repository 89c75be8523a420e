"""Continuous batching: each prompt's tokens equal its static batch's, programs stay bounded,
bad input is a one-line ConfigError.

The reference for a prompt is an ordinary static call (`speculative_generate` /
`autoregressive_generate`) with the prompt's row key and budget: one call per budget over
the whole queue. Exact table LMs (`specjax.testing`) make the sampled comparisons exact; a
tiny transformer checks the scattered KV caches under rule 'coupled' (Gumbel-max: an argmax,
so no f32 rounding of another batch shape can flip a token). Every configuration compiles
one chunk program, its refills and one reference program (the file runs in ~30 s).
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest

from specjax import testing as suite
from specjax.engine import generate as gen
from specjax.engine.autoregressive import autoregressive_generate
from specjax.engine.batching import continuous_generate, refill_sizes
from specjax.engine.spec import DrafterSpec, EngineConfig, cross_vocab_maps
from specjax.engine.state import EngineState
from specjax.errors import ConfigError
from specjax.models.synthetic import BigramLM

V = suite.V


def _queue(n: int, seed: int = 0, budgets=(7, 12)):
    rng = np.random.default_rng(seed)
    prompts = [[int(x) for x in rng.integers(0, V, rng.integers(1, 5))] for _ in range(n)]
    prompts[0] = [3, 4, 3, 4]  # the widest, in every queue, in every tokenisation
    return prompts, [budgets[i % len(budgets)] for i in range(n)], gen.row_keys_for(3, n)


def _stop(token: int = 3):
    stop = np.zeros(V, bool)
    stop[token] = True
    return stop


def _long_drafter(setup):
    """A drafter of another tokenizer spelling verifier tokens 3 and 4 in four pieces, so
    a round's committed tokens do not always fit one consume block (a static round then
    drafts before its drafter caught up)."""
    extra = 3
    to_v = np.concatenate([np.arange(V), [-1] * extra])
    retok = np.zeros((V, 4), np.int32)
    lens = np.ones(V, np.int32)
    for v in range(V):
        retok[v, 0] = v
        if v >= 3:
            retok[v] = [V, V + 1, V + 2, v]
            lens[v] = 4
    table = np.full((V + extra, V + extra), -1e4, np.float32)
    table[:, :V] = setup.v_table[np.minimum(np.arange(V + extra), V - 1)]  # q close to p
    data = cross_vocab_maps({"table": jnp.asarray(table)}, to_v, retok, lens, V)
    return (
        DrafterSpec("long", BigramLM(V + extra)),
        data,
        lambda p: [int(t) for v in p for t in retok[v, : lens[v]]],
    )


REF_ROWS = 10  # every static reference batch: one compiled program per configuration


def _reference(
    cfg,
    verifier,
    v_params,
    prompts,
    budgets,
    keys,
    stop,
    drafters=None,
    d_data=None,
    d_prompts=None,
    slots=None,
):
    """Per prompt, its tokens in a static batch with its row key and its budget.

    One static call per budget over the whole queue cycled to REF_ROWS rows (the rows of
    other budgets are ignored), with `min_width` / `reserve` fixing the shapes: the
    reference compiles once per configuration, whatever the queue."""
    n = len(prompts)
    rows = [i % n for i in range(max(n, REF_ROWS))]
    top = max(budgets)
    kw = dict(min_width=4, reserve=0, stop_table=stop)
    out, counts = [None] * n, [None] * n
    for b in sorted(set(budgets)):
        kw["reserve"] = top - b
        if drafters is None:
            res = autoregressive_generate(
                verifier,
                v_params,
                [prompts[i] for i in rows],
                keys[rows],
                temperature=cfg.verifier_temperature,
                max_new_tokens=b,
                coupled=cfg.rule in ("coupled", "coupled_block"),
                **kw,
            )
        else:
            res = gen.speculative_generate(
                dataclasses.replace(cfg, max_new_tokens=b),
                verifier,
                v_params,
                drafters,
                d_data,
                [prompts[i] for i in rows],
                [[dp[i] for i in rows] for dp in d_prompts],
                keys[rows],
                slots=None if slots is None else slots[rows],
                drafter_min_width=[8] * len(drafters),
                **kw,
            )
        for i in range(n):
            if budgets[i] == b:
                out[i] = res.new_tokens(i)
                if drafters is not None:
                    c = res.counters
                    counts[i] = tuple(np.asarray(x)[i] for x in (c.rounds, c.accepted))
    return out, counts


def _check(cfg, verifier, v_params, prompts, budgets, keys, stop, batch, chunk, **spec):
    res = continuous_generate(
        cfg,
        verifier,
        v_params,
        prompts,
        keys,
        batch=batch,
        chunk=chunk,
        max_new_tokens=budgets,
        stop_table=stop,
        **spec,
    )
    ref, counts = _reference(
        cfg,
        verifier,
        v_params,
        prompts,
        budgets,
        keys,
        stop,
        spec.get("drafters"),
        spec.get("d_data"),
        spec.get("drafter_prompts"),
        spec.get("slots"),
    )
    for i in range(len(prompts)):
        assert res.tokens[i] == ref[i], (i, res.tokens[i], ref[i])
    assert (res.committed == [len(t) for t in ref]).all()
    for i, c in enumerate(counts):  # the drafters' states moved exactly too
        if c is not None:
            assert res.rounds[i] == c[0] and (res.accepted[i] == c[1]).all(), (i, c)
    assert res.committed.sum() > 0 and res.seconds > 0 and res.wall_seconds >= res.seconds
    return res


# ----------------------------------------------------------------------------------------
# 1. Each prompt's tokens are its static batch's
# ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("n,batch,chunk", [(10, 3, 4), (2, 3, 5)])
def test_verifier_alone_equals_static(n, batch, chunk):
    setup = suite.make_setup("random", seed=1)
    prompts, budgets, keys = _queue(n)
    cfg = EngineConfig(verifier_temperature=1.0)
    res = _check(cfg, setup.verifier, setup.v_params, prompts, budgets, keys, _stop(), batch, chunk)
    assert (res.rounds == res.committed).all() and res.proposed.shape == (n, 0)
    lens = res.committed
    if n > batch:  # ragged: some prompts stop early, some run to their budget
        assert (lens < np.array(budgets)).any() and (lens == np.array(budgets)).any()
        assert res.refills > 1


def _long_case(n: int, seed: int = 0):
    setup = suite.make_setup("random", seed=1)
    prompts, budgets, keys = _queue(n, seed, budgets=(19, 24))
    spec, data, spell = _long_drafter(setup)
    return (
        setup,
        prompts,
        budgets,
        keys,
        dict(drafters=[spec], d_data=[data], drafter_prompts=[[spell(p) for p in prompts]]),
    )


def test_one_drafter_equals_static():
    """Rule 'rejection' (the default), one drafter of another tokenizer whose spellings
    (up to four pieces) do not always fit a round's consume block, so a static round may
    draft before its drafter caught up: a chunk boundary must leave every continuing row
    exactly where a static call's next round finds it. (With chunks cut at a token count
    instead of a round boundary, prompts here come out differently.)"""
    setup, prompts, budgets, keys, spec = _long_case(10)
    cfg = EngineConfig(gamma=3, verifier_temperature=1.0)
    res = _check(cfg, setup.verifier, setup.v_params, prompts, budgets, keys, None, 3, 5, **spec)
    assert (res.accepted <= res.proposed).all() and res.proposed.sum() > 0
    assert (res.rounds <= res.committed).all() and res.chunks >= 2


@pytest.mark.parametrize("n,batch", [pytest.param(10, 3, marks=pytest.mark.slow), (2, 3)])
def test_token_tree_two_slots_equals_static(n, batch):
    """Two drafters of two other tokenizers, two slots per row routed per prompt (one
    prompt in three leaves its second slot empty)."""
    setup = suite.make_setup("random", seed=1)
    prompts, budgets, keys = _queue(n)
    slots = np.array([[[0, 1], [1, 0], [1, -1]][i % 3] for i in range(n)], np.int32)
    cfg = EngineConfig(gamma=3, rule="token_tree", verifier_temperature=1.0, n_slots=2)
    dp = [[suite.drafter_prompts(p)[k] for p in prompts] for k in (1, 2)]
    res = _check(
        cfg,
        setup.verifier,
        setup.v_params,
        prompts,
        budgets,
        keys,
        _stop(),
        batch,
        4,
        drafters=setup.drafters[1:],
        d_data=setup.d_data[1:],
        drafter_prompts=dp,
        slots=slots,
    )
    assert (res.proposed.sum(1) > 0).all()


def test_transformer_caches_are_scattered_exactly():
    """KV caches through refills and pauses (the verifier's, a drafter's): rule 'coupled'
    against static batches."""
    v, vp, specs, data = suite.tiny_transformers(verifier_layers=1)
    rng = np.random.default_rng(1)
    n = 6
    prompts = [[int(x) for x in rng.integers(1, 32, rng.integers(1, 5))] for _ in range(n)]
    budgets = [6, 11] * 3
    keys = gen.row_keys_for(5, n)
    stop = np.zeros(32, bool)
    stop[[3, 7, 11]] = True
    cfg = EngineConfig(gamma=3, rule="coupled", verifier_temperature=1.0)
    res = _check(
        cfg,
        v,
        vp,
        prompts,
        budgets,
        keys,
        stop,
        2,
        4,
        drafters=specs[:1],
        d_data=data[:1],
        drafter_prompts=[prompts],
    )
    assert res.refills > 1


def test_set_rows_inverts_rows():
    """`EngineState.set_rows` writes rows of every field, caches included (indices ≥ B
    are padding, dropped)."""
    import jax

    from specjax.models.cache import Cache, PerLayer

    rng = np.random.default_rng(0)

    def cache(b):
        kv = lambda: PerLayer(
            jnp.asarray(rng.standard_normal((b, 2, 6, 4)), jnp.float32) for _ in range(2)
        )
        return Cache(k=kv(), v=kv(), length=jnp.asarray(rng.integers(0, 6, b), jnp.int32))

    def state(b):
        return EngineState(
            tokens=jnp.asarray(rng.integers(0, 9, (b, 7)), jnp.int32),
            length=jnp.asarray(rng.integers(1, 7, b), jnp.int32),
            vcache=cache(b),
            dcaches=(cache(b),),
            dsynced=jnp.asarray(rng.integers(0, 7, (1, b)), jnp.int32),
            dlogits=(jnp.asarray(rng.standard_normal((b, 5)), jnp.float32),),
        )

    s, new = state(4), state(3)
    out = s.set_rows(np.array([2, 4, 0]), new)  # row 4 ≥ B: dropped
    want = [
        new.rows(np.array([2])),
        s.rows(np.array([1])),
        new.rows(np.array([0])),
        s.rows(np.array([3])),
    ]
    for r, w in enumerate(want):
        for a, b in zip(jax.tree.leaves(out.rows(np.array([r]))), jax.tree.leaves(w)):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


# ----------------------------------------------------------------------------------------
# 2. Bounded programs
# ----------------------------------------------------------------------------------------


def test_programs_do_not_grow_with_the_queue():
    """N = 6 and N = 12 (same widest prompt, same largest budget) compile the same
    programs: at most one chunk program and one refill per `refill_sizes(B)`. (The shapes
    are `test_one_drafter_equals_static`'s: run after it, N = 6 compiles nothing either.)"""
    cfg = EngineConfig(gamma=3, verifier_temperature=1.0)
    counts = []
    for n in (6, 12):
        setup, prompts, budgets, keys, spec = _long_case(n, seed=n)
        before = gen.compiled_programs()
        res = continuous_generate(
            cfg,
            setup.verifier,
            setup.v_params,
            prompts,
            keys,
            batch=3,
            chunk=4,
            max_new_tokens=budgets,
            **spec,
        )
        counts.append(gen.compiled_programs() - before)
        assert res.programs == 1 + len(refill_sizes(3))
        assert counts[-1] <= res.programs
        assert len(res.tokens) == n and res.refills > 1
    assert counts[1] == 0, counts
    assert refill_sizes(1) == (1,) and refill_sizes(8) == (1, 2, 4, 8)
    assert refill_sizes(6) == (1, 2, 4, 6)


# ----------------------------------------------------------------------------------------
# 3. Bad input: one line naming the field, the value and what is allowed, before any work
# ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(chunk=0), r"chunk: got 0; allowed: an integer ≥ 1"),
        (dict(chunk=2.5), r"chunk: got 2\.5; allowed"),
        (dict(batch=0), r"batch: got 0; allowed: an integer ≥ 1"),
        (dict(max_new_tokens=[4, 0]), r"max_new_tokens\[1\]: got 0; allowed"),
        (dict(max_new_tokens=[4]), r"max_new_tokens: got 1 budgets for 2 prompts; allowed"),
        (
            dict(prompts=[[1], [1, 2, 3, 4, 1, 2]]),
            r"prompts\[1\]: got 6 tokens.*allowed: ≤ "
            r"the verifier's max_len = 8",
        ),
        (dict(prompts=[[1], []]), r"prompts\[1\]: got an empty prompt; allowed"),
        (dict(prompts=[]), r"prompts: got an empty queue; allowed"),
        (dict(drafters=()), r"drafters: got none; allowed"),
    ],
)
def test_bad_input(kwargs, match):
    setup = suite.make_setup("random", seed=1)
    small = BigramLM(V, max_len=8)
    args = dict(prompts=[[1], [2, 3]], batch=2, chunk=2, max_new_tokens=4)
    args.update(kwargs)
    prompts = args.pop("prompts")
    before = gen.compiled_programs()
    with pytest.raises(ConfigError, match=match) as e:
        continuous_generate(
            EngineConfig(),
            small,
            setup.v_params,
            prompts,
            gen.row_keys_for(0, max(len(prompts), 1)),
            **args,
        )
    assert "\n" not in str(e.value)
    assert gen.compiled_programs() == before


def test_catch_up_forwards_are_the_engines_count():
    """`Counters.catchups`: the forwards a drafter ran before the first round to consume the
    committed tokens it missed (here a verifier-only continuation), per row, as a host
    simulation of the consume block says: whole tokens, ≤ γ + 1 per forward, while their
    pieces fit the block (four-piece spellings do not always fit, so more forwards than
    ⌈behind / (γ + 1)⌉)."""
    from specjax.engine.decode import consume_width

    setup, prompts, _, keys, spec = _long_case(4)
    cfg = EngineConfig(gamma=2, verifier_temperature=1.0, max_new_tokens=3)
    first = gen.speculative_generate(
        cfg,
        setup.verifier,
        setup.v_params,
        spec["drafters"],
        spec["d_data"],
        prompts,
        spec["drafter_prompts"],
        keys,
        reserve=15,
        return_state=True,
    )
    ar = autoregressive_generate(
        setup.verifier,
        setup.v_params,
        None,
        keys,
        temperature=1.0,
        max_new_tokens=9,
        state=first.state,
        return_state=True,
    )
    tokens, length = np.asarray(ar.state.tokens), np.asarray(ar.state.length)
    synced = np.asarray(ar.state.dsynced)[0]
    lens = np.asarray(spec["d_data"][0].retok_len)
    w = consume_width(int(spec["d_data"][0].retok.shape[1]), cfg.gamma + 1)
    want = []
    for r in range(len(prompts)):
        pieces, passes, i = lens[tokens[r, synced[r] : length[r]]], 0, 0
        while i < len(pieces):
            i += int((np.cumsum(pieces[i : i + cfg.gamma + 1]) <= w).sum())
            passes += 1
        want.append(passes)
    again = gen.speculative_generate(
        cfg,
        setup.verifier,
        setup.v_params,
        spec["drafters"],
        spec["d_data"],
        None,
        None,
        keys,
        state=ar.state,
    )
    got = np.asarray(again.counters.catchups)[:, 0]
    np.testing.assert_array_equal(got, want)
    behind = length - synced
    assert (got >= -(-behind // (cfg.gamma + 1))).all() and (got > -(-behind // 3)).any()
    assert (np.asarray(first.counters.catchups) == 0).all()  # a fresh prefill: none


def test_first_differences():
    """`evaluation.first_differences` on a tiny verifier: the first position where two
    token lists part, both tokens' probabilities and cumulative places under the verifier's
    law after prompt + common prefix (τ 1; τ 0 reports that same law), and a row that only
    ends earlier."""
    from specjax.measure.evaluation import first_differences  # pylint: disable=import-outside-toplevel
    from specjax.models.api import TransformerLM  # pylint: disable=import-outside-toplevel
    from specjax.models.transformer import (  # pylint: disable=import-outside-toplevel
        TransformerConfig,
    )

    cfg = TransformerConfig(
        vocab_size=16, d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=32, max_len=16
    )
    lm = TransformerLM(cfg)
    params = lm.init_params(0)
    want, got = [[4, 5, 6], [7, 8]], [[4, 9, 6], [7, 8, 2]]
    diffs = first_differences(lm, params, [[1, 2, 3], [4, 5]], want, got, 1.0)
    assert [(d["prompt"], d["position"], d["lengths"]) for d in diffs] == [
        (0, 1, [3, 3]),
        (1, 2, [2, 3]),
    ]
    assert diffs[0]["tokens"] == [5, 9] and "tokens" not in diffs[1]
    logits = np.asarray(lm.logits_full(params, np.asarray([[1, 2, 3, 4]], np.int32)))[0, -1]
    p = np.exp(logits - logits.max()) / np.exp(logits - logits.max()).sum()
    np.testing.assert_allclose(diffs[0]["p"], [p[5], p[9]], rtol=1e-5)
    np.testing.assert_allclose(diffs[0]["cdf"], [p[:6].sum(), p[:10].sum()], rtol=1e-5)
    greedy = first_differences(lm, params, [[1, 2, 3], [4, 5]], want, got, 0.0)
    assert greedy[0]["p"] == diffs[0]["p"]
