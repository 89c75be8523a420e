"""The seed's step decision in the runner, the one cost function, and `auto` (SPEC §5–7).

* the runner's step decisions are `execute_parallel_plan`'s: replaying the recorded
  per-branch statistics through it gives the same committed branch or fallback;
* `metrics.itemised_cost` against hand-computed cases;
* `auto` and the oracle router are lossless: every drafter set `auto` can choose passes the
  χ² test against the exact target (α = 1e-3, 100,000 rows, as in test_verify), and at
  τ = 0 (and under the coupled rule at τ = 1) they commit the verifier's own plan.
"""

from __future__ import annotations

import itertools
import re
import zlib

import numpy as np
import pytest
from test_verify import ALPHA, LENGTH, START, chi2_pvalue

from specjax import execute_parallel_plan, metrics
from specjax import testing as suite
from specjax.engine.generate import row_keys_for, speculative_generate
from specjax.engine.spec import EngineConfig
from specjax.errors import ConfigError
from specjax.measure.prices import measure_prices
from specjax.policy.auto import AutoRouter
from specjax.policy.boundary import BoundaryThresholds, replay_step_decisions
from specjax.policy.consensus import BranchOutcome, SeedConsensus
from specjax.policy.layout import branch_slots
from specjax.policy.plan import run_plans
from specjax.policy.plan_config import PlanConfig
from specjax.policy.summary import summarize
from specjax.policy.switches import Policy
from specjax.testing import sequence_distribution

N = 100_000


@pytest.fixture(scope="module")
def deployment():
    return suite.make_deployment("random", seed=7, fourth=True)


@pytest.mark.parametrize("policy", ["naive", "all_on", "all_on_minus_truncate_and_attribute"])
def test_replayed_branch_statistics_give_the_runners_decisions(deployment, policy):
    dep, _ = deployment
    # A loose floor and ceiling so that both commits and fallbacks occur.
    th = BoundaryThresholds(acceptance_floor=0.1, depth_ceiling=3.0, truncation_overhead_ratio=-0.5)
    cfg = PlanConfig(
        gamma=3,
        verifier_temperature=1.0,
        plan_steps=3,
        max_step_tokens=6,
        bucket=16,
        thresholds=th,
        n_branches=3,
    )
    _, stats = run_plans(dep, cfg, ["ab", "c", "dda", "b", "ca"], policy=Policy.from_name(policy))
    outcomes = {}
    for r in stats.branch_records:
        outcomes.setdefault((r["step"], r["plan"]), []).append(
            BranchOutcome(r["branch"], str(r["candidate"]), r["w"], r["s"], r["d"], r["i"])
        )
    decided = {"commit": 0, "fallback": 0}
    for s in stats.step_records:
        got = execute_parallel_plan(
            outcomes[(s["step"], s["plan"])], None, SeedConsensus(), **th.kwargs()
        )
        assert (None if got is None else got.index) == s["seed_commit"], s
        decided["fallback" if got is None else "commit"] += 1
    assert stats.fallbacks == decided["fallback"]  # the run obeyed the seed's rule
    replay = replay_step_decisions(stats.branch_records, th)
    assert replay["fallbacks"] == decided["fallback"]
    assert replay["steps"] == len(stats.step_records) == 15


def test_quorum_rule_and_its_recorded_alternative(deployment):
    dep, _ = deployment
    base = dict(
        gamma=3,
        verifier_temperature=1.0,
        plan_steps=2,
        max_step_tokens=6,
        bucket=16,
        rule="coupled",
    )
    seed_run = run_plans(dep, PlanConfig(**base), ["ab", "c", "dda"], policy=Policy.all_on())[1]
    quorum_run = run_plans(
        dep, PlanConfig(consensus="quorum", **base), ["ab", "c", "dda"], policy=Policy.all_on()
    )[1]
    # Coupled rule: the text does not depend on the decision, so each run records exactly
    # what the other rule decided.
    q_fb = sum(s["quorum_commit"] is None for s in seed_run.step_records)
    assert quorum_run.fallbacks == q_fb
    s_fb = sum(s["seed_commit"] is None for s in quorum_run.step_records)
    assert seed_run.fallbacks == s_fb


