"""Tests of the engine-independent policy parts: switches, KL, boundary, consensus (the journal: test_journal.py).

Run: `.venv/bin/pytest tests/test_policy_parts.py -q -p no:xdist`.
"""

from __future__ import annotations

import math
import pickle

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax import field_report
from specjax.errors import ConfigError
from specjax.policy import boundary, consensus, kl, switches  # noqa: F401
from specjax.policy.boundary import (
    BoundaryStats,
    CollapseLog,
    SpeculativePrefixCollapseError,
    evaluate_boundary,
    execute_parallel_plan,
    should_truncate_and_repropose,
)
from specjax.policy.consensus import decide, exact_match, vote_weight
from specjax.policy.switches import Policy

# =============================================================================== switches


class TestSwitches:
    def test_presets(self):
        assert Policy.naive() == Policy(False, False, False, None)
        assert Policy.all_on() == Policy(True, True, True, 0.35)
        assert Policy.naive().name == "naive"
        assert Policy.all_on().name == "all_on"
        assert Policy.all_on().code == "p1t1a1k1"

    def test_all_combinations_are_16_distinct_hashable(self):
        combos = switches.all_combinations()
        assert len(combos) == 16
        assert len(set(combos)) == 16
        assert len({p.name for p in combos}) == 16
        assert combos[0] == Policy.naive() and combos[-1] == Policy.all_on()
        assert [p.code for p in combos][:3] == ["p0t0a0k0", "p0t0a0k1", "p0t0a1k0"]

    @pytest.mark.parametrize("policy", switches.all_combinations(), ids=lambda p: p.code)
    def test_name_and_code_round_trip(self, policy):
        assert Policy.from_name(policy.name) == policy
        assert Policy.from_name(policy.code) == policy

    @pytest.mark.parametrize("switch", switches.SWITCHES)
    def test_minus_and_plus(self, switch):
        minus = Policy.from_name(f"all_on_minus_{switch}")
        plus = Policy.from_name(f"naive_plus_{switch}")
        assert minus.switches_on == tuple(s for s in switches.SWITCHES if s != switch)
        assert plus.switches_on == (switch,)
        assert minus.name == f"all_on_minus_{switch}"
        assert plus.name == f"naive_plus_{switch}"

    def test_specific_names(self):
        assert Policy.from_name("all_on_minus_kl_ceiling") == Policy(True, True, True, None)
        assert Policy.from_name("naive_plus_kl_ceiling") == Policy(False, False, False, 0.35)
        assert Policy.from_name("p1t0a1k0") == Policy(True, False, True, None)
        assert Policy(True, False, True, None).name == "p1t0a1k0"

    def test_non_default_ceiling_round_trips(self):
        policy = Policy.all_on(kl_ceiling=0.5)
        assert policy.name == "all_on_kl0.5"
        assert Policy.from_name(policy.name) == policy
        odd = Policy(False, False, False, 1.25)
        assert odd.name == "naive_plus_kl_ceiling_kl1.25"
        assert Policy.from_name(odd.name) == odd
        coded = Policy(False, True, False, 1.25)
        assert coded.name == "p0t1a0k1_kl1.25"
        assert Policy.from_name(coded.name) == coded
        assert Policy.from_name("p1t1a0k1_kl0.2") == Policy(True, True, False, 0.2)

    def test_to_dict(self):
        d = Policy.all_on().to_dict()
        assert d == {
            "prefix_partitioning": True,
            "truncate_and_attribute": True,
            "agreement_weighted_consensus": True,
            "kl_ceiling": 0.35,
        }
        assert Policy(**d) == Policy.all_on()

    def test_int_ceiling_normalised(self):
        assert Policy(kl_ceiling=1) == Policy(kl_ceiling=1.0)
        assert hash(Policy(kl_ceiling=1)) == hash(Policy(kl_ceiling=1.0))
        assert isinstance(Policy(kl_ceiling=1).kl_ceiling, float)

    @pytest.mark.parametrize("bad", [0, 0.0, -0.1, float("nan"), float("inf"), True, "0.3"])
    def test_bad_ceiling(self, bad):
        with pytest.raises(
            ConfigError, match=r"^policy\.kl_ceiling: got .*, allowed: None \(off\)"
        ):
            Policy(kl_ceiling=bad)

    def test_bad_bool_switch(self):
        with pytest.raises(
            ConfigError, match=r"^policy\.prefix_partitioning: got 1, allowed: True or"
        ):
            Policy(prefix_partitioning=1)

    @pytest.mark.parametrize(
        "name", ["", "all", "all_on_minus_foo", "p1t1a1", "p2t0a0k0", "naive_kl0.5", 3]
    )
    def test_bad_names(self, name):
        with pytest.raises(ConfigError, match=r"^policy: got .*, allowed: 'naive', 'all_on'"):
            Policy.from_name(name)

    def test_static_argument_to_jit(self):
        f = jax.jit(lambda x, policy: x + float(policy.truncate_and_attribute), static_argnums=1)
        assert float(f(1.0, Policy.all_on())) == 2.0
        assert float(f(1.0, Policy.naive())) == 1.0


