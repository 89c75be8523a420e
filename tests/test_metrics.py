"""Tests of the SPEC §7 metric definitions on hand-computed numbers.

Run: `.venv/bin/pytest tests/test_metrics.py -q -p no:xdist`.
"""

from __future__ import annotations

import math

import jax
import numpy as np
import pytest

from specjax import metrics as m


def close(actual, expected, rtol=1e-6, atol=0.0):
    np.testing.assert_allclose(np.asarray(actual, np.float64), expected, rtol=rtol, atol=atol)


# ----------------------------------------------------------------------------- acceptance


def test_acceptance():
    close(m.acceptance(68, 100), 0.68)
    close(m.acceptance([68, 61, 54], [100, 100, 100]), [0.68, 0.61, 0.54])
    close(m.acceptance([0, 5], [4, 5]), [0.0, 1.0])


def test_acceptance_empty_is_nan():
    out = np.asarray(m.acceptance([3, 0], [4, 0]))
    assert out[0] == pytest.approx(0.75) and math.isnan(out[1])
    assert math.isnan(float(m.acceptance(0, 0)))


def test_acceptance_pooled_is_ratio_of_sums():
    accepted = [[3, 1], [1, 0]]  # rounds × drafters
    proposed = [[4, 4], [8, 0]]
    # Drafter 0 pooled: 4/12, not the mean of its per-round ratios (3/4 + 1/8)/2 = 0.4375.
    close(m.acceptance(accepted, proposed, pool_axis=0), [4 / 12, 1 / 4])
    close(m.acceptance(accepted, proposed, pool_axis=(0, 1)), 5 / 16)


def test_per_position_acceptance():
    # 10 chains; 8 accepted at k=1, of which 4 at k=2, of which 1 at k=3.
    cond, uncond = m.per_position_acceptance([8, 4, 1], [10, 8, 4], 10)
    close(cond, [0.8, 0.5, 0.25])
    close(uncond, [0.8, 0.4, 0.1])
    close(np.sum(np.asarray(uncond)), 1.3)  # mean accepted draft length per chain


def test_per_position_acceptance_batched_and_empty():
    cond, uncond = m.per_position_acceptance([[2, 0], [0, 0]], [[4, 2], [0, 0]], [4, 0])
    cond, uncond = np.asarray(cond), np.asarray(uncond)
    close(cond[0], [0.5, 0.0])
    close(uncond[0], [0.5, 0.0])
    assert np.all(np.isnan(cond[1])) and np.all(np.isnan(uncond[1]))
    with pytest.raises(AssertionError):
        m.per_position_acceptance([1, 2], [1, 2, 3], 3)


def test_joint_acceptance():
    close(m.joint_acceptance(19, 100), 0.19)
    close(m.joint_acceptance([10, 3, 0], [20, 10, 0], pool_axis=0), 13 / 30)
    assert math.isnan(float(m.joint_acceptance(0, 0)))


def test_rejection_attribution():
    out = m.rejection_attribution({"code": 2, "prose": 3, "reasoning": 15})
    assert out == pytest.approx({"code": 0.1, "prose": 0.15, "reasoning": 0.75})
    assert m.rejection_attribution([1, 3]) == pytest.approx({0: 0.25, 1: 0.75})
    # Per-position counters are summed per drafter: [1, 1] → 2, [0, 6] → 6.
    out = m.rejection_attribution({"a": np.array([1, 1]), "b": np.array([0, 6])})
    assert out == pytest.approx({"a": 0.25, "b": 0.75})


def test_rejection_attribution_empty():
    assert m.rejection_attribution({"a": 0, "b": 0}) == {"a": 0.0, "b": 0.0}
    assert m.rejection_attribution({}) == {}
    with pytest.raises(ValueError, match="drafter 'a' has -1.0 rejections"):
        m.rejection_attribution({"a": -1})


# ----------------------------------------------------------------------------- lengths


def test_mean_accepted_length_and_block_efficiency():
    close(m.mean_accepted_length(100, 40), 2.5)
    close(m.block_efficiency(100, 40), 2.5)
    close(m.block_efficiency([30, 40], [10, 10], pool_axis=0), 3.5)
    assert math.isnan(float(m.mean_accepted_length(0, 0)))
    close(m.mean_accepted_length(7, 7), 1.0)  # autoregressive


def test_mean_truncation_depth():
    close(m.mean_truncation_depth(15, 6), 2.5)
    close(m.mean_truncation_depth([3, 0], [2, 0]), [1.5, 0.0])  # no truncation → 0, not NaN
    assert float(m.mean_truncation_depth(0, 0)) == 0.0