def test_itemised_cost_by_hand():
    counts = {
        "verifier_calls": np.array([10, 4]),
        "verifier_prefills": np.array([2, 1]),
        "drafter_tokens": np.array([[40, 8], [0, 12]]),
        "drafter_prefills": np.array([[2, 2], [0, 1]]),
        "kl_passes": np.array([[1, 1], [0, 0]]),
        "consensus_rounds": np.array([1, 0]),
    }
    cost = metrics.itemised_cost(counts, [0.05, 0.25], consensus_cost=2.0)
    # plan 0: 10 + 2 + (40·0.05 + 8·0.25) + (2·0.05 + 2·0.25) + (0.05 + 0.25) + 1·2
    assert cost["total"][0] == pytest.approx(10 + 2 + 4.0 + 0.6 + 0.3 + 2.0)
    # plan 1: 4 + 1 + 12·0.25 + 1·0.25
    assert cost["total"][1] == pytest.approx(4 + 1 + 3.0 + 0.25)
    assert cost["drafter_tokens"][0] == pytest.approx(4.0)
    assert set(cost) == set(metrics.COST_ITEMS) | {"total"}
    assert cost["verifier_tokens"].tolist() == [0, 0]  # counters without the item
    counts["verifier_tokens"] = np.array([30, 12])
    priced = metrics.itemised_cost(counts, [0.05, 0.25], consensus_cost=2.0, score_cost=0.1)
    np.testing.assert_allclose(priced["total"] - cost["total"], [3.0, 1.2])
    assert (
        metrics.itemised_cost(counts, [0.05, 0.25], 2.0)["total"].tolist() == cost["total"].tolist()
    )  # the seed's model: scored tokens free
    with pytest.raises(ValueError, match="score_cost"):
        metrics.itemised_cost(counts, [0.05, 0.25], score_cost=-1.0)
    with pytest.raises(ValueError, match="c="):
        metrics.itemised_cost(counts, [0.05, -1.0])
    with pytest.raises(ValueError, match="drafters"):
        metrics.itemised_cost(counts, [0.05])


