"""Sharded forward on 8 fake CPU devices equals the single-device forward.

Tolerance: f32; sharding over 'model' splits the contractions of the MLP, attention output
and logits into per-device partial sums (all-reduced), which reorders additions only.
"""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from specjax.models.api import advance, causal_block_mask
from specjax.runtime import sharding as shd

TOL = dict(atol=1e-5, rtol=1e-5)

needs8 = pytest.mark.skipif(jax.device_count() < 8, reason='needs 8 (fake) devices')


def test_logical_to_spec_rules_divisibility_and_reuse():
    mesh_shape = {'data': 2, 'model': 4}
    assert shd.logical_to_spec(('vocab', 'embed')) == P('model', None)
    assert shd.logical_to_spec(('batch', 'length', 'vocab')) == P('data', None, 'model')
    # 2 KV heads do not split 4 ways: replicated.
    assert shd.logical_to_spec(
        ('embed', 'kv_heads', 'head_dim'), shd.DEFAULT_RULES, (32, 2, 8), mesh_shape
    ) == P(None, None, None)
    # A mesh axis is used once per array.
    assert shd.logical_to_spec(('heads', 'mlp')) == P('model', None)
    # Rules are overridable (e.g. from a ConfigDict's list of pairs).
    rules = shd.normalize_rules([['batch', ['data', 'model']], ['vocab', None]])
    assert shd.logical_to_spec(('batch', 'vocab'), rules) == P(('data', 'model'), None)
    with pytest.raises(ValueError, match=r"rules\[0\].*'tensor'"):
        shd.normalize_rules([('batch', 'tensor')])


def test_make_mesh_validates():
    with pytest.raises(ValueError, match=r'data\*model=.*exceeds'):
        shd.make_mesh(jax.device_count(), 2)
    with pytest.raises(ValueError, match=r'model=0'):
        shd.make_mesh(1, 0)


@needs8
@pytest.mark.parametrize('data,model', [(2, 4), (8, 1)])
def test_sharded_forward_equals_unsharded(tiny_lm, tiny_params, data, model):
    lm, params = tiny_lm, tiny_params
    mesh = shd.make_mesh(data, model)
    assert mesh.axis_types == (jax.sharding.AxisType.Auto,) * 2
    B, P_len, T = 8, 6, 3
    rng = np.random.default_rng(0)
    prefix = jnp.asarray(rng.integers(0, lm.vocab_size, (B, P_len)), jnp.int32)
    block = jnp.asarray(rng.integers(0, lm.vocab_size, (B, T)), jnp.int32)

    def run(forward, params, cache):
        pos = cache.length[:, None] + jnp.arange(P_len)[None]
        logits1, cache = forward(params, cache, prefix, pos, causal_block_mask(B, P_len))
        cache = advance(cache, P_len)
        pos = cache.length[:, None] + jnp.arange(T)[None]
        logits2, cache = forward(params, cache, block, pos, causal_block_mask(B, T))
        return logits1, logits2, cache

    ref1, ref2, ref_cache = run(jax.jit(lm.forward), params, lm.init_cache(B))

    sharded_params = shd.shard_params(params, mesh, logical_axes=lm.param_logical_axes())
    wq = sharded_params['layer_0']['attn']['wq']
    assert wq.sharding.spec == P(None, 'model', None)  # 4 heads split over 'model'
    prefill = shd.make_sharded_forward(lm, mesh, batch=B, block=P_len)
    score = shd.make_sharded_forward(lm, mesh, batch=B, block=T)
    cache = jax.device_put(lm.init_cache(B), prefill.cache_shardings)
    pos = cache.length[:, None] + jnp.arange(P_len)[None]
    logits1, cache = prefill(sharded_params, cache, prefix, pos, causal_block_mask(B, P_len))
    cache = advance(cache, P_len)
    pos = cache.length[:, None] + jnp.arange(T)[None]
    logits2, cache = score(sharded_params, cache, block, pos, causal_block_mask(B, T))

    assert logits2.sharding.spec[0] == 'data'
    assert len(logits2.sharding.device_set) == data * model
    chex.assert_trees_all_close((logits1, logits2), (ref1, ref2), **TOL)
    chex.assert_trees_all_close(cache.k, ref_cache.k, **TOL)


def test_constraints_are_noops_without_rules_or_mesh():
    x = jnp.ones((2, 3))
    assert shd.with_logical_constraint(x, ('batch', 'embed')) is x
    with shd.activation_rules():
        assert shd.with_logical_constraint(x, ('batch', 'embed')) is x  # no mesh set


# ----------------------------------------------------------------------------------------
# The whole speculative round, the baseline and a plan step on a mesh (issue 9)
# ----------------------------------------------------------------------------------------


def _engine_setup():
    """A verifier and two drafters (one of another vocabulary) as tiny transformers."""
    from specjax.testing import tiny_transformer_deployment

    return tiny_transformer_deployment()