# =============================================================================== KL

# Hand-computed values (natural log):
#   KL([.5,.5] ‖ [.9,.1]) = .5 ln(.5/.9) + .5 ln(.5/.1) = .5(−.5877867) + .5(1.6094379)
#                         = 0.5108256
#   KL([.9,.1] ‖ [.5,.5]) = .9 ln(1.8) + .1 ln(.2) = .5290080 − .1609438 = 0.3680642
#   KL([.7,.2,.1] ‖ [.2,.5,.3]) = .7 ln 3.5 + .2 ln .4 + .1 ln(1/3)
#                              = .876934 − .183258 − .109861 = 0.5838147
#   KL([.2,.5,.3] ‖ [.7,.2,.1]) = .2 ln(2/7) + .5 ln 2.5 + .3 ln 3
#                              = −.250553 + .458145 + .329584 = 0.5371765
A, B = 0.5108256, 0.3680642
U, S = [0.5, 0.5], [0.9, 0.1]


def _three_drafters():
    # q[i, t]: position 0: d0=U, d1=S, d2=U; position 1: d0=S, d1=S, d2=U.
    return np.array([[U, S], [S, S], [U, U]], dtype=np.float32)


class TestKL:
    def test_one_pair_three_tokens(self):
        q = np.array([[[0.7, 0.2, 0.1]], [[0.2, 0.5, 0.3]]], dtype=np.float32)
        out = np.asarray(kl.pairwise_kl(q, eps=1e-9))
        np.testing.assert_allclose(out[:, :, 0], [[0, 0.5838147], [0.5371765, 0]], atol=1e-6)

    def test_pairs_and_positions(self):
        out = np.asarray(kl.pairwise_kl(_three_drafters(), eps=1e-9))
        assert out.shape == (3, 3, 2)
        expected = np.array(
            [
                [[0, 0], [A, 0], [0, B]],
                [[B, 0], [0, 0], [B, B]],
                [[0, A], [A, A], [0, 0]],
            ]
        )
        np.testing.assert_allclose(out, expected, atol=1e-6)

    def test_default_eps_changes_little(self):
        out = np.asarray(kl.pairwise_kl(_three_drafters()))
        np.testing.assert_allclose(out[0, 1, 0], A, atol=5e-6)

    def test_zero_mass_is_smoothed(self):
        # q1 = [1, 0], q2 = [.5, .5], eps = 1e-6, V = 2:
        #   q̃1 = ([1, 0] + 5e-7) / (1 + 1e-6) = [0.9999995, 4.999995e-7], q̃2 = q2.
        #   KL(q̃1 ‖ q̃2) = .9999995 ln(1.999999) + 4.999995e-7 ln(9.99999e-7)
        #               = .6931464 − .0000069 = 0.6931394
        #   KL(q̃2 ‖ q̃1) = .5 ln(.5/.9999995) + .5 ln(.5/4.999995e-7)
        #               = .5(−.6931467) + .5(13.8155106) = 6.5611820
        q = np.array([[[1.0, 0.0]], [[0.5, 0.5]]], dtype=np.float32)
        out = np.asarray(kl.pairwise_kl(q, eps=1e-6))
        assert np.all(np.isfinite(out))
        np.testing.assert_allclose(out[0, 1, 0], 0.6931394, atol=2e-6)
        np.testing.assert_allclose(out[1, 0, 0], 6.5611820, rtol=2e-6)

    def test_identical_rows_zero(self):
        q = np.full((4, 3, 5), 0.2, dtype=np.float32)
        np.testing.assert_array_equal(np.asarray(kl.pairwise_kl(q)), 0.0)

    def test_summary(self):
        k = kl.pairwise_kl(_three_drafters(), eps=1e-9)
        kl_max, kl_mean = kl.kl_summary(k)
        # 12 off-diagonal entries (see test_pairs_and_positions): 4·A + 4·B and four zeros.
        np.testing.assert_allclose(float(kl_max), A, atol=1e-6)
        np.testing.assert_allclose(float(kl_mean), 4 * (A + B) / 12, atol=1e-6)
        # Pairs (0, 1) and (1, 0) only: A, 0, B, 0.
        pairs = np.zeros((3, 3, 2), bool)
        pairs[0, 1] = pairs[1, 0] = True
        kl_max, kl_mean = kl.kl_summary(k, active=pairs)
        np.testing.assert_allclose(float(kl_mean), (A + B) / 4, atol=1e-6)

    def test_summary_active_positions(self):
        # A third position where every drafter is U adds six zeros (padding, say).
        q = np.concatenate([_three_drafters(), np.full((3, 1, 2), 0.5, np.float32)], axis=1)
        k = kl.pairwise_kl(q, eps=1e-9)
        np.testing.assert_allclose(float(kl.kl_summary(k)[1]), 4 * (A + B) / 18, atol=1e-6)
        kl_max, kl_mean = kl.kl_summary(k, active=np.array([True, True, False]))
        np.testing.assert_allclose(float(kl_mean), 4 * (A + B) / 12, atol=1e-6)
        np.testing.assert_allclose(float(kl_max), A, atol=1e-6)
        kl_max, kl_mean = kl.kl_summary(k, active=np.array([False, False, True]))
        assert float(kl_max) == 0.0 and float(kl_mean) == 0.0

    def test_summary_empty(self):
        one = kl.pairwise_kl(np.full((1, 2, 3), 1 / 3, dtype=np.float32))
        assert tuple(map(float, kl.kl_summary(one))) == (0.0, 0.0)
        k = kl.pairwise_kl(_three_drafters())
        assert tuple(map(float, kl.kl_summary(k, active=np.zeros(2, bool)))) == (0.0, 0.0)
        with pytest.raises(ValueError, match="active has shape"):
            kl.kl_summary(k, active=np.ones(3, bool))

    def test_max_matrix(self):
        m = np.asarray(kl.kl_max_matrix(kl.pairwise_kl(_three_drafters(), eps=1e-9)))
        np.testing.assert_allclose(m, [[0, A, B], [B, 0, B], [A, A, 0]], atol=1e-6)

    def test_under_jit(self):
        out = jax.jit(kl.pairwise_kl)(jnp.asarray(_three_drafters()))
        np.testing.assert_allclose(np.asarray(out)[0, 1, 0], A, atol=5e-6)

    def test_asserts(self):
        with pytest.raises(AssertionError):
            kl.pairwise_kl(np.ones((2, 3), np.float32))
        bad = _three_drafters().copy()
        bad[0, 0, 0] = np.nan
        with pytest.raises(AssertionError):
            kl.pairwise_kl(bad)
        bad[0, 0, 0] = -0.5
        with pytest.raises(ValueError, match="negative"):
            kl.pairwise_kl(bad)
        with pytest.raises(ValueError, match="eps=0"):
            kl.pairwise_kl(_three_drafters(), eps=0)

    # Symmetric max: (0,1) → max(.2,.3) = .3, (0,2) → max(.5,.4) = .5, (1,2) → .1.
    MATRIX = np.array([[0, 0.2, 0.5], [0.3, 0, 0.1], [0.4, 0.1, 0]])

    @pytest.mark.parametrize(
        "ceiling, priority, expected",
        [
            (0.35, [0, 1, 2], [[0, 1], [2]]),
            (0.35, [2, 1, 0], [[2, 1], [0]]),
            (0.35, [0, 2, 1], [[0, 1], [2]]),  # 1 joins the first group that admits it.
            (0.30, [0, 1, 2], [[0, 1], [2]]),  # exactly at the ceiling: shares.
            (0.29, [0, 1, 2], [[0], [1, 2]]),
            (0.05, [0, 1, 2], [[0], [1], [2]]),
            (0.50, [0, 1, 2], [[0, 1, 2]]),
            (None, [2, 0, 1], [[2, 0, 1]]),  # switch off: one group.
        ],
    )
    def test_groups(self, ceiling, priority, expected):
        assert kl.kl_groups(self.MATRIX, ceiling, priority) == expected

    def test_groups_default_priority_and_errors(self):
        assert kl.kl_groups(self.MATRIX, 0.35) == [[0, 1], [2]]
        with pytest.raises(ValueError, match="permutation of range"):
            kl.kl_groups(self.MATRIX, 0.35, [0, 0, 1])
        with pytest.raises(ValueError, match="ceiling=0"):
            kl.kl_groups(self.MATRIX, 0.0)
        with pytest.raises(AssertionError):
            kl.kl_groups(np.full((2, 2), np.nan), 0.35)

    def test_groups_from_measured_kl(self):
        m = kl.kl_max_matrix(kl.pairwise_kl(_three_drafters(), eps=1e-9))
        assert kl.kl_groups(m, 0.35) == [[0], [1], [2]]  # every pair's max is A = .51
        assert kl.kl_groups(m, 0.52) == [[0, 1, 2]]


