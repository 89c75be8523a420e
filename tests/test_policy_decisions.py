"""Tests of the engine-independent policy parts, the decisions: the truncate-and-repropose
boundary, the parallel plan it drives, and the consensus vote (switches, names and KL:
test_policy_parts.py).

Run: `.venv/bin/pytest tests/test_policy_decisions.py -q -p no:xdist`.
"""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from specjax.policy import consensus
from specjax.policy.boundary import (
    BoundaryStats,
    CollapseLog,
    SpeculativePrefixCollapseError,
    evaluate_boundary,
    execute_parallel_plan,
    should_truncate_and_repropose,
)
from specjax.policy.consensus import decide, exact_match, vote_weight

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
