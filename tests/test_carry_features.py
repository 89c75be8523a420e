"""A feature drafter (`specjax.models.eagle`) in the plan runner's carried state
(`specjax.policy.plan_state`): at its first use it reads the verifier's features of its
prompt (kept from the verifier's prefill), and of the steps before and after steps it sat
out those of the tokens committed meanwhile (one verifier block over the carried cache). Its carried cache then
holds the verifier's features of every committed token and the logits a fresh prefill of
the committed text gives, and at verifier τ 0 every plan commits the verifier's greedy text."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax.models.api import causal_block_mask
from specjax.policy import plan_state
from specjax.policy.engine_calls import commit_carried, plan_keys, run_carried
from specjax.policy.plan import run_plans
from specjax.policy.plan_config import PlanConfig

TEXTS = ["def f(x):", "In the beginning", "1 + 2 ="]
EAGLE = 2  # the deployment's third drafter
#: Each step's drafter set per plan: the feature drafter runs, sits out, comes back (plan 0),
#: starts late (plan 1: its prompt features cover the steps before), runs in a tree (plan 2).
SETS = [[(EAGLE,), (0,), (0, EAGLE)], [(0,), (1,), (1,)], [(EAGLE,), (EAGLE,), (EAGLE,)]]


@pytest.fixture(scope="module")
def dep():
    from specjax.testing import tiny_transformer_deployment

    return tiny_transformer_deployment(max_len=128, feature=True)


def test_carried_features_are_the_verifiers_and_the_logits_a_fresh_prefills(dep):
    cfg = PlanConfig(gamma=2, verifier_temperature=1.0, plan_steps=3, max_step_tokens=6, bucket=16)
    hist = [dep.encode(t) for t in TEXTS]
    states = plan_state.PlanStates(dep, TEXTS, hist, steps=3, gamma=2, max_step_tokens=6, bucket=16)
    fills = []
    for step, sets in enumerate(SETS):
        res = run_carried(
            states, dep, cfg, "token_tree", sets, [0, 1, 2], plan_keys(0, [0, 1, 2], step)
        )
        fills.append(list(res.fills))
        commit_carried(
            states, res, [0, 1, 2], {p: p for p in range(3)}, dict(enumerate(res.tokens))
        )
    # Verifier blocks for the feature drafter: none at a first use at step 0 (the prompt's
    # features come with the verifier's prefill); one for the steps before a later first use
    # (plan 1) and for a return after sitting out step 1 (plans 0 and 2).
    assert fills == [[0, 0, 0], [0, 0, 0], [1, 1, 1]]
    carried = states.d[EAGLE]
    vlen = np.asarray(carried.cache.vlen)
    for p in range(3):
        toks = jnp.asarray([states.hist[p]], jnp.int32)
        _, want = jax.jit(dep.verifier.hidden_full)(dep.v_params, toks)
        n = len(states.hist[p]) - 1
        assert vlen[p] == n  # every committed token's but the next root's
        np.testing.assert_allclose(
            np.asarray(carried.cache.feats[p, :n], np.float32),
            np.asarray(want[0, :n], np.float32),
            atol=2e-5,
            rtol=1e-5,
        )
        # Its logits: those of a fresh cache fed the committed text it has synced.
        synced = int(states.synced[EAGLE][p])
        np.testing.assert_allclose(
            np.asarray(carried.logits[p]),
            np.asarray(_fresh_logits(dep, toks, synced)),
            atol=1e-4,
            rtol=1e-4,
        )


class _Rota:
    """A router that gives each plan its set of `SETS` by step."""

    def choose(self, i, step):
        return SETS[step][i]

    def observe(self, *args):
        pass


def test_a_feature_drafter_routed_in_and_out_commits_the_greedy_text(dep):
    cfg = PlanConfig(gamma=2, verifier_temperature=0.0, plan_steps=3, max_step_tokens=6, bucket=16)
    greedy, _ = run_plans(dep, cfg, TEXTS)
    got, stats = run_plans(dep, cfg, TEXTS, router=_Rota())
    assert got == greedy
    # The plans' prompt prefills, then the verifier blocks for its features (the test above).
    assert int(np.sum(stats.verifier_prefills)) == 3 + 3


def _fresh_logits(dep, toks, n_tokens):
    """The feature drafter's logits after toks[:, :n_tokens], the verifier's features of
    all of them but the last written first (what the engine's prefill gives)."""
    lm, params = dep.drafters[EAGLE].lm, dep.d_data[EAGLE].params
    _, feats = jax.jit(dep.verifier.hidden_full)(dep.v_params, toks)
    n = toks.shape[1] - 1
    cache = lm.write_features(
        lm.init_cache(1, 128), feats[:, :n], jnp.zeros(1, jnp.int32), jnp.array([n])
    )
    x = toks[:, :n_tokens]
    mask = causal_block_mask(1, n_tokens)
    lg, _ = jax.jit(lm.forward)(params, cache, x, jnp.arange(n_tokens)[None], mask)
    return lg[0, -1]


def test_the_kl_checks_law_of_a_feature_drafter_reads_the_verifiers_features(dep):
    """`prefix_distributions` (the KL ceiling's laws): the feature drafter's law after each
    prefix is its law with the verifier's features, as it drafts."""
    from specjax.engine.deployment import prefix_distributions
    from specjax.engine.prefill import pad_prompts

    arr, lens = pad_prompts([dep.encode(t) for t in TEXTS])
    q, ok = prefix_distributions(dep, arr, lens, 1)
    assert ok.all()
    for p, t in enumerate(TEXTS):
        toks = jnp.asarray([dep.encode(t)], jnp.int32)
        want = jax.nn.softmax(_fresh_logits(dep, toks, toks.shape[1]))
        np.testing.assert_allclose(np.asarray(q[EAGLE, p]), np.asarray(want), atol=1e-5)


def test_a_feature_drafters_routing_scores_equal_the_whole_text(dep, monkeypatch):
    """`auto:teacher_forced` on a deployment with a feature drafter: its score read takes
    the verifier's features of each step from the verifier's block over the step, and every
    drafter's per-step score equals `teacher_forced` over the whole committed text."""
    from test_auto_scores import scores_against_the_whole_text

    cfg = PlanConfig(gamma=2, verifier_temperature=1.0, plan_steps=3, max_step_tokens=6, bucket=16)
    scores_against_the_whole_text(dep, cfg, TEXTS, monkeypatch)
