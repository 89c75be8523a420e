"""Tests of the engine-independent policy parts, naming and grouping: the switches, policy
names and KL (the boundary and consensus decisions: test_policy_decisions.py; the journal:
test_journal.py).

Run: `.venv/bin/pytest tests/test_policy_parts.py -q -p no:xdist`.
"""

from __future__ import annotations

import math
import sys
import types
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax import field_report
from specjax.errors import ConfigError
from specjax.policy import boundary, kl, switches
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


# =============================================================================== modules and names


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
    for bad in ("wholesale", "single:", 3, {"kl": 0.3}, "auto:x", "set:a+a", "set:a+"):
        with pytest.raises(ConfigError, match="auto:teacher_forced, oracle"):
            names.parse(bad)
    # `auto` runs with the run's score, `auto:<score>` with its own; a fixed set's members.
    assert names.auto_score("auto", "own") == "own"
    assert names.auto_score("auto:teacher_forced", "own") == "teacher_forced"
    assert names.auto_score("oracle", "own") is None and names.is_router("auto:own")
    assert names.parse(" set:lookup + eagle") == "set:lookup+eagle"
    assert names.set_drafters("set:lookup+eagle") == ("lookup", "eagle")
    assert names.set_drafters("single:lookup") is None
    assert names.label("not a policy") == "not a policy" and names.label(None) == "–"
    shuffled = [
        "single:code",
        "oracle",
        "p1t0a1k0",
        "naive_plus_kl_ceiling",
        "auto",
        "all_on",
        "set:code+prose",
        "auto:own",
        "naive",
    ]
    assert sorted(shuffled, key=names.order_key) == [
        "naive",
        "all_on",
        "naive_plus_kl_ceiling",
        "auto",
        "oracle",
        "auto:own",
        "p1t0a1k0",
        "set:code+prose",
        "single:code",
    ]
    assert len(names.ABLATION_NAMES) == 10 and names.FIELD_REPORT_NAMES[-2:] == ("auto", "oracle")


# =============================================================================== a fifth switch


def _with_fifth_switch(monkeypatch):
    """The switches module with one more `TABLE` entry (the recipe: one entry), loaded
    apart from the real one."""
    src = Path(switches.__file__).read_text()
    anchor = "\n)\n#: Switch names in code order."
    assert src.count(anchor) == 1
    entry = '\n    Switch("extra_invariant", "x", "a fifth switch (a test\'s)."),'
    mod = types.ModuleType("switches_with_a_fifth")
    monkeypatch.setitem(sys.modules, mod.__name__, mod)  # dataclasses look the module up
    exec(
        compile(src.replace(anchor, entry + anchor), "switches_with_a_fifth", "exec"), mod.__dict__
    )
    return mod


def test_a_fifth_switch_is_one_table_entry_and_stored_codes_still_parse(monkeypatch):
    mod = _with_fifth_switch(monkeypatch)
    policy = mod.Policy
    assert mod.SWITCHES[-1] == "extra_invariant" and len(mod.all_combinations()) == 32
    # A stored 4-letter code: the same policy, the fifth switch off, the same spelling.
    old = policy.from_name("p1t0a1k0")
    assert old == policy(True, False, True, None, False) and old.name == "p1t0a1k0"
    assert policy.from_name("p1t0a1k0x0") == old
    new = policy.from_name("p1t0a1k0x1")
    assert new.extra_invariant and new.name == "p1t0a1k0x1"
    assert policy.from_name("naive_plus_extra_invariant").code == "p0t0a0k0x1"
    assert policy.from_name("all_on_kl0.5") == policy(True, True, True, 0.5, True)
    for p in mod.all_combinations(kl_ceiling=0.2):
        assert policy.from_name(p.name) == p and policy.from_name(p.code).bits == p.bits
    # A stored dict of the four switches still builds the policy (the fifth off).
    assert policy(**old.to_dict()) == old
    with pytest.raises(ConfigError):
        policy.from_name("p1t0a1")  # fewer than the four stored codes name
    with pytest.raises(ConfigError):
        policy.from_name("p1t0a1k0y1")  # not the table's fifth letter
