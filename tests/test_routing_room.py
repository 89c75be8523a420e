"""The mixed workload and the room routing has: the ``edit`` prompts (held out, regenerable,
mixed into plans by ``prompt_domains``), the teacher-forced scores against an independent
computation, the room's arithmetic, and experiments/routing_room.py end to end (slow)."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

from specjax.configs.common import plans_defaults
from specjax.data import corpora, edit, load_prompts, shipped
from specjax.errors import ConfigError
from specjax.measure import routing_room as rr
from specjax.runner import plans_setup

ROOT = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------------ the edit prompts


def test_edit_prompts_shipped_and_held_out():
    got = load_prompts(["edit"])
    assert len(got) == 4 * edit.PER_KIND == 24
    assert [p["id"] for p in got] == [f"edit-{i:02d}" for i in range(24)]
    assert [p["kind"] for p in got] == list(edit.EDIT_KINDS) * edit.PER_KIND
    for p in got:
        assert p["domain"] == "edit" and p["prompt"].endswith("\n")
        src = p["source"]
        if p["kind"] == "reword":  # a held-out chapter of the shipped prose
            chapter = src.rsplit(":", 1)[0]
            assert corpora.is_heldout(chapter) and chapter in shipped.load_heldout("prose")
        else:  # a function of a held-out file of the code corpus
            assert corpora.is_heldout(src.split(":", 1)[0])
    # The three domains are unchanged by default; edit is read only when asked for.
    assert {p["domain"] for p in load_prompts()} == set(corpora.DOMAINS)


@pytest.mark.skipif(
    sys.version_info[:2] != (3, 11),
    reason="the edit prompts were cut from the Python 3.11 standard library",
)
def test_edit_prompts_reproduce(tmp_path):
    path = edit.write_edit_prompts(package_dir=tmp_path)
    got = [json.loads(ln) for ln in path.read_text().splitlines()]
    assert got == load_prompts(["edit"])


def test_edit_kinds_copy_their_source():
    """Each prompt ends with the first line of the edited copy of what it shows."""
    for p in load_prompts(["edit"]):
        lines = p["prompt"].splitlines()
        last = lines[-1]
        if p["kind"] == "rename":
            old, new = lines[0].split("`")[1], lines[0].split("`")[3]
            assert re.sub(rf"\b{old}\b", new, lines[1]) == last
        elif p["kind"] == "fix":
            assert lines[1] == last
        elif p["kind"] == "template":
            name = lines[-2].split(": ", 1)[1].split(", ")[0]
            assert last == lines[1].replace("NAME", name)
        else:
            old, new = lines[-2].split('"')[1], lines[-2].split('"')[3]
            assert old in lines[1] and new in last and len(last) < len(lines[1]) + 40


# ------------------------------------------------------------------- plans' prompt sets


def _config(**fields):
    c = plans_defaults()
    for k, v in fields.items():
        setattr(c, k, v)
    return c


def test_prompt_domains_mix_edit_in():
    c = _config(prompt_domains=["code", "edit", "prose", "reasoning"], plans_per_domain=2)
    prompts, ids = plans_setup.plan_prompts(c)
    assert ids == [
        "code-00",
        "edit-00",
        "prose-00",
        "reasoning-00",
        "code-01",
        "edit-01",
        "prose-01",
        "reasoning-01",
    ]
    assert plans_setup.plan_domains(c, ids) == ["code", "edit", "prose", "reasoning"] * 2
    assert prompts[1] == load_prompts(["edit"])[0]["prompt"]
    # Empty: the kind's own prompts, as before.
    base = _config(plans_per_domain=2)
    assert plans_setup.plan_prompts(base) == plans_setup.plan_prompts(
        _config(prompt_domains=["code", "prose", "reasoning"], plans_per_domain=2)
    )


@pytest.mark.parametrize("value", [["code", "code"], ["poetry"], ["edit", "nope"]], ids=str)
def test_prompt_domains_refused(value):
    with pytest.raises(ConfigError, match="prompt_domains"):
        plans_setup.plan_prompts(_config(prompt_domains=value))


def test_prompt_domains_refused_with_own_prompts():
    with pytest.raises(ConfigError, match="prompt_domains"):
        plans_setup.plan_prompts(_config(deployment="synthetic", prompt_domains=["edit"]))


# ------------------------------------------------------------ teacher-forced scores


@pytest.fixture(scope="module")
def zoo_dep():
    c = _config(deployment="zoo")
    return plans_setup.cell_deployment(c, {"pairing": ["code", "reasoning", "lookup"]})


def test_teacher_forced_matches_independent_computation(zoo_dep):
    """Σ min(p, q) at every reply position, against the verifier's full logits and each
    drafter's law from the KL check's own path (`prefix_distributions`, another packing);
    prompt lookup against its definition (a point mass at the continuation of the latest
    earlier match of the longest suffix, else nothing)."""
    from specjax.engine.deployment import prefix_distributions

    dep = zoo_dep
    texts = ["def f(x):\n    return x + 1\n", "And the LORD said unto Moses, Go in.\n"]
    toks = [dep.encode(t) for t in texts]
    replies = rr.Replies(
        tokens=toks,
        prompt_len=[3, 4],
        step_len=[[len(toks[0]) - 3 - 2, 2], [len(toks[1]) - 4]],
    )
    sc = rr.teacher_forced(dep, replies, batch=2)
    assert sc.names == ["code", "reasoning", "lookup"]
    for p, t in enumerate(toks):
        n = len(t)
        logits = dep.verifier.logits_full(dep.v_params, np.asarray([t], np.int32))[0]
        pv = np.asarray(jax.nn.softmax(logits, -1))
        q, ok = prefix_distributions(dep, np.asarray([t], np.int32), np.asarray([n]), n)
        q = np.asarray(q)
        assert ok.all()
        for k in range(2):  # the transformer drafters (identity and cross-vocabulary)
            want = np.minimum(pv, q[k]).sum(-1)
            np.testing.assert_allclose(sc.alpha[k, p, :n], want, atol=2e-4)
            np.testing.assert_array_equal(sc.top1[k, p, :n], q[k].argmax(-1) == pv.argmax(-1))
        # lookup: α = p(x̂) where it proposes x̂, its accept = 1[x̂ = x_{t+1}]
        a, acc = sc.alpha[2, p, : n - 1], sc.accept[2, p, : n - 1]
        assert np.all((np.isclose(acc, 0) | np.isclose(acc, 1)))
        assert np.all(a <= 1 + 1e-6)
    # Steps: position t predicts token t + 1; −1 on the prompt.
    assert (sc.step[0] == 0).sum() == len(toks[0]) - 5 and (sc.step[0] == 1).sum() == 2
    assert sc.step[0, 1] == -1 and sc.step[0, 2] == 0


def test_accept_is_posterior_of_alpha(zoo_dep):
    """E_x~p[accept(x)] = α: the accept probability of the committed token averages to
    Σ min(p, q) over the verifier's law (checked on one position by enumeration)."""
    dep = zoo_dep
    t = dep.encode("def g(y):\n    return y\n")
    logits = np.asarray(dep.verifier.logits_full(dep.v_params, np.asarray([t], np.int32))[0])
    pos = len(t) - 3
    pv = np.exp(logits[pos] - logits[pos].max())
    pv /= pv.sum()
    top = np.argsort(-pv)[:5]
    vals = []
    for x in top:  # the committed token replaced by each candidate x
        toks = list(t[: pos + 1]) + [int(x)]
        sc = rr.teacher_forced(dep, rr.Replies([toks], [1], [[len(toks) - 1]]), batch=1)
        vals.append(sc.accept[0, 0, pos])
        alpha = sc.alpha[0, 0, pos]
    # Σ_x p(x) accept(x) over the top ids bounds α from below, and the rest adds ≤ their mass.
    lo = float(np.dot(pv[top], vals))
    assert lo <= alpha + 1e-5 <= lo + (1 - pv[top].sum()) + 2e-5


