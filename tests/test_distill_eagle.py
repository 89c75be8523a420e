"""Training the feature drafter (`specjax.train.distill_eagle`) on a tiny verifier: its
features, its data files with verifier states, the time-budgeted schedule, and α rising
with training. The drafter's cache path, losslessness and greedy equality are
tests/test_eagle.py's."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from test_eagle import TINY, V, _verifier


def _random_features(v_lm, v_params, rows: int, width: int, seed: int):
    """(`Features` of random full-width rows, prompts of 2 tokens; the verifier's f32 final
    features over them)."""
    from specjax.train import distill_eagle  # pylint: disable=import-outside-toplevel

    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, v_lm.vocab_size, (rows, width)).astype(np.int32)
    _, feats = v_lm.hidden_full(v_params, jnp.asarray(tokens))
    data = distill_eagle.Features(
        tokens=tokens,
        length=np.full(rows, width, np.int32),
        prompt_len=np.full(rows, 2, np.int32),
        feats=np.asarray(feats, np.float16),
    )
    return data, feats


def test_training_on_the_verifiers_features_raises_alpha():
    """`distill_eagle` end to end on a tiny verifier: features of its own generations,
    60 training steps, held-out α at step 1 and 2 above the untrained drafter's."""
    import types  # pylint: disable=import-outside-toplevel

    from specjax.train import distill, distill_eagle  # pylint: disable=import-outside-toplevel

    v_lm, v_params = _verifier(TINY, seed=5, sharpen=2.0)
    hexes = types.SimpleNamespace(encode=lambda t: [int(c, 16) for c in t])  # ids 0..11
    model = types.SimpleNamespace(lm=v_lm, params=v_params, tokenizer=hexes, eos_id=None)
    rng = np.random.default_rng(0)

    def gen(n, seed):
        prompts = ["".join("%x" % i for i in rng.integers(0, 12, 3)) for _ in range(n)]
        return distill.generate(
            model,
            prompts,
            new_tokens=24,
            batch=8,
            temperature=1.0,
            top_k=4,
            seed=seed,
            log=lambda s: None,
        )

    train = distill_eagle.verifier_features(model, gen(32, 0), bucket=16, log=lambda s: None)
    held = distill_eagle.verifier_features(model, gen(8, 1), bucket=16, log=lambda s: None)
    recipe = distill_eagle.EagleRecipe(kept=12, steps=60, batch=8, learning_rate=3e-3, warmup=5)
    lm, params = distill_eagle.initial_eagle(model, train, recipe, max_len=64)
    before = distill_eagle.feature_alpha(lm, params, held)
    params, hist = distill_eagle.train_eagle(lm, params, train, recipe, log=lambda s: None)
    after = distill_eagle.feature_alpha(lm, params, held)
    assert hist["loss"][-1][1] < hist["loss"][0][1]
    assert hist["steps_run"] == hist["schedule_steps"] == recipe.steps
    assert after["alpha1"] > before["alpha1"] + 0.05, (before, after)
    assert after["alpha2"] > before["alpha2"], (before, after)


def test_a_time_budget_sizes_the_schedule(monkeypatch):
    """With a time budget the cosine schedule is sized to the run's pace: a budget far too
    short for the steps asked ends the run at the schedule's end (its learning rate decayed
    to a tenth), not mid-schedule. The run's clock counts its own readings (one second
    each), so the verdict counts steps, never the machine's speed or load."""
    import types  # pylint: disable=import-outside-toplevel

    from specjax.train import distill_eagle  # pylint: disable=import-outside-toplevel

    v_lm, v_params = _verifier(TINY, seed=5)
    data, _ = _random_features(v_lm, v_params, rows=16, width=12, seed=1)
    recipe = distill_eagle.EagleRecipe(kept=6, steps=10_000, batch=4, warmup=2)
    model = types.SimpleNamespace(lm=v_lm, params=v_params, tokenizer=None)
    lm, params = distill_eagle.initial_eagle(model, data, recipe, max_len=16)
    monkeypatch.setattr(distill_eagle, "_RATE_PROBE", 5)
    rates = []  # (step, the schedule's length) of every learning rate the run read
    real = distill_eagle.lr_schedule

    def spy(r, steps=None):
        sched = real(r, steps)
        return lambda s: rates.append((s, steps)) or sched(s)

    monkeypatch.setattr(distill_eagle, "lr_schedule", spy)
    readings = iter(range(1_000_000))
    _, hist = distill_eagle.train_eagle(
        lm, params, data, recipe, time_budget_s=8.0, log=str, clock=lambda: float(next(readings))
    )
    # Readings: t0, then per step a budget check, plus a log line at step 0 and the pace
    # probe at step 5 (7 s over 5 steps: 0.95 * 8 / 1.4 -> 5 steps, at least 6).
    assert hist["steps_run"] == hist["schedule_steps"] == 6 < recipe.steps
    s, t = rates[-1]
    assert s == t - 1 and float(real(recipe, t)(s)) == pytest.approx(
        recipe.learning_rate * 0.1, rel=1e-4
    )