def test_predicted_seconds_are_counts_times_prices(deployment):
    """`predicted_seconds` = Σ priced forwards × machine prices, exactly (per plan too); the
    forwards are counted by shape as the engine runs them; bad prices are one-line errors."""
    dep, _ = deployment
    cfg = PlanConfig(gamma=3, verifier_temperature=1.0, plan_steps=2, max_step_tokens=5, bucket=16)
    _, st = run_plans(dep, cfg, ["ab", "c", "dd"], single=1)
    keys = sorted(st.priced)
    prices = {k: 1e-3 * (i + 1) ** 2 for i, k in enumerate(keys)}
    row = summarize(st, dep.names, [d.cost for d in dep.drafters], prices=prices)
    by_hand = sum(float(st.priced[k].sum()) * prices[k] for k in keys)
    assert row["predicted_seconds"] == pytest.approx(by_hand, rel=1e-12)
    assert sum(row["per_plan"]["predicted_seconds"]) == pytest.approx(by_hand, rel=1e-12)
    assert row["predicted_over_wall"] == pytest.approx(by_hand / st.counts["seconds"].sum())
    # Drafter 1 alone, γ = 3: per round one consume forward and γ − 1 one-token forwards.
    name = dep.names[1]
    one = [k for k in keys if k.startswith(f"draft:{name}:1x")]
    consume = [k for k in keys if k.startswith(f"draft:{name}:2x")]
    assert len(one) == len(consume) == 1
    assert st.priced[one[0]].sum() == pytest.approx(2 * st.priced[consume[0]].sum())
    verify = [k for k in keys if k.startswith("verify:verifier:4x")]  # 1 + γ
    assert verify and st.priced[verify[0]].sum() >= st.rounds / 4  # ≥ one trip per 4 rows
    forwards = [k for k in keys if metrics.parse_price_key(k)[0] in ("verify", "draft")]
    assert {k.split(":")[1] for k in forwards} == {"verifier", name}  # nobody else ran
    # The rest of every loop trip: one round key per distinct call, one count per trip of
    # the forwards' loop; the state programs (gather, commit, place a prefill) by run.
    rounds = [k for k in keys if k.startswith("round:")]
    spec_rounds = [k for k in rounds if f".{name}3." in k]
    assert spec_rounds and all(metrics.parse_price_key(k)[2] == 4 for k in spec_rounds)
    assert sum(st.priced[k].sum() for k in spec_rounds) == pytest.approx(
        sum(st.priced[k].sum() for k in verify)
    )
    states = [k for k in keys if k.startswith("state:")]
    assert {k.split(":")[1].split(".")[0] for k in states} >= {"gather", "commit"}
    assert set(keys) == set(forwards) | set(rounds) | set(states)
    timed = measure_prices(dep, spec_rounds[:1] + states[:1], repeats=1)
    assert all(np.isfinite(v) and v > 0 for v in timed.values())
    bad = [
        ({**prices, keys[0]: -1.0}, "got -1.0, allowed: a finite number of seconds"),
        ({**prices, keys[0]: float("nan")}, "got nan"),
        ({**prices, "verify:verifier:0x1@8": 1.0}, "price key: got 'verify:verifier:0x1@8'"),
        ({k: v for k, v in prices.items() if k != keys[0]}, "no price for"),
    ]
    for table, message in bad:
        with pytest.raises(ValueError, match=re.escape(message)) as err:
            summarize(st, dep.names, [d.cost for d in dep.drafters], prices=table)
        assert "\n" not in str(err.value)
    measured = measure_prices(dep, keys[:2], reps=2, repeats=1)  # warm loops, cached
    assert set(measured) == set(keys[:2]) and all(v >= 0 for v in measured.values())
    assert measure_prices(dep, keys[:2]) == measured
    with pytest.raises(ValueError, match="drafter 'nobody' is not in the deployment"):
        measure_prices(dep, ["draft:nobody:1x1@8"])


def test_autoregressive_costs_one_call_per_token_plus_prefills(deployment):
    dep, _ = deployment
    cfg = PlanConfig(gamma=2, verifier_temperature=0.0, plan_steps=2, max_step_tokens=5, bucket=16)
    _, st = run_plans(dep, cfg, ["ab", "c"])
    cost = metrics.itemised_cost(st.counts, [d.cost for d in dep.drafters])
    # One call per token, one prefill per plan: later steps continue the carried cache.
    assert st.steps == 4 and cost["total"].sum() == st.tokens + 2


def test_shared_and_separate_verifier_calls(deployment):
    dep, _ = deployment
    commit_all = BoundaryThresholds(
        acceptance_floor=0.0, depth_ceiling=1e9, truncation_overhead_ratio=-1.0
    )
    base = dict(
        gamma=2,
        verifier_temperature=1.0,
        plan_steps=1,
        max_step_tokens=6,
        bucket=16,
        n_branches=3,
        thresholds=commit_all,
    )
    a = run_plans(dep, PlanConfig(**base), ["ab", "c"], policy=Policy.naive())[1]
    b = run_plans(
        dep, PlanConfig(share_verifier_call=False, **base), ["ab", "c"], policy=Policy.naive()
    )[1]
    assert a.fallbacks == b.fallbacks == 0
    assert a.rounds == b.rounds
    # Separate: every branch's rounds are calls; shared: each round of a plan is one call
    # for all its branches (the plan's longest branch).
    assert b.verifier_calls == b.rounds
    assert a.verifier_calls < b.verifier_calls
    # One prefill per plan either way: branches start from copies of the plan's cache.
    assert a.counts["verifier_prefills"].sum() == 2 and b.counts["verifier_prefills"].sum() == 2


