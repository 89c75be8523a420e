"""The coupled rule through every policy (SPEC §3.4, §5), on the synthetic 4-drafter,
3-tokenizer deployment of test_policy: whatever the switches, the vote or the fallback, the
committed text is the verifier's own Gumbel-max sample; and where `coupled_block` (switch 2
off) cuts. Kept apart from test_policy so the two files run on different workers."""

from __future__ import annotations

import numpy as np
import pytest

from specjax import testing as suite
from specjax.policy.plan import run_plans
from specjax.policy.plan_config import PlanConfig
from specjax.policy.switches import all_combinations


@pytest.fixture(scope="module")
def deployment():
    return suite.make_deployment("random", seed=7, fourth=True)


@pytest.mark.parametrize(
    "threshold",
    [  # ~40 s each: `make test-all`
        pytest.param(t, marks=pytest.mark.slow) for t in (0.5, 1.0)
    ],
)
def test_coupled_rule_commits_the_verifiers_own_sample_under_every_policy(deployment, threshold):
    """τ_verifier = 1, rule 'coupled': whatever the policy, the vote or the fallback, every
    plan's text is the verifier's own Gumbel-max sample with the plan's noise."""
    dep, _ = deployment
    cfg = PlanConfig(
        gamma=3,
        verifier_temperature=1.0,
        plan_steps=3,
        max_step_tokens=6,
        bucket=16,
        rule="coupled",
        consensus="quorum",
        consensus_threshold=threshold,
    )
    prompts = ["ab", "c", "dda", "b", "ca"]
    ref, _ = run_plans(dep, cfg, prompts)
    fallbacks = 0
    for pol in all_combinations():
        texts, stats = run_plans(dep, cfg, prompts, policy=pol)
        assert texts == ref, pol.name
        fallbacks += stats.fallbacks
    if threshold == 1.0:
        assert fallbacks == 16 * 3 * len(prompts)  # weights < 1: every step falls back


def test_coupled_block_cuts_every_chain_where_the_first_chain_mismatched():
    """Switch 2 off under coupling: the cut is the earliest mismatch of any active chain."""
    import jax.numpy as jnp

    from specjax.verify import rules

    v, gamma = 4, 3
    p = jnp.full((v,), 0.25)
    p_nodes = jnp.broadcast_to(p, (2, gamma, v))
    g = jnp.zeros((gamma + 1, v)).at[:, 2].set(5.0)  # the noise makes token 2 the target
    drafts = jnp.array([[2, 2, 1], [2, 0, 0]])  # chain 0 leads 2, chain 1 leads 1
    active = jnp.array([True, True])
    tree = rules.coupled(None, p, p_nodes, p_nodes, drafts, active, g)
    block = rules.coupled_block(None, p, p_nodes, p_nodes, drafts, active, g)
    assert int(tree.n) == 2 and int(block.n) == 1
    np.testing.assert_array_equal(np.asarray(block.tokens[:2]), [2, 2])
    np.testing.assert_array_equal(np.asarray(block.accepted), [1, 1])
    np.testing.assert_array_equal(np.asarray(block.rejected), [0, 1])
    only_second = rules.coupled_block(
        None, p, p_nodes, p_nodes, drafts, jnp.array([True, False]), g
    )
    assert int(only_second.n) == 2