def test_features_hold_states_and_give_each_drafter_its_own(tmp_path):
    """`distill_eagle.Features` with verifier states: saved and loaded, concatenated, and
    a subset of them selected for a drafter reading fewer; a drafter reading states the
    file does not hold is refused."""
    from specjax.train.distill_eagle import Features

    rng = np.random.default_rng(0)
    D, n = 4, 3
    parts = [
        Features(
            rng.integers(0, V, (2, w)).astype(np.int32),
            np.array([w, w - 1], np.int32),
            np.array([1, 1], np.int32),
            rng.standard_normal((2, w, D)).astype(np.float16),
            rng.standard_normal((2, w, n * D)).astype(np.float16),
            np.array([1, 4, 6], np.int32),
        )
        for w in (5, 7)
    ]
    parts[0].save(tmp_path / "f.npz")
    back = Features.load(tmp_path / "f.npz")
    np.testing.assert_array_equal(back.states, parts[0].states)
    assert back.layers == (1, 4, 6)
    both = Features.concat([back, parts[1]])
    assert both.states.shape == (4, 7, n * D) and both.layers == (1, 4, 6)
    np.testing.assert_array_equal(both.inputs(()), both.feats)
    np.testing.assert_array_equal(both.inputs((1, 4, 6)), both.states)
    sub = both.inputs((6, 1))
    st = both.states.reshape(4, 7, n, D)
    np.testing.assert_array_equal(sub, np.concatenate([st[:, :, 2], st[:, :, 0]], -1))
    with pytest.raises(ValueError, match="a subset of the states held"):
        both.inputs((2,))
    some = both.take([3, 0])  # rows picked (train_eagle --eval_train_rows)
    assert some.layers == (1, 4, 6) and some.tokens.shape == (2, 7)
    for f in ("tokens", "length", "prompt_len", "feats", "states"):
        np.testing.assert_array_equal(getattr(some, f), getattr(both, f)[[3, 0]])
    plain = Features(*(getattr(parts[0], f) for f in ("tokens", "length", "prompt_len", "feats")))
    plain.save(tmp_path / "p.npz")
    assert Features.load(tmp_path / "p.npz").states is None
    assert plain.take([1]).states is None and plain.take([1]).length.tolist() == [4]
    with pytest.raises(ValueError, match="parts of layers"):
        Features.concat([plain, parts[1]])


@pytest.mark.slow  # CI time (make test ≤ 15 min on a cold clone); `make test-all` runs it
def test_a_two_layer_drafter_is_built_saved_and_loaded(tmp_path):
    """`EagleRecipe.layers = 2`: `initial_eagle` builds two decoder layers (both trained,
    the cache holding each one's keys), and `real_zoo.save_eagle` / `load_eagle` give back
    the same drafter: same config, same logits on the same features."""
    import types  # pylint: disable=import-outside-toplevel

    from specjax.models import real_zoo  # pylint: disable=import-outside-toplevel
    from specjax.models.api import causal_block_mask  # pylint: disable=import-outside-toplevel
    from specjax.train import distill_eagle  # pylint: disable=import-outside-toplevel

    v_lm, v_params = _verifier(TINY, seed=5, sharpen=2.0)
    model = types.SimpleNamespace(lm=v_lm, params=v_params, tokenizer=None)
    data, feats = _random_features(v_lm, v_params, rows=4, width=9, seed=3)
    toks = data.tokens
    recipe = distill_eagle.EagleRecipe(kept=10, layers=2, steps=3, batch=2, warmup=1)
    lm, params = distill_eagle.initial_eagle(model, data, recipe, max_len=32)
    assert lm.config.n_layers == 2 and {"layer_0", "layer_1"} <= set(params["net"])
    params, _ = distill_eagle.train_eagle(lm, params, data, recipe, log=lambda s: None)
    path = real_zoo.save_eagle(tmp_path / "e2.npz", lm, params, {"recipe": {"layers": 2}})
    lm2, params2, info = real_zoo.load_eagle(path, model)
    assert lm2.config.n_layers == 2 and info["recipe"]["layers"] == 2
    cache = lm.write_features(lm.init_cache(4), feats, jnp.zeros(4, jnp.int32), jnp.full(4, 8))
    pos = jnp.broadcast_to(jnp.arange(9), (4, 9))
    want, c1 = lm.forward(params, cache, jnp.asarray(toks), pos, causal_block_mask(4, 9))
    got, _ = lm2.forward(params2, cache, jnp.asarray(toks), pos, causal_block_mask(4, 9))
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)
    assert len(c1.k) == 2 and not np.array_equal(np.asarray(c1.k[0]), np.asarray(c1.k[1]))


