"""`auto` with teacher-forced scores (issue 52, item 1): every candidate drafter, whether it
ran or not, is scored after each step on the committed text, and the router's estimates are
those scores. Checked against an independent computation of Σ min(p, q) on the committed
text (the synthetic deployment's exact tables: p and q read from the tables, no engine)."""

from __future__ import annotations

import numpy as np
import pytest

from specjax import testing as suite
from specjax.errors import ConfigError
from specjax.policy.auto import AutoRouter
from specjax.policy.plan import run_plans
from specjax.policy.plan_config import PlanConfig
from specjax.policy.scores import teacher_forced


@pytest.fixture(scope="module")
def deployment():
    return suite.make_deployment("random", seed=7, fourth=True)


def _softmax(z):
    z = np.asarray(z, np.float64)
    e = np.exp(z - z.max())
    return e / e.sum()


def _exact_alpha(dep, text: list[int], lo: int, hi: int) -> np.ndarray:
    """f64[K]: Σ_{t ∈ [lo, hi)} Σ_x min(p_t, q_k,t) read from the exact tables (NumPy, no
    model call, no engine): p_t = softmax(verifier table[x_t]); a drafter reads the last
    piece of its re-spelling of x_t, q its softmax at its temperature over the verifier's
    intersection, each id's mass moved to its verifier id."""
    vt = np.asarray(dep.v_params["table"], np.float64)
    out = []
    for spec, data in zip(dep.drafters, dep.d_data):
        table = np.asarray(data.params["table"], np.float64)
        to_v = np.asarray(data.to_verifier)
        retok, lens = np.asarray(data.retok), np.asarray(data.retok_len)
        total = 0.0
        for t in range(lo, hi):
            x = text[t]
            p = _softmax(vt[x])
            row = table[retok[x, lens[x] - 1]] / spec.temperature
            q_d = _softmax(np.where(to_v >= 0, row, -np.inf))
            q = np.zeros_like(p)
            np.add.at(q, to_v[to_v >= 0], q_d[to_v >= 0])
            total += np.minimum(p, q).sum()
        out.append(total)
    return np.asarray(out)


def test_teacher_forced_equals_exact_tables(deployment):
    dep, _ = deployment
    rows = [[1, 2, 3, 0, 2, 1, 1], [3, 3, 0], [0, 1]]
    alpha, accept, top1, secs = teacher_forced(dep, rows, width=16)
    assert alpha.shape == (len(dep.drafters), 3, 16) and secs > 0
    for b, r in enumerate(rows):
        want = _exact_alpha(dep, r, 0, len(r))
        np.testing.assert_allclose(alpha[:, b, : len(r)].sum(-1), want, rtol=1e-5, atol=1e-5)
    assert np.all((accept >= 0) & (accept <= 1 + 1e-6)) and top1.dtype == bool


def test_scores_of_a_drafter_that_sat_out(deployment):
    """The router's teacher-forced counts after a run equal Σ min(p, q) over each plan's
    committed positions for every drafter — also those the router never ran."""
    dep, _ = deployment
    cfg = PlanConfig(gamma=2, verifier_temperature=1.0, plan_steps=2, max_step_tokens=4, bucket=16)
    prompts = ["ab", "cd"]
    # Only drafter 0 or 1 can be chosen (drafters 2 and 3 are priced out by their cost).
    costs = [0.0, 0.0, 1e6, 1e6]
    router = AutoRouter(costs, cfg.gamma, score="teacher_forced", max_set=1)
    assert router.explore == 0.0 and router.wants_scores
    texts, st = run_plans(dep, cfg, prompts, router=router)
    ran = {i for step in st.routes for s in step.values() for i in map(dep.names.index, s)}
    assert not {2, 3} & ran  # drafters 2 and 3 sat out every step
    for p, text in enumerate(texts):
        toks = dep.encode(text)
        n0 = len(dep.encode(prompts[p]))
        want = _exact_alpha(dep, toks, n0 - 1, len(toks) - 1)
        np.testing.assert_allclose(router.tf_alpha[p], want, rtol=1e-4, atol=1e-4)
        assert np.all(router.tf_positions[p] == len(toks) - n0)
    np.testing.assert_allclose(router.pooled_tf_alpha, sum(router.tf_alpha.values()))
    # The scoring is charged: a verifier call (the carried cache continued over the step:
    # no prefill beyond the plans' first) and every drafter's prefill per plan and step.
    assert st.verifier_prefills == len(prompts)
    # …priced as the verifier block it is (max_step_tokens + 1 = 5 tokens, rounded up to 8),
    # once per step, shared by the plans: the predicted seconds include the scoring.
    scoring = [k for k in st.priced if k.startswith("verify:verifier:8x")]
    assert scoring and sum(st.priced[k].sum() for k in scoring) == pytest.approx(cfg.plan_steps)
    # …and every drafter's read of the step — those that sat out too — as the program it
    # is (once per drafter and step, shared by the plans), after a prefill of the prompts
    # at its first use (the drafters that sat out have no other forward to price).
    reads = [k for k in st.priced if k.startswith("state:read_score.")]
    assert sum(st.priced[k].sum() for k in reads) == pytest.approx(cfg.plan_steps * len(dep.names))
    for name in dep.names[2:]:
        first = [k for k in st.priced if k.startswith(f"draft:{name}:")]
        assert len(first) == 1 and st.priced[first[0]].sum() == pytest.approx(1), name
    assert np.all(st.counts["drafter_prefills"][:, 2:] == cfg.plan_steps)
    # The estimates are the teacher-forced ones (shrunk towards the pooled α).
    a = router.alpha(0)
    pooled = (router.pooled_tf_alpha + 1) / (router.pooled_tf_positions + 2)
    w = router.prior_weight
    np.testing.assert_allclose(a, (router.tf_alpha[0] + w * pooled) / (router.tf_positions[0] + w))


