"""The engine: no retracing, per-round invariants, clear errors on bad input, greedy on the zoo."""
from __future__ import annotations

from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

from specjax.engine import generate as gen
from specjax.engine.spec import DrafterSpec, EngineConfig, cross_vocab_maps
from specjax.errors import ConfigError
from specjax.models import synthetic_suite as suite
from specjax.models.synthetic import BigramLM

ZOO = Path(__file__).resolve().parents[1] / "specjax" / "zoo" / "manifest.json"


def _run(setup, cfg, n=16, seed=0, prompts=None, **kw):
    prompts = prompts or [[i % suite.V] for i in range(n)]
    dp = [[suite.drafter_prompts(p)[k] for p in prompts] for k in range(3)]
    return gen.speculative_generate(cfg, setup.verifier, setup.v_params, setup.drafters,
                                    setup.d_data, prompts, dp, gen.row_keys_for(seed, len(prompts)),
                                    **kw)


def test_round_is_traced_once_per_shape():
    setup = suite.make_setup("random", seed=1)
    cfg = EngineConfig(gamma=3, rule="token_tree", verifier_temperature=1.0, n_slots=3,
                       max_new_tokens=7)
    _run(setup, cfg, seed=0)
    size = gen._run_speculative._cache_size()
    for seed in range(1, 4):                      # new values, same shapes: no retrace
        other = suite.make_setup("random", seed=10 + seed)
        _run(other, cfg, seed=seed)
    assert gen._run_speculative._cache_size() == size


def test_committed_per_round_within_one_and_gamma_plus_one():
    setup = suite.make_setup("random", seed=2)
    for rule, s in (("rejection", 1), ("shared_block", 3), ("token_tree", 3), ("coupled", 3),
                    ("coupled_block", 3)):
        cfg = EngineConfig(gamma=4, rule=rule, verifier_temperature=1.0, n_slots=s,
                           max_new_tokens=20)
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
    cfg = EngineConfig(gamma=3, rule="token_tree", verifier_temperature=1.0, n_slots=3,
                       max_new_tokens=30)
    res = _run(setup, cfg, n=200, stop_table=stop)
    for i in range(200):
        new = res.new_tokens(i)
        assert 2 not in new[:-1]
        assert new[-1] == 2 or len(new) == 30


@pytest.mark.parametrize("kwargs,match", [
    (dict(gamma=0), "gamma"),
    (dict(verifier_temperature=-0.5), "verifier_temperature"),
    (dict(rule="wholesale"), "rule"),
    (dict(max_new_tokens=0), "max_new_tokens"),
])
def test_bad_engine_config(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        EngineConfig(**kwargs)


def test_bad_inputs_fail_before_work():
    setup = suite.make_setup("random", seed=4)
    cfg = EngineConfig(gamma=2, rule="token_tree", n_slots=3, max_new_tokens=4)
    # A drafter at a negative temperature.
    import dataclasses
    bad = dataclasses.replace(setup, drafters=(dataclasses.replace(setup.drafters[0],
                                                                   temperature=-1.0),)
                              + setup.drafters[1:])
    with pytest.raises(ConfigError, match="temperature"):
        _run(bad, cfg)
    # NaN logits.
    nan = dataclasses.replace(setup, v_params={"table": setup.v_params["table"].at[0, 0].set(jnp.nan)})
    with pytest.raises(ConfigError, match="NaN"):
        _run(nan, cfg)
    # A drafter that shares no token with the verifier.
    with pytest.raises(ConfigError, match="shares no token"):
        cross_vocab_maps({"table": jnp.zeros((3, 3))}, np.full(3, -1), np.zeros((5, 1)),
                         np.ones(5), 5)
    # Prompts longer than the verifier's context.
    small = dataclasses.replace(setup, verifier=BigramLM(suite.V, max_len=8))
    with pytest.raises(ConfigError, match="context"):
        _run(small, cfg, prompts=[[1] * 6])
    # An empty prompt.
    with pytest.raises(ConfigError, match="empty"):
        _run(setup, cfg, prompts=[[]])


@pytest.mark.skipif(not ZOO.exists(), reason="the zoo is not built")
def test_greedy_equality_on_the_zoo():
    """The naive block, the token tree and rule 1 on the real zoo (cross-tokenizer drafters
        included) equal greedy decoding. (The coupled forms are greedy-tested on the synthetic
    suite in test_verify and through every policy in test_policy; each rule here costs a
    ~25 s compilation of the three-drafter zoo on this CPU.)"""
    from specjax.data import load_prompts
    from specjax.models.zoo import load_zoo
    dep = load_zoo(ZOO.parent).deployment()
    texts = [p["prompt"] for p in load_prompts()][::9][:6]
    v = [dep.encode(t) for t in texts]
    d = [[enc(t) for t in texts] for enc in dep.drafter_encode]
    keys = gen.row_keys_for(0, len(v))
    ref = gen.autoregressive_generate(dep.verifier, dep.v_params, v, keys, temperature=0.0,
                                      max_new_tokens=24, bucket=64)
    for rule, s in (("shared_block", 3), ("token_tree", 3), ("rejection", 1)):
        for slot_rows in ([[0, 1, 2]] if s == 3 else [[0], [1], [2]]):
            cfg = EngineConfig(gamma=4, rule=rule, verifier_temperature=0.0, n_slots=s,
                               max_new_tokens=24)
            res = gen.speculative_generate(cfg, dep.verifier, dep.v_params, dep.drafters,
                                           dep.d_data, v, d, keys,
                                           slots=np.tile(slot_rows, (len(v), 1)), bucket=64)
            for i in range(len(v)):
                assert res.new_tokens(i) == ref.new_tokens(i), (rule, slot_rows, i)