# =============================================================================== boundary


def _reason(**kwargs):
    with pytest.raises(SpeculativePrefixCollapseError) as info:
        should_truncate_and_repropose(**kwargs)
    return info.value


def _args(shared=0.8, depth=1.0, independent=0.5, **thresholds):
    return dict(
        shared_prefix_acceptance=shared,
        mean_truncation_depth=depth,
        independent_branch_acceptance=independent,
        **thresholds,
    )


class TestBoundary:
    def test_seed_defaults(self):
        import inspect

        params = inspect.signature(should_truncate_and_repropose).parameters
        assert params["truncation_overhead_ratio"].default == 0.15
        assert params["acceptance_floor"].default == 0.45
        assert params["depth_ceiling"].default == 2.5
        assert issubclass(SpeculativePrefixCollapseError, RuntimeError)

    # ---------------------------------------------------------------- acceptance floor 0.45

    def test_floor_itself_passes(self):
        assert should_truncate_and_repropose(**_args(shared=0.45, independent=0.0)) is True

    def test_just_below_floor(self):
        exc = _reason(**_args(shared=0.4499999, independent=0.0))
        assert exc.reason == "acceptance_below_floor"
        assert "0.4499999" in str(exc) and "floor 0.45" in str(exc)

    def test_just_above_floor(self):
        assert should_truncate_and_repropose(**_args(shared=0.4500001, independent=0.0))

    def test_seed_collapse_figure(self):
        exc = _reason(**_args(shared=0.19))
        assert exc.reason == "acceptance_below_floor"
        assert "0.19" in str(exc)

    def test_zero_acceptance_is_below_floor_not_out_of_range(self):
        assert _reason(**_args(shared=0.0)).reason == "acceptance_below_floor"

    # ---------------------------------------------------------------- depth ceiling 2.5

    def test_ceiling_itself_passes(self):
        assert should_truncate_and_repropose(**_args(depth=2.5)) is True

    def test_just_above_ceiling(self):
        exc = _reason(**_args(depth=2.5000001))
        assert exc.reason == "truncation_thrash"
        assert "2.5000001" in str(exc) and "ceiling 2.5" in str(exc)

    def test_zero_depth(self):
        assert should_truncate_and_repropose(**_args(depth=0.0)) is True

    @pytest.mark.parametrize("depth", [-0.1, float("nan")])
    def test_invalid_depth(self, depth):
        with pytest.raises(ValueError, match="mean_truncation_depth"):
            should_truncate_and_repropose(**_args(depth=depth))

    # ---------------------------------------------------------------- overhead 0.15

    @pytest.mark.parametrize(
        "shared, independent, expected",
        [
            (0.75, 0.59, True),  # gain .16
            (0.75, 0.60, False),  # gain .15: not strictly greater
            (0.75, 0.61, False),  # gain .14
            (0.65, 0.50, False),  # .65 − .5 rounds to .15000000000000002: still equal
            (0.60, 0.45, False),  # rounds to .14999999999999997
            (0.6500001, 0.5, True),
            (0.75, 0.5, True),
            (0.5, 0.9, False),  # negative gain
            (1.0, 1.0, False),
        ],
    )
    def test_overhead(self, shared, independent, expected):
        assert should_truncate_and_repropose(**_args(shared, 1.0, independent)) is expected

    def test_overhead_exact_dyadic(self):
        # 0.75 − 0.5 = 0.25 exactly in binary.
        assert not should_truncate_and_repropose(
            **_args(0.75, 1.0, 0.5, truncation_overhead_ratio=0.25)
        )
        assert should_truncate_and_repropose(
            **_args(0.75, 1.0, 0.5, truncation_overhead_ratio=0.2499)
        )

    # ---------------------------------------------------------------- range [0, 1]

    @pytest.mark.parametrize("value", [-1e-9, 1.0000001, 1.5, float("nan"), float("inf")])
    def test_shared_out_of_range(self, value):
        exc = _reason(**_args(shared=value))
        assert exc.reason == "acceptance_out_of_range"
        assert f"shared_prefix_acceptance={value!r}" in str(exc)
        assert "[0, 1]" in str(exc)

    @pytest.mark.parametrize("value", [-1e-9, 1.0000001, float("nan")])
    def test_independent_out_of_range(self, value):
        exc = _reason(**_args(independent=value))
        assert exc.reason == "acceptance_out_of_range"
        assert f"independent_branch_acceptance={value!r}" in str(exc)

    @pytest.mark.parametrize("shared, independent", [(1.0, 0.0), (1.0, 1.0), (0.45, 0.0)])
    def test_range_edges_are_inside(self, shared, independent):
        should_truncate_and_repropose(**_args(shared=shared, independent=independent))

    def test_check_order(self):
        # Out of range wins over depth thrash; floor wins over depth thrash (the seed's order).
        assert _reason(**_args(shared=2.0, depth=9.0)).reason == "acceptance_out_of_range"
        assert _reason(**_args(shared=0.1, depth=9.0)).reason == "acceptance_below_floor"
        assert _reason(**_args(shared=0.1, depth=float("nan"))).reason == "acceptance_below_floor"

    def test_numpy_scalars(self):
        assert should_truncate_and_repropose(np.float32(0.8), np.int64(1), np.float64(0.5)) is True

    def test_error_pickles_with_reason(self):
        exc = _reason(**_args(depth=3.0))
        again = pickle.loads(pickle.dumps(exc))
        assert again.reason == "truncation_thrash" and str(again) == str(exc)
        with pytest.raises(ValueError, match="reason="):
            SpeculativePrefixCollapseError("x", "bogus")

    # ---------------------------------------------------------------- records

    def test_evaluate_boundary(self):
        log = CollapseLog()
        stats = {
            "code": BoundaryStats(0.8, 1.0, 0.5),
            "prose": {
                "shared_prefix_acceptance": 0.3,
                "mean_truncation_depth": 1.0,
                "independent_branch_acceptance": 0.2,
            },
            "reasoning": BoundaryStats(0.7, 4.0, 0.5),
            "bad": BoundaryStats(float("nan"), 1.0, 0.5),
            "close": BoundaryStats(0.6, 1.0, 0.5),
        }
        out = evaluate_boundary(stats, log=log)
        assert [d.branch_id for d in out] == list(stats)
        assert [d.decision for d in out] == [True, False, False, False, False]
        assert [d.reason for d in out] == [
            None,
            "acceptance_below_floor",
            "truncation_thrash",
            "acceptance_out_of_range",
            None,
        ]
        assert out[0].shared_prefix_acceptance == 0.8 and out[0].message is None
        assert out[2].mean_truncation_depth == 4.0 and "4.0" in out[2].message
        assert [d.collapsed for d in out] == [False, True, True, True, False]
        assert log.counts() == {
            "acceptance_out_of_range": 1,
            "acceptance_below_floor": 1,
            "truncation_thrash": 1,
        }
        assert log.total == 3 and log["truncation_thrash"] == 1
        assert [e[0] for e in log.events] == ["prose", "reasoning", "bad"]

    def test_evaluate_boundary_sequence_and_thresholds(self):
        out = evaluate_boundary([BoundaryStats(0.4, 1.0, 0.1)], acceptance_floor=0.3)
        assert out[0].branch_id == 0 and out[0].decision is True
        with pytest.raises(ValueError, match="lack key"):
            evaluate_boundary([{"shared_prefix_acceptance": 0.5}])
        with pytest.raises(ValueError, match="cannot read boundary statistics"):
            evaluate_boundary([object()])