def test_own_mode_unchanged():
    r = AutoRouter([0.1, 0.1], gamma=4)
    assert r.score == "own" and r.explore == 0.15 and not r.wants_scores
    assert AutoRouter([0.1], gamma=2, explore=0.3, score="teacher_forced").explore == 0.3
    with pytest.raises(ConfigError, match="auto score"):
        AutoRouter([0.1], gamma=2, score="oracle")


def test_teacher_forced_choice_follows_scores():
    """With scores that favour drafter 1 on plan 0 and drafter 0 on plan 1, the router
    chooses accordingly at equal costs, without exploring."""
    r = AutoRouter([0.0, 0.0], gamma=3, score="teacher_forced", max_set=1)
    r.observe_scores(0, 0, [2.0, 18.0], 20)
    r.observe_scores(1, 0, [18.0, 2.0], 20)
    assert r.choose(0, 1) == (1,) and r.choose(1, 1) == (0,)
    # Own chain counts are ignored in this mode.
    assert np.allclose(r.alpha(0), r.alpha(0))


def test_scoring_compiles_once_per_run(deployment):
    """The scoring pass runs at the run's fixed window and padded rows: one verifier program
    for the whole run, not one per step, continuing the carried cache (the whole-text passes
    are not run), and each drafter's read a few programs (its pieces' padded widths)."""
    from specjax.engine import programs
    from specjax.policy import carried_scores, scores

    def compiled(fn):
        return sum(1 for key in programs._PROGRAMS if key[0] is fn)

    dep, _ = deployment
    cfg = PlanConfig(gamma=2, verifier_temperature=1.0, plan_steps=4, max_step_tokens=7, bucket=16)
    router = AutoRouter([0.0, 0.0, 0.0, 0.0], cfg.gamma, score="teacher_forced", max_set=1)
    programs.release_programs(0)
    v0 = scores._verifier_pass._cache_size()
    d0 = scores._drafter_scores._cache_size()
    run_plans(dep, cfg, ["ab", "cd", "a"], router=router)
    assert compiled(scores._window_pass) == 1
    assert 1 <= compiled(carried_scores._read_score_jit) <= 2 * len(dep.drafters)
    assert scores._verifier_pass._cache_size() == v0
    assert scores._drafter_scores._cache_size() == d0
    assert sum(router.pooled_tf_positions) > 0


def test_rows_longer_than_a_drafters_context(deployment):
    """A drafter whose context cannot hold a row reads its most recent whole tokens: the
    same scores where it reads them (a bigram needs one token of context), 0 before."""
    import dataclasses

    from specjax.models.synthetic import BigramLM

    dep, _ = deployment
    row = [1, 2, 3, 0, 2, 1, 1, 3, 2, 0, 1]
    full, _, _, _ = teacher_forced(dep, [row], width=16)
    specs = list(dep.drafters)
    cap = 6
    specs[1] = dataclasses.replace(specs[1], lm=BigramLM(specs[1].lm.vocab_size, max_len=cap))
    short = dataclasses.replace(dep, drafters=tuple(specs))
    got, _, _, _ = teacher_forced(short, [row], width=16)
    lens = np.asarray(dep.d_data[1].retok_len)[row]
    first = int(np.searchsorted(np.cumsum(lens) - lens, lens.sum() - cap))
    assert 0 < first < len(row)
    np.testing.assert_allclose(got[1, 0, first : len(row)], full[1, 0, first : len(row)], atol=1e-6)
    assert np.all(got[1, 0, :first] == 0)
    np.testing.assert_array_equal(got[[0, 2, 3]], full[[0, 2, 3]])