def test_auto_chooses_by_expected_cost_and_explores():
    r = AutoRouter([0.05, 0.3, 0.3], gamma=4, seed=0, explore=0.0)
    assert r.choose(0, 0) == (0,)  # nothing measured: the cheapest

    class C:  # a minimal counters stand-in: each drafter's own tests on one row
        own_accepted_at = np.array([[[20, 0, 0, 0], [95, 0, 0, 0], [40, 0, 0, 0]]])
        own_reached_at = np.array([[[100, 0, 0, 0], [100, 0, 0, 0], [100, 0, 0, 0]]])

    r.observe(0, 0, (0, 1, 2), C, 0)
    assert r.choose(0, 1) == (1,)  # accurate beats cheap here
    assert r.choose(5, 0) == (1,)  # a new plan starts from the pooled α
    r2 = AutoRouter([0.05, 0.3, 0.3], gamma=4, seed=0, explore=1.0)
    r2.observe(0, 0, (0, 1, 2), C, 0)
    assert len(r2.choose(0, 1)) == 2  # exploration adds one drafter


def test_auto_prices_a_lone_drafter_at_its_own_gamma():
    """Per-drafter γ_i (SPEC §2): a drafter alone runs its own window, so auto prices it at
    that window; a pair runs the shared block's γ."""

    class C:
        own_accepted_at = np.array([[[90, 0, 0, 0], [90, 0, 0, 0]]])
        own_reached_at = np.array([[[100, 0, 0, 0], [100, 0, 0, 0]]])

    same = AutoRouter([0.1, 0.1], gamma=4, seed=0, explore=0.0, max_set=1)
    same.observe(0, 0, (0, 1), C, 0)
    assert same.choose(0, 1) == (0,)  # a tie: the lower index
    own = AutoRouter([0.1, 0.1], gamma=4, seed=0, explore=0.0, max_set=1, gammas=[1, None])
    own.observe(0, 0, (0, 1), C, 0)
    al = own.alpha(0)
    assert own.set_gamma((0,)) == 1 and own.set_gamma((1,)) == 4 and own.set_gamma((0, 1)) == 4
    assert own.expected_cost_per_token(al, (1,)) < own.expected_cost_per_token(al, (0,))
    assert own.choose(0, 1) == (1,)  # γ_0 = 1 commits ≤ 2 per round
    with pytest.raises(ValueError, match="gammas"):
        AutoRouter([0.1, 0.1], gamma=4, gammas=[0, 2])


def _states(n_plans: int):
    """What `AutoRouter.start` reads of the carried state: two drafters of one-piece
    re-spellings, caches of 32 slots, the verifier's of 64, ``n_plans`` plans."""

    class Dep:
        d_data = [type("D", (), {"retok": np.zeros((8, 1))})()] * 2

    class States:
        v_cap, dep = 64, Dep

        @staticmethod
        def d_capacity(j):
            return 32

    States.n_plans = n_plans
    return States


def _batch_router(per_row: float):
    """A router over two drafters with machine prices: a verifier call costs 1 s plus
    ``per_row`` s per padded row (memory-bound: ~0; compute-bound: ~1), drafters are free;
    plan 0's α favours drafter 0 (0.9 vs 0.8), plan 1's drafter 1 (0.8 vs 0.9)."""

    States = _states(2)

    def measure(keys):
        out = {}
        for k in keys:
            kind, _, _, rows, _ = metrics.parse_price_key(k)
            out[k] = 1.0 + per_row * rows if kind == "verify" else 0.0
        return out

    r = AutoRouter(
        [0.01, 0.01], gamma=4, max_set=1, measure=measure, score="teacher_forced", prior_weight=0
    )
    r.start(States)
    for plan, (a0, a1) in enumerate(((90, 80), (80, 90))):
        r.observe_scores(plan, 0, [a0, a1], 100)
    return r


