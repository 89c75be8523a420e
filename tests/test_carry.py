"""Plan state carried across steps (specjax.policy.plan_state): the carried caches are the
caches a fresh prefill of the committed tokens makes, drafters behind the text catch up,
a step costs its own tokens, and a run compiles a bounded set of programs."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax.engine.prefill import prefill
from specjax.engine.programs import compiled_programs
from specjax.policy import plan_state
from specjax.policy.engine_calls import commit_carried, plan_keys, run_carried
from specjax.policy.plan import run_plans
from specjax.policy.plan_config import PlanConfig
from specjax.policy.switches import Policy


@pytest.fixture(scope="module")
def dep():
    from specjax.testing import tiny_transformer_deployment

    return tiny_transformer_deployment(max_len=128)


def _filled(cache, row, n):
    """Row `row`'s first n slots of every layer's K ([B, KV, hd, S]) and V ([B, KV, S, hd])."""
    return [np.asarray(x[row, :, :, :n]) for x in cache.k] + [
        np.asarray(x[row, :, :n]) for x in cache.v
    ]


def _assert_cache_rows(cache, rows, fresh, n):
    for r, (row, want) in enumerate(zip(rows, n)):
        got = _filled(cache, row, want)
        ref = _filled(fresh, r, want)
        for a, b in zip(got, ref):
            np.testing.assert_allclose(a, b, atol=2e-5, rtol=1e-5)
        assert int(cache.length[row]) == want


@pytest.mark.slow  # CI time (make test ≤ 15 min on a cold clone); `make test-all` runs it
def test_carried_caches_equal_a_fresh_prefill_of_the_committed_tokens(dep):
    texts = ["def f(x):", "In the beginning", "1 + 2 ="]
    cfg = PlanConfig(gamma=2, verifier_temperature=1.0, plan_steps=2, max_step_tokens=6, bucket=16)
    states = plan_state.PlanStates(
        dep, texts, [dep.encode(t) for t in texts], steps=2, gamma=2, max_step_tokens=6, bucket=16
    )
    # Step 0: plan 0 runs drafter 'same', plan 1 both (token tree), plan 2 'other'.
    sets = [(0,), (0, 1), (1,)]
    res = run_carried(states, dep, cfg, "token_tree", sets, [0, 1, 2], plan_keys(0, [0, 1, 2], 0))
    assert [r for r in res.prefills] == [(0,), (0, 1), (1,)]  # first use: prefilled
    commit_carried(states, res, [0, 1, 2], {0: 0, 1: 1, 2: 2}, {p: res.tokens[p] for p in range(3)})
    for p in range(3):
        assert states.hist[p] == dep.encode(texts[p]) + list(res.tokens[p])
        assert len(res.tokens[p]) > 0
    # The verifier's carried cache = a fresh prefill of every committed token but the last.
    n = [len(h) - 1 for h in states.hist]
    fresh, _, _ = prefill(dep.verifier, dep.v_params, states.hist, capacity=states.v_cap, cached=n)
    _assert_cache_rows(states.v.vcache, range(3), fresh, n)
    np.testing.assert_array_equal(np.asarray(states.v.length), [len(h) for h in states.hist])
    # Drafter 'same' ran for plan 0: its cache holds the text it synced (every committed
    # token but those of the last round, which it consumes next).
    synced = int(states.synced[0][0])
    assert len(dep.encode(texts[0])) <= synced <= len(states.hist[0])
    fresh_d, _, _ = prefill(
        dep.drafters[0].lm, dep.d_data[0].params, [states.hist[0][:synced]], capacity=64
    )
    got = states.d[0]
    _assert_cache_rows(got.cache, [0], fresh_d, [int(got.cache.length[0])])
    # Plan 2 never ran 'same': not prefilled; plan 0 never ran 'other'.
    assert states.synced[0][2] < 0 and states.synced[1][0] < 0

    # Step 1: every plan runs 'same'. Plan 2 prefills it (its prompt) and catches up on the
    # committed step; the others are at most one round behind.
    res2 = run_carried(
        states, dep, cfg, "token_tree", [(0,)] * 3, [0, 1, 2], plan_keys(0, [0, 1, 2], 1)
    )
    assert res2.prefills == [(), (), (0,)]
    catchups = np.asarray(res2.counters.catchups)[:, 0]
    assert catchups[2] == -(-len(res.tokens[2]) // 3)  # the engine's count, one per γ + 1
    assert (catchups[:2] <= 1).all()  # the others: at most one round
    commit_carried(
        states, res2, [0, 1, 2], {0: 0, 1: 1, 2: 2}, {p: res2.tokens[p] for p in range(3)}
    )
    n = [len(h) - 1 for h in states.hist]
    fresh, _, _ = prefill(dep.verifier, dep.v_params, states.hist, capacity=states.v_cap, cached=n)
    _assert_cache_rows(states.v.vcache, range(3), fresh, n)


def test_a_step_costs_its_own_tokens_and_runs_compile_once(dep):
    cfg = PlanConfig(
        gamma=2,
        verifier_temperature=1.0,
        plan_steps=3,
        max_step_tokens=5,
        bucket=16,
        rule="coupled",
    )
    ref, st = run_plans(dep, cfg, ["def f(x):", "In the"], policy=Policy.naive())
    # One verifier prefill per plan, whatever the steps; each drafter prefilled at most
    # once per plan, the rest are catch-up passes.
    assert st.counts["verifier_prefills"].tolist() == [1, 1] and st.steps == 6
    ar, st_ar = run_plans(dep, cfg, ["def f(x):", "In the"])
    assert ar == ref  # coupled: every policy commits the verifier's sample
    assert st_ar.counts["verifier_calls"].sum() == st_ar.tokens
    before = compiled_programs()  # engine calls, prefills and state gathers/commits
    run_plans(dep, cfg, ["x = 1", "Once upon"], policy=Policy.naive())
    assert compiled_programs() == before  # same shapes: nothing recompiles


@pytest.mark.slow  # ~25 s; γ_i is also tested for losslessness in test_engine
def test_per_drafter_gamma_in_one_chain_rows(dep):
    cfg = PlanConfig(gamma=2, verifier_temperature=1.0, plan_steps=2, max_step_tokens=12, bucket=16)
    own = dep.with_gammas([5, None])
    _, st = run_plans(own, cfg, ["def f(x):", "In the"], single=0)
    proposed = int(st.counts["proposed"].sum(0)[0])
    assert 2 * st.rounds < proposed <= 5 * st.rounds  # drafts γ_0 = 5, not the config's 2
    assert st.verifier_tokens == 5 * st.rounds
    # Drafters sharing a block draft the config's γ (no error for their unequal γ_i).
    _, st2 = run_plans(own, cfg, ["def f(x):", "In the"], policy=Policy.naive())
    assert st2.verifier_tokens == 2 * 2 * st2.rounds


def test_the_program_cache_is_bounded(monkeypatch):
    from specjax.engine import programs as gen

    monkeypatch.setattr(gen, "_MAX_PROGRAMS", 2)

    @jax.jit
    def f(x):
        return x + 1

    before = gen.compiled_programs()
    for n in (1, 2, 3, 2):
        gen.run_program(f, {}, (jnp.zeros((n,)),))
    # Three shapes compiled; only the two most recent are kept; the last call hit.
    assert gen.compiled_programs() - before == 3 and gen.cached_programs() == 2


def test_a_programs_first_execution_is_never_timed(monkeypatch):
    """`run_program` runs a freshly compiled executable once, untimed, before its first
    timed execution (the first-execution effect), once per executable; a donating program
    is warmed on copies of its arguments, so the timed run still gets live buffers."""
    from specjax.engine import programs as gen

    monkeypatch.setattr(gen, "_WARM", True)
    calls = []

    def count(x):
        calls.append(1)
        return x

    @jax.jit
    def f(x):
        return jax.pure_callback(count, jax.ShapeDtypeStruct(x.shape, x.dtype), x) + 1

    warmed = gen.warmed_programs()
    x = jnp.arange(3.0)
    out, secs = gen.run_program(f, {}, (x,))
    assert len(calls) == 2 and gen.warmed_programs() == warmed + 1 and secs >= 0
    gen.run_program(f, {}, (x,))
    assert len(calls) == 3  # warm already: timed once, no second warm-up
    g = jax.jit(lambda x: x * 2, donate_argnums=0)
    out, _ = gen.run_program(g, {}, (jnp.arange(4.0),))
    assert out.tolist() == [0.0, 2.0, 4.0, 6.0] and gen.warmed_programs() == warmed + 2


def test_program_memory_is_released_under_mapping_pressure(monkeypatch):
    """Executables an evicted program leaves in JAX's in-memory caches are freed when the
    process nears its memory-mapping limit (XLA:CPU code lives in mappings; a sweep that
    never freed them died of "Cannot allocate memory" in LLVM)."""
    from specjax.engine import programs as gen

    if gen._map_count() is None:
        pytest.skip("no /proc/self/maps on this platform")

    @jax.jit
    def f(x):
        for i in range(6):
            x = jnp.sin(x) @ jnp.ones((x.shape[-1], x.shape[-1])) + i
        return x

    def grow(widths):
        start = gen._map_count()
        for n in widths:
            gen.run_program(f, {}, (jnp.zeros((2, n)),))
        return gen._map_count() - start

    monkeypatch.setattr(gen, "_MAX_PROGRAMS", 1)  # evicted at once, never freed ...
    monkeypatch.setattr(gen, "_MAP_SHARE", float("inf"))
    kept = grow(range(3, 11))
    if kept < 16:
        pytest.skip(f"this XLA build keeps {kept} mappings for 8 executables: nothing to free")
    releases = gen._RELEASES[0]
    monkeypatch.setattr(gen, "_MAP_SHARE", 0.0)  # ... unless under pressure
    freed = grow(range(11, 19))
    assert gen._RELEASES[0] - releases == 8 and gen.cached_programs() == 1
    assert freed < kept / 2, (kept, freed)


def test_padded_count_is_small_and_bounded():
    got = {n: plan_state.padded_count(n) for n in (1, 2, 3, 4, 5, 8, 9, 12, 13, 36)}
    assert got == {1: 1, 2: 2, 3: 4, 4: 4, 5: 8, 8: 8, 9: 12, 12: 12, 13: 16, 36: 36}
    assert plan_state.padded_rows([7, 3, 5]) == [7, 3, 5, 7]


@pytest.mark.parametrize("coupled", [True, False])
def test_a_fallback_of_some_plans_runs_their_rows_only_and_commits_the_same_tokens(dep, coupled):
    """The verifier alone on a subset of plans (a fallback) gathers their rows into a call
    of `padded_count` rows: the tokens it commits and the carried state it leaves are the
    ones the whole-batch call (every plan's row) gives those plans."""
    from specjax.policy.engine_calls import autoregressive_carried

    texts = ["def f(x):", "In the beginning", "1 + 2 =", "x"]
    cfg = PlanConfig(
        gamma=2, verifier_temperature=1.0, plan_steps=1, max_step_tokens=6, bucket=16,
        rule="coupled" if coupled else None,
    )  # fmt: skip

    def states():
        return plan_state.PlanStates(
            dep, texts, [dep.encode(t) for t in texts], steps=1, gamma=2, max_step_tokens=6,
            bucket=16,
        )  # fmt: skip

    keys = plan_keys(0, [0, 1, 2, 3], 0, fallback=not coupled)
    whole = states()
    new_all, _, priced_all = autoregressive_carried(whole, dep, cfg, [0, 1, 2, 3], keys)
    some = states()
    new, secs, priced = autoregressive_carried(some, dep, cfg, [2, 0], keys[[2, 0]])
    assert new == {2: new_all[2], 0: new_all[0]} and secs > 0
    for p in range(4):
        want = whole.hist[p] if p in (0, 2) else [*dep.encode(texts[p])]
        assert some.hist[p] == want
    np.testing.assert_array_equal(np.asarray(some.v.length), [len(h) for h in some.hist])
    # Priced as a 2-row loop (its forwards and the rest of its trips) and its state programs.
    rows = {k.split(":")[0]: k.split(":")[2].split("@")[0] for k in priced}
    assert rows["verify"] == "1x2" and rows["round"] == "1x2"
    assert {k.split(":")[1].split(".")[0] for k in priced if k.startswith("state:")} == {
        "gather",
        "commit",
    }
    assert any(k.startswith("verify:verifier:1x4@") for k in priced_all)