class _Branch:
    def __init__(self, shared, depth, independent):
        self.shared_acceptance = shared
        self.truncation_depth = depth
        self.independent_acceptance = independent
        self.collapses = []

    def record_collapse(self, exc):
        self.collapses.append(exc)


class _Consensus:
    def __init__(self):
        self.calls = []

    def fallback(self, branches, verifier):
        self.calls.append(("fallback", list(branches), verifier))
        return "fallback"

    def commit(self, branches, verifier):
        self.calls.append(("commit", list(branches), verifier))
        return "commit"


class TestExecuteParallelPlan:
    def test_all_collapse_falls_back(self):
        branches = [_Branch(0.19, 1.0, 0.1), _Branch(0.8, 3.0, 0.1)]
        cons, log = _Consensus(), CollapseLog()
        assert execute_parallel_plan(branches, "V", cons, log=log) == "fallback"
        assert cons.calls == [("fallback", branches, "V")]
        assert [e.reason for b in branches for e in b.collapses] == [
            "acceptance_below_floor",
            "truncation_thrash",
        ]
        assert log.total == 2

    def test_no_gain_falls_back_without_collapse(self):
        branches = [_Branch(0.6, 1.0, 0.55)]
        cons = _Consensus()
        assert execute_parallel_plan(branches, "V", cons) == "fallback"
        assert branches[0].collapses == []

    def test_commits_passing_branches_in_order(self):
        branches = [_Branch(0.8, 1.0, 0.5), _Branch(0.1, 1.0, 0.0), _Branch(0.9, 2.5, 0.2)]
        cons = _Consensus()
        seen = []
        out = execute_parallel_plan(branches, "V", cons, on_decisions=seen.extend)
        assert out == "commit"
        assert cons.calls == [("commit", [branches[0], branches[2]], "V")]
        assert len(branches[1].collapses) == 1 and branches[0].collapses == []
        assert [d.decision for d in seen] == [True, False, True]


