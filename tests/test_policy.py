"""Policies end to end on a synthetic 4-drafter, 3-tokenizer deployment (SPEC §4–6, §9).

Losslessness: for every one of the 16 switch combinations, every distinct branch the
policy builds (its drafters as slots, its rule) generates 100,000 rows whose first three
tokens are tested by χ² against the exact target law (α = 1e-3, fixed seeds, as in
test_verify). Switch 3 changes only the vote, switch 4 only which drafters share a branch,
so the distinct (rule, branch) pairs are tested once each and every policy is mapped onto
them (asserted below).
"""

from __future__ import annotations

import collections
import zlib

import numpy as np
import pytest
from test_verify import ALPHA, LENGTH, START, chi2_pvalue

from specjax import testing as suite
from specjax.engine.generate import row_keys_for, speculative_generate
from specjax.engine.spec import EngineConfig
from specjax.policy.boundary import (
    REASONS,
    SpeculativePrefixCollapseError,
    should_truncate_and_repropose,
)
from specjax.policy.counters import RunStats
from specjax.policy.journal import PlanJournal
from specjax.policy.layout import branch_layout, branch_slots
from specjax.policy.plan import _kl_on_prefix, run_plans
from specjax.policy.plan_config import PlanConfig
from specjax.policy.switches import Policy, all_combinations
from specjax.testing import sequence_distribution

N = 100_000


@pytest.fixture(scope="module")
def deployment():
    return suite.make_deployment("random", seed=7, fourth=True)


def _layouts(dep):
    cfg = PlanConfig(gamma=2, bucket=8)
    kl = _kl_on_prefix(dep, cfg, [dep.encode("abcabdca")], RunStats(k=4, gamma=2))
    out = {}
    for pol in all_combinations():
        _, branches, rule = branch_layout(dep, pol, kl, set(), 3)
        out[pol.name] = (rule, [tuple(b) for b in branches])
    return out


# The naive shared block over all four drafters and the partitioned two-drafter tree run in
# `make test`; the other distinct (rule, branch) pairs (~10 s of compilation each) in
# `make test-all`.
_REQUIRED = (("shared_block", (0, 1, 2, 3)), ("token_tree", (0, 3)))


@pytest.mark.parametrize("part", ["required", pytest.param("rest", marks=pytest.mark.slow)])
def test_every_policy_generates_losslessly(deployment, part):
    dep, setup = deployment
    layouts = _layouts(dep)
    assert len(layouts) == 16
    distinct = sorted({(rule, b) for rule, bs in layouts.values() for b in bs})
    # The naive shared block over all four drafters and the partitioned two-drafter set
    # must both be among what is tested.
    assert all(r in distinct for r in _REQUIRED)
    todo = list(_REQUIRED) if part == "required" else [d for d in distinct if d not in _REQUIRED]
    exact = sequence_distribution(setup.v_table, 1.0, START, LENGTH)
    prompts = [[START]] * N
    dprompts = [[p] * N for p in (enc("a") for enc in dep.drafter_encode)]
    pvalues = {}
    for rule, branch in todo:
        slots = np.tile(branch_slots([list(branch)]), (N, 1))
        cfg = EngineConfig(
            gamma=2, rule=rule, verifier_temperature=1.0, n_slots=len(branch), max_new_tokens=LENGTH
        )
        res = speculative_generate(
            cfg,
            dep.verifier,
            dep.v_params,
            dep.drafters,
            dep.d_data,
            prompts,
            dprompts,
            row_keys_for(zlib.crc32(f"{rule}{branch}".encode()), N),
            slots=slots,
        )
        pvalues[(rule, branch)] = chi2_pvalue(res.tokens[:, 1 : 1 + LENGTH], exact)
    print({f"{r}{b}": f"{p:.3g}" for (r, b), p in pvalues.items()})
    bad = {k: v for k, v in pvalues.items() if v < ALPHA}
    assert not bad, f"χ² rejects losslessness (p < {ALPHA}) for {bad}"


_GREEDY_CFG = PlanConfig(
    gamma=3, verifier_temperature=0.0, plan_steps=2, max_step_tokens=6, bucket=16
)
_GREEDY_PROMPTS = ["ab", "c", "dda", "b"]
# naive, all_on and the two switches that change the branch layout run in `make test`
# (~6 s of compilation per policy); the other twelve in `make test-all`.
_GREEDY_FAST = ("naive", "all_on", "naive_plus_prefix_partitioning", "naive_plus_kl_ceiling")


@pytest.fixture(scope="module")
def greedy_reference(deployment):
    dep, _ = deployment
    return run_plans(dep, _GREEDY_CFG, _GREEDY_PROMPTS)[0]


@pytest.mark.parametrize(
    "pol",
    [
        p if p.name in _GREEDY_FAST else pytest.param(p, marks=pytest.mark.slow)
        for p in all_combinations()
    ],
    ids=lambda p: p.name,
)
def test_every_policy_is_greedy_exact(deployment, greedy_reference, pol):
    """τ_verifier = 0: all 16 policies commit the verifier's greedy plan, fallback or not."""
    dep, _ = deployment
    texts, stats = run_plans(dep, _GREEDY_CFG, _GREEDY_PROMPTS, policy=pol)
    assert texts == greedy_reference, pol.name
    assert stats.steps == 2 * len(_GREEDY_PROMPTS)