@pytest.mark.parametrize("per_row, calls", [(0.0, 1), (2.0, 2)])
def test_auto_chooses_for_the_batch(per_row, calls):
    """Issue 52, item 2: each plan alone would pick its own drafter (two calls a round);
    where a call's price hardly grows with its rows (memory-bound), the batch is cheaper as
    one call with one plan on its second-best drafter; where it grows with the rows
    (compute-bound), the two calls stay. The batch's predicted seconds per token never rise."""
    r = _batch_router(per_row)
    own = [r.choose(0, 1), r.choose(1, 1)]
    assert own == [(0,), (1,)]
    sets = r.choose_batch([0, 1], 1)
    assert len(set(sets)) == calls
    log = r.batch_log[-1]
    assert log["own_calls"] == 2 and log["calls"] == calls
    assert log["seconds_per_token"] <= log["own_seconds_per_token"]
    if calls == 1:
        assert log["seconds_per_token"] < log["own_seconds_per_token"]
    # The batch price: each call at its row count, for its slowest row's rounds.
    al = {p: r.alpha(p) for p in (0, 1)}
    split = {0: ((0,), 4), 1: ((1,), 4)}
    want = sum(r.call_seconds(o, 1) / r._tokens_per_round(al[p], o) for p, o in split.items()) / 2
    assert r.batch_seconds(split, al) == pytest.approx(want)


def test_auto_chooses_a_lone_drafters_gamma_and_prices():
    """γ choice (a lone drafter at each candidate, a pair at the config's γ), machine prices
    when measured, and one-line errors for bad candidates and prices."""

    class C:
        own_accepted_at = np.array([[[95, 0, 0, 0], [30, 0, 0, 0]]])
        own_reached_at = np.array([[[100, 0, 0, 0], [100, 0, 0, 0]]])

    r = AutoRouter([0.01, 0.01], gamma=4, seed=0, explore=0.0, gamma_candidates=[1, 2])
    assert r.options() == [((0,), 1), ((0,), 2), ((0,), 4), ((1,), 1), ((1,), 2), ((1,), 4)] + [
        ((0, 1), 4)
    ]
    r.observe(0, 0, (0, 1), C, 0)
    al = r.alpha(0)
    assert r.choose(0, 1) == (0,) and r.gamma_for(0) is None  # α ≈ 0.9: its own γ = 4
    # By the cost model, a lone drafter's window is the cheapest per token of the options.
    costs = {g: r.expected_cost_per_token(al, (0,), g) for g in (1, 2, 4)}
    assert costs[4] < costs[2] < costs[1]

    States = _states(1)
    seen = []

    def measure(keys):  # a verifier whose wide blocks are dear: γ = 1 wins on the clock
        seen.extend(keys)
        out = {}
        for k in keys:
            kind, _, width, rows, _ = metrics.parse_price_key(k)
            assert rows == 1
            out[k] = (1.0 if width <= 2 else 10.0 * width) if kind == "verify" else 0.0
        return out

    p = AutoRouter(
        [0.01, 0.01], gamma=4, seed=0, explore=0.0, gamma_candidates=[1, 2], measure=measure
    )
    p.start(States)
    p.observe(0, 0, (0, 1), C, 0)
    assert p.choose(0, 1) == (0,) and p.gamma_for(0) == 1 and p.prices and seen
    assert p.expected_cost_per_token(al, (0,), 1) == pytest.approx(
        1.0 / float(metrics.leviathan_expected_tokens(al[0], 1))
    )
    for bad, field in (([0], "auto gamma candidates"), ([5], "auto gamma candidates"), (3, "")):
        with pytest.raises(ConfigError, match="auto gamma candidates: got") as err:
            AutoRouter([0.1, 0.1], gamma=4, gamma_candidates=bad)
        assert "\n" not in str(err.value) and "allowed" in str(err.value)
    short = AutoRouter([0.1], gamma=2, measure=lambda keys: {})
    with pytest.raises(ValueError, match="auto machine prices: got no price for 'draft:d0:"):
        short.start(States)
    neg = AutoRouter([0.1], gamma=2, measure=lambda keys: {k: -1.0 for k in keys})
    with pytest.raises(ValueError, match=r"auto machine prices\[.*got -1.0, allowed"):
        neg.start(States)