def test_consensus_fallback_rate():
    close(m.consensus_fallback_rate(8, 10), 0.8)
    close(m.consensus_fallback_rate([1, 0], [4, 3], pool_axis=0), 1 / 7)
    assert math.isnan(float(m.consensus_fallback_rate(0, 0)))


def test_tokens_per_second():
    close(m.tokens_per_second(100, 4.0), 25.0)
    assert math.isnan(float(m.tokens_per_second(0, 0)))


# ----------------------------------------------------------------------------- theory


@pytest.mark.parametrize(
    "alpha, gamma, expected",
    [
        (0.0, 4, 1.0),  # only the verifier's token
        (1.0, 4, 5.0),  # the α = 1 limit: γ + 1
        (0.5, 4, 1.9375),  # (1 − 1/32)/0.5
        (0.8, 2, 2.44),  # (1 − 0.512)/0.2
        (0.999, 4, 4.990009995),  # Σ_{k=0..4} 0.999^k, accurate near 1
        (0.3, 0, 1.0),  # γ = 0: autoregressive
        (1.0, 0, 1.0),
    ],
)
def test_leviathan_expected_tokens(alpha, gamma, expected):
    close(m.leviathan_expected_tokens(alpha, gamma), expected, rtol=2e-6)


def test_leviathan_expected_tokens_batched_and_jit():
    close(m.leviathan_expected_tokens([0.0, 0.5, 1.0], [4, 4, 4]), [1.0, 1.9375, 5.0])
    close(jax.jit(m.leviathan_expected_tokens)(0.5, 4.0), 1.9375)
    grad = jax.grad(lambda a: m.leviathan_expected_tokens(a, 4.0))(0.5)
    close(grad, 1 + 2 * 0.5 + 3 * 0.25 + 4 * 0.125)  # d/dα Σ α^k = Σ k α^{k−1} = 3.25


@pytest.mark.parametrize("alpha", [-0.1, 1.1, float("nan")])
def test_leviathan_bad_alpha(alpha):
    with pytest.raises(ValueError, match=r"alpha=.*allowed: finite, in \[0.0, 1.0\]"):
        m.leviathan_expected_tokens(alpha, 4)


def test_leviathan_speedup():
    close(m.leviathan_speedup(0.8, 2, 0.1), 2.44 / 1.2)  # = 2.0333333
    close(m.leviathan_speedup(0.0, 4, 0.25), 0.5)  # 1 / (4·0.25 + 1)
    close(m.leviathan_speedup(1.0, 3, 0.05), 4 / 1.15)  # = 3.4782609
    close(m.leviathan_speedup(0.5, 4, 0.0), 1.9375)  # free drafter
    with pytest.raises(ValueError, match="c="):
        m.leviathan_speedup(0.5, 4, -1.0)


def test_hardware_aware_speedup():
    # E = 3 tokens, T_step = 10 ms, T_draft = 1 ms, T_score = 20 ms, γ = 4: 30 / 24.
    close(m.hardware_aware_speedup(3.0, 10.0, 1.0, 20.0, 4), 1.25)
    # With T_score = T_step and c = T_draft/T_step it equals Leviathan's speedup.
    e = m.leviathan_expected_tokens(0.8, 2)
    close(m.hardware_aware_speedup(e, 10.0, 1.0, 10.0, 2), m.leviathan_speedup(0.8, 2, 0.1))


# ----------------------------------------------------------------------------- distributions


def test_tv_and_alpha():
    close(m.tv_distance([0.5, 0.5], [0.9, 0.1]), 0.4)
    close(m.alpha_from_distributions([0.5, 0.5], [0.9, 0.1]), 0.6)
    p = np.array([[0.7, 0.2, 0.1], [1.0, 0.0, 0.0], [0.2, 0.3, 0.5]])
    q = np.array([[0.2, 0.5, 0.3], [0.0, 0.0, 1.0], [0.2, 0.3, 0.5]])
    # Row 0: |.5|+|.3|+|.2| = 1.0 → TV .5, α = .2+.2+.1 = .5. Row 1: disjoint → 1, 0.
    # Row 2: identical → 0, 1.
    close(m.tv_distance(p, q), [0.5, 1.0, 0.0], atol=1e-7)
    close(m.alpha_from_distributions(p, q), [0.5, 0.0, 1.0], atol=1e-7)
    close(np.asarray(m.alpha_from_distributions(p, q)) + np.asarray(m.tv_distance(p, q)), 1.0)
    assert m.tv_distance(np.ones((2, 3, 4)) / 4, np.ones((2, 3, 4)) / 4).shape == (2, 3)
    with pytest.raises(AssertionError):
        m.tv_distance([0.5, 0.5], [1.0, 0.0, 0.0])