# =============================================================================== consensus


class TestConsensus:
    def test_vote_weight(self):
        assert vote_weight(3, 8, 1, agreement_weighted=False) == 3 / 8
        assert vote_weight(3, 8, 1, agreement_weighted=True) == 3 / 4
        assert vote_weight(0, 4, 2, agreement_weighted=True) == 0.0
        assert vote_weight(4, 4, 0, agreement_weighted=False) == 1.0

    def test_vote_weight_zero_over_zero(self):
        assert vote_weight(0, 0, 0, agreement_weighted=False) == 1.0
        assert vote_weight(0, 0, 0, agreement_weighted=True) == 1.0
        assert vote_weight(0, 5, 0, agreement_weighted=True) == 1.0  # never tested: no penalty
        assert vote_weight(0, 5, 0, agreement_weighted=False) == 0.0

    @pytest.mark.parametrize(
        "args, match",
        [
            ((-1, 4, 0), "accepted=-1"),
            ((3, 4, 2), "exceeds proposed"),
            ((1, float("nan"), 0), "proposed=nan"),
        ],
    )
    def test_vote_weight_errors(self, args, match):
        with pytest.raises(ValueError, match=match):
            vote_weight(*args, agreement_weighted=True)

    def test_commit(self):
        d = decide(["a", "a", "b"], [1.0, 0.5, 1.0])
        # support(a) = (1 + .5)/3 = .5 ≥ .5; support(b) = 1/3.
        assert d == consensus.ConsensusDecision("a", 0.5, 0, False, (0.5, 0.5, 1 / 3))

    def test_fallback(self):
        d = decide(["a", "a", "b"], [0.4, 0.5, 1.0])
        # support(a) = .9/3 = .3, support(b) = 1/3: plurality b, below .5.
        assert d.plurality_index == 2 and d.fallback and d.committed is None
        assert d.support == pytest.approx(1 / 3)

    def test_not_renormalised(self):
        d = decide(["x", "x", "x"], [0.4, 0.4, 0.4])
        assert d.support == pytest.approx(0.4) and d.fallback

    def test_ties_lowest_index(self):
        d = decide(["a", "b"], [1.0, 1.0])
        assert d.plurality_index == 0 and d.committed == "a" and d.support == 0.5
        d = decide(["a", "b", "b", "a"], [0.5, 0.25, 0.25, 0.0])
        assert d.plurality_index == 0 and d.support == 0.125

    def test_threshold_edges(self):
        assert not decide(["a"], [1.0], threshold=1.0).fallback
        assert decide(["a"], [0.999], threshold=1.0).fallback
        assert not decide(["a", "b"], [0.5, 1.0], threshold=0.25).fallback

    def test_pluggable_agreement(self):
        cands = ["a b", "a  b", "c"]
        assert decide(cands, [1, 1, 1]).support == pytest.approx(1 / 3)
        d = decide(cands, [1, 1, 1], agreement=consensus.whitespace_insensitive_match)
        assert d.support == pytest.approx(2 / 3) and d.committed == "a b"
        assert exact_match("x", "x") and not exact_match("x", "x ")

    def test_raw_vs_agreement_weighted(self):
        # Three agreeing branches; each accepted 3 of 12 proposed tokens, 1 rejection (the
        # rest discarded after a truncation). Raw weight .25 → fallback; weighted .75 → commit.
        raw = [vote_weight(3, 12, 1, agreement_weighted=False)] * 3
        weighted = [vote_weight(3, 12, 1, agreement_weighted=True)] * 3
        assert decide(["s"] * 3, raw).fallback
        assert decide(["s"] * 3, weighted).committed == "s"

    @pytest.mark.parametrize(
        "cands, weights, threshold, match",
        [
            (["a"], [0.5, 0.5], 0.5, "1 candidates but 2 weights"),
            ([], [], 0.5, "empty"),
            (["a"], [1.1], 0.5, r"weights\[0\]=1.1"),
            (["a"], [-0.1], 0.5, r"weights\[0\]=-0.1"),
            (["a"], [float("nan")], 0.5, r"weights\[0\]=nan"),
            (["a"], [1.0], 0.0, "threshold=0.0"),
            (["a"], [1.0], 1.5, "threshold=1.5"),
        ],
    )
    def test_decide_errors(self, cands, weights, threshold, match):
        with pytest.raises(ValueError, match=match):
            decide(cands, weights, threshold=threshold)