@pytest.fixture(scope="module")
def engine_case():
    from specjax.engine import generate as gen
    from specjax.engine.autoregressive import autoregressive_generate
    from specjax.engine.spec import EngineConfig

    dep = _engine_setup()
    texts = ["def f(x):", "In the beginning", "1 + 2 =", "the", "x", "print(", "And", "ok"]
    prompts = [dep.encode(t) for t in texts]
    d_prompts = [[enc(t) for t in texts] for enc in dep.drafter_encode]
    keys = gen.row_keys_for(0, len(texts))
    cfg = EngineConfig(
        gamma=3, rule="token_tree", verifier_temperature=1.0, n_slots=2, max_new_tokens=10
    )

    def run(dep):
        spec = gen.speculative_generate(
            cfg, dep.verifier, dep.v_params, dep.drafters, dep.d_data, prompts, d_prompts, keys
        )
        ar = autoregressive_generate(
            dep.verifier, dep.v_params, prompts, keys, temperature=1.0, max_new_tokens=10
        )
        return spec, ar

    return dep, run, run(dep)


@needs8
@pytest.mark.parametrize(
    "rules",
    [  # ~25 s each plus a ~20 s setup: `make test-all` (the sharded
        # plan step, test_plan_step_sharded_equals_unsharded, runs in `make test`)
        *(pytest.param(r, marks=pytest.mark.slow) for r in ("fsdp_tp", "tp", "fsdp", "replicated"))
    ],
)
def test_speculative_and_baseline_sharded_equal_unsharded(engine_case, rules):
    dep, run, (ref_spec, ref_ar) = engine_case
    mesh = shd.make_mesh(2, 4)
    sdep = shd.shard_deployment(dep, mesh, rules)
    wq = sdep.v_params["layer_0"]["attn"]["wq"]
    assert len(wq.sharding.device_set) == 8
    assert wq.sharding.spec == shd.logical_to_spec(
        ("embed", "heads", "head_dim"), shd.RULE_SETS[rules], wq.shape, dict(mesh.shape)
    )
    spec, ar = run(sdep)
    np.testing.assert_array_equal(spec.tokens, ref_spec.tokens)
    np.testing.assert_array_equal(spec.counters.accepted, ref_spec.counters.accepted)
    np.testing.assert_array_equal(ar.tokens, ref_ar.tokens)


@pytest.mark.slow  # CI time (make test ≤ 15 min on a cold clone); `make test-all` runs it
@needs8  # ~20 s on an idle machine
def test_plan_step_sharded_equals_unsharded():
    from specjax.policy.plan import run_plans
    from specjax.policy.plan_config import PlanConfig
    from specjax.policy.switches import Policy

    # One drafter and the naive policy: the fewest programs that still run a plan step
    # (an engine call and the step decision); the engine itself is covered above.
    dep = _engine_setup().subset(["same"])
    pcfg = PlanConfig(gamma=2, verifier_temperature=0.0, plan_steps=1, max_step_tokens=6, bucket=16)
    prompts = ["def f(x):", "In the beginning", "1 + 2 ="]
    ref, _ = run_plans(dep, pcfg, prompts, policy=Policy.from_name("naive"))
    sdep = shd.shard_deployment(dep, shd.make_mesh(2, 4), "fsdp_tp")
    got, stats = run_plans(sdep, pcfg, prompts, policy=Policy.from_name("naive"))
    assert got == ref and stats.tokens > 0


def test_rule_sets_resolve_by_name():
    assert shd.resolve_rules("tp") == shd.DEFAULT_RULES
    assert shd.logical_to_spec(("vocab", "embed"), shd.resolve_rules("fsdp_tp")) == P(
        "model", "data"
    )
    assert shd.logical_to_spec(("batch", "length", "embed"), shd.FSDP_RULES) == P(
        "data", None, None
    )
    with pytest.raises(ValueError, match=r"got 'zero3', allowed: one of 'tp', 'fsdp'"):
        shd.resolve_rules("zero3")


@needs8
def test_served_deployment_splits_the_cache_by_head_and_generates_the_same(engine_case):
    from specjax.engine.serving import serve_deployment

    dep, run, (ref_spec, ref_ar) = engine_case
    mesh = shd.make_mesh(2, 4)  # 4 shards on 'model'; the verifier: 4 heads, 2 KV heads
    sdep = serve_deployment(dep, mesh, "tp", untie_head=False)
    assert sdep.verifier.config.n_kv_heads == 4  # each KV head twice: one per shard
    wk = sdep.v_params["layer_0"]["attn"]["wk"]
    assert wk.shape[1] == 4 and wk.sharding.spec[1] == "model"  # split by head
    spec, ar = run(sdep)
    np.testing.assert_array_equal(spec.tokens, ref_spec.tokens)
    np.testing.assert_array_equal(ar.tokens, ref_ar.tokens)