@pytest.mark.slow  # ~20 s of compilation (its χ² case, the two-drafter tree, runs by default)
def test_a_fixed_drafter_set_is_greedy_exact(deployment, greedy_reference):
    """``set:<a>+<b>`` (`run_plans(single=[(a, b), …])`): one branch per plan, the two
    drafters a token tree under the plan's tree rule, commits the verifier's greedy plan
    (its χ² case is the partitioned two-drafter tree above); a repeated drafter is refused."""
    dep, _ = deployment
    n = len(_GREEDY_PROMPTS)
    texts, stats = run_plans(dep, _GREEDY_CFG, _GREEDY_PROMPTS, single=[(0, 3)] * n)
    assert texts == greedy_reference
    assert stats.fallbacks == 0 and stats.steps == 2 * n
    # Both drafters drafted in every plan (one branch of two chains).
    assert np.all(np.asarray(stats.counts["drafter_tokens"])[:, [0, 3]] > 0)
    assert not np.asarray(stats.counts["drafter_tokens"])[:, [1, 2]].any()
    with pytest.raises(ValueError, match="repeats a drafter"):
        run_plans(dep, _GREEDY_CFG, _GREEDY_PROMPTS, single=[(0, 0)] * n)


def test_journal_exactly_once_under_injected_branch_failure(deployment, tmp_path):
    dep, _ = deployment
    cfg = PlanConfig(gamma=2, verifier_temperature=0.0, plan_steps=3, max_step_tokens=5, bucket=16)
    prompts = ["ab", "cd", "a"]
    ids = ["p0", "p1", "p2"]
    ref, _ = run_plans(dep, cfg, prompts, policy=Policy.all_on())

    def fail(step, row):
        if step == 1 and row == 2:
            raise RuntimeError("branch died mid-step")

    path = tmp_path / "journal.jsonl"
    with PlanJournal(path) as j:
        with pytest.raises(RuntimeError, match="mid-step"):
            run_plans(
                dep, cfg, prompts, policy=Policy.all_on(), journal=j, plan_ids=ids, fail_hook=fail
            )
        assert [len(j.committed_steps(p)) for p in ids] == [2, 2, 1]
    with PlanJournal(path) as j:
        texts, _ = run_plans(dep, cfg, prompts, policy=Policy.all_on(), journal=j, plan_ids=ids)
        for p in ids:
            assert [s.step_index for s in j.committed_steps(p)] == [0, 1, 2]
    assert texts == ref
    lines = path.read_text().splitlines()
    assert len(lines) == 9  # 3 plans × 3 steps, each exactly once


def test_naive_records_collapses_with_reasons(deployment):
    dep, _ = deployment
    cfg = PlanConfig(gamma=3, verifier_temperature=1.0, plan_steps=2, max_step_tokens=6, bucket=16)
    _, stats = run_plans(dep, cfg, ["ab", "cd", "a", "bb"], policy=Policy.naive())
    assert len(stats.decisions) == 2
    for batch in stats.decisions:
        assert len(batch) == 1 and batch[0].branch_id == (0, 1, 2, 3)
    assert np.isfinite(stats.kl_max).all()


def test_collapse_log_matches_recomputed_boundary_verdicts(deployment):
    """Every branch's recorded step decision is the boundary's verdict recomputed here from
    the branch's recorded inputs, and the collapse log counts exactly those collapses, by
    reason. (The log and the records are written by one call, so comparing them with each
    other — a count with itself — would prove nothing.)"""
    dep, _ = deployment
    cfg = PlanConfig(gamma=3, verifier_temperature=1.0, plan_steps=2, max_step_tokens=6, bucket=16)
    _, stats = run_plans(dep, cfg, ["ab", "cd", "a", "bb"], policy=Policy.naive())
    assert stats.branch_records, "no branch reached the step decision"
    expected = collections.Counter()
    for rec in stats.branch_records:
        try:
            verdict = should_truncate_and_repropose(
                rec["s"], rec["d"], rec["i"], **cfg.thresholds.kwargs()
            )
        except SpeculativePrefixCollapseError as e:
            verdict = e.reason
            expected[e.reason] += 1
        assert rec["decision"] == verdict, rec
    assert stats.collapses.counts() == {r: expected[r] for r in REASONS}


def test_plan_rule_block_verification_reaches_one_drafter_branches(
    deployment, greedy_reference, monkeypatch
):
    """`PlanConfig(rule='block_verification')`: the engine calls of one-drafter branches run
    block verification (several drafters keep switch 2's rule), and at τ 0 the plans commit
    the verifier's greedy plan as under the default rule."""
    import dataclasses

    from specjax.errors import ConfigError
    from specjax.policy import engine_calls

    dep, _ = deployment
    seen = []
    real = engine_calls.EngineConfig

    def spy(*args, **kwargs):
        cfg = real(*args, **kwargs)
        seen.append((cfg.rule, cfg.n_slots))
        return cfg

    monkeypatch.setattr(engine_calls, "EngineConfig", spy)
    cfg = dataclasses.replace(_GREEDY_CFG, rule="block_verification")
    for pol in (Policy.all_on(), Policy.from_name("naive")):
        texts, _ = run_plans(dep, cfg, _GREEDY_PROMPTS, policy=pol)
        assert texts == greedy_reference, pol.name
    assert ("block_verification", 1) in seen and ("rejection", 1) not in seen
    assert {r for r, s in seen if s > 1} <= {"token_tree", "shared_block"}
    with pytest.raises(ConfigError, match="rule: got 'rejection'"):
        PlanConfig(rule="rejection")


def test_grid_rule_block_verification_reaches_the_plan_config():
    from ml_collections import ConfigDict

    from specjax.runner.plans_setup import plan_config

    config = ConfigDict(
        dict(
            plan_steps=2,
            max_step_tokens=4,
            consensus="seed",
            consensus_threshold=0.5,
            consensus_cost=1.0,
            bucket=16,
        )
    )
    assert plan_config(config, {"rule": "block_verification"}).rule == "block_verification"
    assert plan_config(config, {"rule": "default"}).rule is None