# ----------------------------------------------------------------------- the room


def _rounds(time_like):
    """option_rounds-shaped input: K drafters, 1 γ, rows (plan, step) with 10 positions."""
    r = np.asarray(time_like, np.float64)  # [K, R]
    n_rows = r.shape[1]
    return {
        "plan": np.arange(n_rows) // 2,
        "step": np.arange(n_rows) % 2,
        "positions": np.full(n_rows, 10.0),
        "rounds": r[:, None, :],
        "alpha_sum": np.full((r.shape[0], n_rows), 5.0),
        "gammas": [1],
    }


def test_room_arithmetic():
    # Two plans of two steps; drafter 0 wins plan 0, drafter 1 wins plan 1; within plan 1
    # drafter 0 wins its first step.
    rounds = _rounds([[4, 4, 2, 9], [8, 8, 4, 3]])
    out = rr.room(rounds, [0.0, 0.0], ["a", "b"], n_boot=50)
    # times (cost 1 per round): a: plans 8, 11 (19); b: 16, 7 (23) -> fixed a.
    assert out["fixed"] == {"drafter": "a", "gamma": 1}
    assert out["room_per_plan"] == pytest.approx(19 / (8 + 7))
    assert out["room_per_step"] == pytest.approx(19 / (4 + 4 + 2 + 3))
    assert out["speedup_fixed"] == pytest.approx(40 / 19)
    assert out["tokens_per_round_per_step"] == pytest.approx(40 / 13)
    assert out["alpha"] == {"a": 0.5, "b": 0.5}
    lo, hi = out["room_per_plan_ci"]
    assert 1.0 <= lo <= hi
    # One drafter better everywhere: no room.
    same = rr.room(_rounds([[2, 2, 2, 2], [4, 4, 4, 4]]), [0.0, 0.0], ["a", "b"], n_boot=20)
    assert same["room_per_plan"] == same["room_per_step"] == 1.0
    # Costs price the rounds: b's rounds at c = 1 cost 2 verifier calls each.
    priced = rr.room(rounds, [0.0, 1.0], ["a", "b"], n_boot=20)
    assert priced["room_per_plan"] == pytest.approx(19 / (8 + 11))


def test_option_rounds_rows():
    step = np.asarray([[-1, 0, 0, 1, 1, 1, -1]])
    k = 2
    a = np.ones((k, 1, 7))
    sc = rr.Scores(names=["x", "y"], alpha=a, accept=a, top1=a > 0, step=step)
    out = rr.option_rounds(sc, 1.0, [2])
    assert out["plan"].tolist() == [0, 0] and out["step"].tolist() == [0, 1]
    assert out["positions"].tolist() == [2.0, 3.0]
    # Every draft accepted at γ 2: a round covers γ + 1 = 3 positions.
    np.testing.assert_allclose(out["rounds"][:, 0], [[1, 1], [1, 1]])


# The script end to end: tests/test_experiment_scripts.py::test_routing_room.