def test_the_acceptance_loss_is_one_minus_alpha():
    """`EagleRecipe.tv_weight`'s term, 1 − Σ min(p, q) on the reply positions, is 1 − α as
    `feature_alpha` measures it (kept ids = the whole vocabulary, no input noise), at draft
    step 1 and 2; and training on it alone (no regression, no CE) lowers it."""
    import types  # pylint: disable=import-outside-toplevel

    import jax  # pylint: disable=import-outside-toplevel

    from specjax.train import distill_eagle  # pylint: disable=import-outside-toplevel

    v_lm, v_params = _verifier(TINY, seed=5, sharpen=2.0)
    model = types.SimpleNamespace(lm=v_lm, params=v_params, tokenizer=None)
    data, _ = _random_features(v_lm, v_params, rows=8, width=12, seed=7)
    recipe = distill_eagle.EagleRecipe(
        kept=TINY.vocab_size,
        noise=0.0,
        tv_weight=1.0,
        ce_weight=0.0,
        reg_weight=0.0,
        steps=40,
        batch=8,
        learning_rate=3e-3,
        warmup=2,
    )
    lm, params = distill_eagle.initial_eagle(model, data, recipe, max_len=32)

    def tv(params):
        _, m = distill_eagle._step_losses(  # pylint: disable=protected-access
            lm,
            params,
            jnp.asarray(data.tokens),
            jnp.asarray(data.feats, jnp.float32),
            None,
            jnp.asarray(data.reply_mask(), jnp.float32),
            recipe,
            jax.random.key(0),
        )
        return float(m["tv1"]), float(m["tv2"])

    before = distill_eagle.feature_alpha(lm, params, data)
    np.testing.assert_allclose(tv(params), (1 - before["alpha1"], 1 - before["alpha2"]), atol=1e-5)
    trained, _ = distill_eagle.train_eagle(lm, params, data, recipe, log=lambda s: None)
    after = distill_eagle.feature_alpha(lm, trained, data)
    np.testing.assert_allclose(tv(trained), (1 - after["alpha1"], 1 - after["alpha2"]), atol=1e-5)
    assert after["alpha1"] > before["alpha1"] + 0.05, (before, after)


def test_feature_alpha_by_temperature_and_top_m():
    """`feature_alpha`'s drafter temperature (1 is the default law; a very hot drafter is
    uniform over its kept ids, α = Σ min(p, 1/K)) and top-m coverage of the verifier's
    argmax (m = 1 is top-1 agreement, coverage grows with m and is 1 at m = K)."""
    import types  # pylint: disable=import-outside-toplevel

    from specjax.train import distill_eagle  # pylint: disable=import-outside-toplevel

    v_lm, v_params = _verifier(TINY, seed=5, sharpen=2.0)
    model = types.SimpleNamespace(lm=v_lm, params=v_params, tokenizer=None)
    data, _ = _random_features(v_lm, v_params, rows=8, width=12, seed=7)
    k = TINY.vocab_size
    recipe = distill_eagle.EagleRecipe(kept=k, noise=0.0, steps=1, batch=8)
    lm, params = distill_eagle.initial_eagle(model, data, recipe, max_len=32)
    base = distill_eagle.feature_alpha(lm, params, data)
    at1 = distill_eagle.feature_alpha(lm, params, data, temperature=1.0, top_m=k)
    assert at1["alpha1"] == base["alpha1"] and at1["top1_1"] == base["top1_1"]
    cover = [at1["top1_1"]] + [at1[f"top{m}_1"] for m in range(2, k + 1)]
    assert all(a <= b for a, b in zip(cover, cover[1:])) and cover[-1] == pytest.approx(1.0)
    hot = distill_eagle.feature_alpha(lm, params, data, temperature=1e6)
    mask = data.reply_mask()
    v_logits = np.einsum("btd,vd->btv", data.feats, np.asarray(v_params["embed"], np.float32))
    p = np.exp(v_logits - v_logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    want = (np.minimum(p, 1.0 / k).sum(-1) * mask).sum() / mask.sum()
    assert hot["alpha1"] == pytest.approx(want, abs=1e-4)
    with pytest.raises(ValueError, match="temperature"):
        distill_eagle.feature_alpha(lm, params, data, temperature=0.0)