@pytest.mark.slow  # 13 engine runs of 100k rows; `make test-all`
def test_every_set_auto_can_choose_is_lossless(deployment):
    """χ²: the token tree over every pair (auto's two-drafter sets) and rule 1 for every
    single drafter, at the shared γ and at other γ a lone drafter may be given
    (`gamma_candidates`: another compiled window); the all-drafter tree of the first step
    is covered by test_policy."""
    dep, setup = deployment
    exact = sequence_distribution(setup.v_table, 1.0, START, LENGTH)
    prompts = [[START]] * N
    dprompts = [[p] * N for p in (enc("a") for enc in dep.drafter_encode)]
    sets = [((i,), 2) for i in range(4)] + [(c, 2) for c in itertools.combinations(range(4), 2)]
    sets += [((0,), 1), ((2,), 3), ((3,), 4)]  # lone drafters at other windows
    pvalues = {}
    for s, g in sets:
        rule = "rejection" if len(s) == 1 else "token_tree"
        slots = np.tile(branch_slots([list(s)]), (N, 1))
        cfg = EngineConfig(
            gamma=2, rule=rule, verifier_temperature=1.0, n_slots=len(s), max_new_tokens=LENGTH
        )
        drafters = dep.with_gammas([g if (i,) == s and g != 2 else None for i in range(4)])
        res = speculative_generate(
            cfg,
            dep.verifier,
            dep.v_params,
            drafters.drafters,
            dep.d_data,
            prompts,
            dprompts,
            row_keys_for(zlib.crc32(f"auto{s}{'' if g == 2 else g}".encode()), N),
            slots=slots,
        )
        pvalues[(s, g)] = chi2_pvalue(res.tokens[:, 1 : 1 + LENGTH], exact)
    print({str(k): f"{v:.3g}" for k, v in pvalues.items()})
    bad = {k: v for k, v in pvalues.items() if v < ALPHA}
    assert not bad, f"χ² rejects losslessness (p < {ALPHA}) for {bad}"


@pytest.mark.parametrize("score", AutoRouter.SCORES)
@pytest.mark.parametrize(
    "tau,rule",
    [  # ~60 s of compilation each (every set auto tries)
        pytest.param(0.0, None, marks=pytest.mark.slow),
        pytest.param(1.0, "coupled", marks=pytest.mark.slow),
    ],
)
def test_auto_and_oracle_commit_the_verifiers_plan(deployment, tau, rule, score):
    dep, _ = deployment
    cfg = PlanConfig(
        gamma=3, verifier_temperature=tau, plan_steps=3, max_step_tokens=6, bucket=16, rule=rule
    )
    prompts = ["ab", "c", "dda", "b"]
    ref, _ = run_plans(dep, cfg, prompts)
    router = AutoRouter([d.cost for d in dep.drafters], cfg.gamma, explore=0.5, score=score)
    texts, st = run_plans(dep, cfg, prompts, router=router)
    assert texts == ref
    assert st.fallbacks == 0 and len(st.routes) == 3
    # Machine prices that make wide blocks dear: auto runs lone drafters at γ = 1 or 2
    # (other compiled windows), and still commits the verifier's plan.
    dear = AutoRouter(
        [d.cost for d in dep.drafters],
        cfg.gamma,
        explore=0.5,
        gamma_candidates=[1, 2],
        names=dep.names,
        measure=lambda keys: {k: float(metrics.parse_price_key(k)[2] ** 2) for k in keys},
        score=score,
    )
    texts, st = run_plans(dep, cfg, prompts, router=dear)
    assert texts == ref and st.fallbacks == 0
    assert any(g in (1, 2) for r in st.gamma_routes for g in r.values())
    texts, _ = run_plans(dep, cfg, prompts, single=[0, 1, 2, 3])
    assert texts == ref