def scores_against_the_whole_text(dep, cfg, prompts, monkeypatch, max_set=1):
    """Runs `auto:teacher_forced` on ``prompts`` and checks its per-step scores — the
    verifier continuing its carried cache over the step (`verifier_window`), each drafter
    its own read (`ScoreReads`) — against `teacher_forced` over each plan's whole committed
    text at the same positions. Returns the scores checked."""
    from specjax.policy import plan as plan_mod
    from specjax.policy import scores

    seen = []
    real = plan_mod.verifier_window

    def spy(dep_, vcache, cap, plans, rows, steps, window):
        seen.append(("call", [list(r) for r in rows], list(steps)))
        return real(dep_, vcache, cap, plans, rows, steps, window)

    monkeypatch.setattr(plan_mod, "verifier_window", spy)
    router = AutoRouter(
        [0.0] * len(dep.drafters), cfg.gamma, score="teacher_forced", max_set=max_set
    )
    router.observe_scores = lambda plan, step, a, n: seen.append((plan, step, np.asarray(a), n))
    run_plans(dep, cfg, prompts, router=router)
    checked = 0
    for k, entry in enumerate(seen):
        if entry[0] != "call":
            continue
        rows, steps = entry[1], entry[2]
        got = seen[k + 1 :]
        got = got[: next((i for i, e in enumerate(got) if e[0] == "call"), len(got))]
        alpha, _, _, _ = scores.teacher_forced(dep, rows[: len(got)])
        for b, (plan, step, a, n) in enumerate(got):
            r, m = rows[b], steps[b]
            assert n == m
            want = alpha[:, b, len(r) - m - 1 : len(r) - 1].sum(-1)
            np.testing.assert_allclose(a, want, rtol=2e-4, atol=2e-4, err_msg=f"{plan}, {step}")
            checked += 1
    assert checked == len(prompts) * cfg.plan_steps
    return checked


@pytest.mark.slow  # ~30 s: a run on the zoo's transformers; `make test-all`
def test_window_from_the_carried_cache_equals_the_whole_text_on_the_zoo(monkeypatch):
    """On real transformers (the zoo: a verifier, a drafter of its tokenizer, one of another
    and prompt lookup), the router's per-step scores equal `teacher_forced`'s over each
    plan's whole committed text (`scores_against_the_whole_text`)."""
    from specjax.configs.common import plans_defaults
    from specjax.runner import plans_setup

    c = plans_defaults()
    c.deployment = "zoo"
    dep = plans_setup.cell_deployment(c, {"pairing": ["code", "reasoning", "lookup"]})
    cfg = PlanConfig(gamma=3, verifier_temperature=1.0, plan_steps=3, max_step_tokens=8, bucket=16)
    prompts = ["def add(a, b):\n", "In the beginning", "x = [1, 2, 3]\nfor"]
    scores_against_the_whole_text(dep, cfg, prompts, monkeypatch)


def test_reads_that_outgrow_a_drafters_context_keep_the_recent_text(deployment):
    """A drafter whose context cannot hold a plan's whole text has its read rebuilt from the
    recent text (a prefill, priced) when a step would not fit: its scores stay those of the
    exact tables (a bigram needs one token of context), the other drafters' unchanged."""
    import dataclasses

    from specjax.models.synthetic import BigramLM

    dep, _ = deployment
    specs = list(dep.drafters)
    cap = 16
    specs[1] = dataclasses.replace(specs[1], lm=BigramLM(specs[1].lm.vocab_size, max_len=cap))
    short = dataclasses.replace(dep, drafters=tuple(specs))
    cfg = PlanConfig(gamma=2, verifier_temperature=1.0, plan_steps=6, max_step_tokens=4, bucket=8)
    prompts = ["ab", "cd"]
    router = AutoRouter([0.0, 1e6, 1e6, 1e6], cfg.gamma, score="teacher_forced", max_set=1)
    texts, st = run_plans(short, cfg, prompts, router=router)
    refills = [k for k in st.priced if k.startswith("draft:d1:")]
    assert sum(st.priced[k].sum() for k in refills) > 1, refills  # rebuilt at least once
    for p, text in enumerate(texts):
        toks = short.encode(text)
        n0 = len(short.encode(prompts[p]))
        want = _exact_alpha(short, toks, n0 - 1, len(toks) - 1)
        np.testing.assert_allclose(router.tf_alpha[p], want, rtol=1e-4, atol=1e-4)