# =============================================================================== journal


def test_public_modules_import():
    assert boundary.REASONS == (
        "acceptance_out_of_range",
        "acceptance_below_floor",
        "truncation_thrash",
    )
    assert math.isclose(field_report.KL_CEILING, 0.35)


def test_policy_names_grammar():
    from specjax.policy import names

    assert names.canonical_name("p1t1a1k1") == "all_on"
    assert names.canonical_name(" auto ") == "auto" and names.is_router("oracle")
    assert (
        names.canonical_name(
            {
                "prefix_partitioning": True,
                "truncate_and_attribute": True,
                "agreement_weighted_consensus": True,
                "kl_ceiling": 0.5,
            }
        )
        == "all_on_kl0.5"
    )
    assert names.parse("single:code") == names.single_name("code") == "single:code"
    assert names.single_drafter("single:code") == "code"
    assert names.single_drafter("all_on") is None
    assert names.kl_ceiling("all_on_kl0.5") == 0.5 and names.kl_ceiling("all_on") == 0.35
    assert names.kl_ceiling("naive") is None and names.kl_ceiling("auto") is None
    assert names.kl_ceiling("not a policy") is None
    for bad in ("wholesale", "single:", 3, {"kl": 0.3}):
        with pytest.raises(ConfigError, match="auto, oracle"):
            names.parse(bad)
    assert names.label("not a policy") == "not a policy" and names.label(None) == "–"
    shuffled = [
        "single:code",
        "oracle",
        "p1t0a1k0",
        "naive_plus_kl_ceiling",
        "auto",
        "all_on",
        "naive",
    ]
    assert sorted(shuffled, key=names.order_key) == [
        "naive",
        "all_on",
        "naive_plus_kl_ceiling",
        "auto",
        "oracle",
        "p1t0a1k0",
        "single:code",
    ]
    assert len(names.ABLATION_NAMES) == 10 and names.FIELD_REPORT_NAMES[-2:] == names.ROUTERS
