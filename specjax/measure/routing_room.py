"""The room routing has: each drafter's teacher-forced acceptance on the verifier's own plan
replies, per plan and per step, and what choosing the best single drafter in hindsight per
plan or per step would save over the best fixed one (experiments/routing_room.py).

A router can only gain where drafters differ by plan or step, so the room is measured
before a router is judged. For every plan the verifier writes its steps alone
(`verifier_replies`: `policy.plan.run_plans` without a policy, the plan runner's own step
delimiters and budgets); every drafter is then scored teacher forced on each reply
position (`teacher_forced`: one verifier pass and one pass per drafter over each plan's
text, `policy.scores.teacher_forced`: the drafter reading it as the engine does —
its own re-spelling of the verifier's tokens, a feature drafter the verifier's features —
its law the one the engine draws from, `engine.drafting.draw`):

  τ 1: α_t = Σ_x min(p_t(x), q_t(x)) and the posterior accept probability of the
       committed token, min(1, q_t(x) / p_t(x)) (p at τ 1, replies sampled at τ 1);
  τ 0: argmax agreement, α_t = accept_t = 1[argmax q_t = argmax p_t] (greedy replies,
       greedy drafters).

`specjax.measure.loop_law` turns these into each row's expected round starts at a window
γ (exact for rule 1 where the drafter's law at depth k is its law on the committed prefix,
as for every drafter that keeps its own drafts; a feature drafter's deeper drafts read its
own features, approximated), each step one row (a step's first position starts a round).
`room` prices the rounds with the run's cost model (a round of drafter i at γ costs
1 + γ·c_i verifier calls) and reports, with 95 % bootstrap intervals over plans: each
drafter's mean α, the best fixed (drafter, γ), the hindsight per-plan and per-step best
(drafter, γ), their expected tokens per round and predicted speed-ups over the verifier
alone and over the best fixed option.
"""

from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from specjax.measure import loop_law
from specjax.policy import scores
from specjax.policy.journal import PlanJournal
from specjax.policy.plan import run_plans

__all__ = ["Replies", "Scores", "room", "teacher_forced", "verifier_replies"]


@dataclasses.dataclass
class Replies:
    """Each plan's text as the verifier saw and wrote it.

    Attributes:
      tokens: per plan, the verifier ids of its prompt (as the plan runner encodes it)
        followed by every committed step's tokens.
      prompt_len: per plan, the prompt's length in those ids.
      step_len: per plan, each step's committed token count.
    """

    tokens: list
    prompt_len: list
    step_len: list


def verifier_replies(dep, cfg, prompts: Sequence[str], plan_ids: Sequence[str]) -> Replies:
    """The verifier's own plan replies: `run_plans` with no policy (the verifier alone, its
    step delimiter and `cfg.max_step_tokens`, `cfg.verifier_temperature`, keys from
    `cfg.seed`), each step's tokens read back from its journal."""
    with tempfile.TemporaryDirectory() as tmp:
        journal = PlanJournal(Path(tmp) / "replies.jsonl", fsync=False)
        try:
            run_plans(dep, cfg, list(prompts), journal=journal, plan_ids=list(plan_ids))
            steps = [[list(s.meta["tokens"]) for s in journal.committed_steps(p)] for p in plan_ids]
        finally:
            journal.close()
    heads = [list(dep.encode(p)) for p in prompts]
    return Replies(
        tokens=[h + [t for s in st for t in s] for h, st in zip(heads, steps)],
        prompt_len=[len(h) for h in heads],
        step_len=[[len(s) for s in st] for st in steps],
    )


@dataclasses.dataclass
class Scores:
    """Teacher-forced scores of K drafters on P plans' texts, T positions wide.

    Position t predicts token t + 1. ``alpha`` f64[K, P, T] (Σ min(p, q) at τ 1),
    ``accept`` f64[K, P, T] (min(1, q(x) / p(x)) of the committed x), ``top1`` bool[K, P, T]
    (argmax agreement); ``step`` i32[P, T]: the plan step whose token position t predicts
    (−1: the prompt, or past the text)."""

    names: list
    alpha: np.ndarray
    accept: np.ndarray
    top1: np.ndarray
    step: np.ndarray

    def law(self, tau: float) -> tuple[np.ndarray, np.ndarray]:
        """(α, accept) f64[K, P, T] at verifier τ 1 (``tau`` > 0) or τ 0 (argmax agreement)."""
        if tau > 0:
            return self.alpha, self.accept
        t = self.top1.astype(np.float64)
        return t, t


def teacher_forced(dep, replies: Replies, batch: int = 4) -> Scores:
    """Every drafter of ``dep`` scored teacher forced at every position of every plan's
    text (`Scores`), ``batch`` plans per pass. The drafter's law is what the engine draws
    from at its temperature and filters (`engine.drafting.draw`), in verifier ids."""
    rows = [list(map(int, r)) for r in replies.tokens]
    n_p, k = len(rows), len(dep.drafters)
    t_all = -(-max(len(r) for r in rows) // 32) * 32
    alpha = np.zeros((k, n_p, t_all))
    accept = np.zeros((k, n_p, t_all))
    top1 = np.zeros((k, n_p, t_all), bool)
    step = np.full((n_p, t_all), -1, np.int32)
    for p, (plen, sl) in enumerate(zip(replies.prompt_len, replies.step_len)):
        at = plen - 1
        for s, n in enumerate(sl):
            step[p, at : at + n] = s
            at += n
    for b0 in range(0, n_p, batch):
        a, acc, t1, _ = scores.teacher_forced(dep, rows[b0 : b0 + batch])
        w = a.shape[-1]
        sl = slice(b0, b0 + len(rows[b0 : b0 + batch]))
        alpha[:, sl, :w], accept[:, sl, :w], top1[:, sl, :w] = a, acc, t1
    return Scores(names=list(dep.names), alpha=alpha, accept=accept, top1=top1, step=step)


# ------------------------------------------------------------------------------ the room


def _step_rows(step: np.ndarray, arrays: np.ndarray) -> tuple:
    """Per (plan, step) row: its positions packed to the front. Returns (plan i32[R],
    step i32[R], mask bool[R, W], packed [..., R, W] of ``arrays`` [..., P, T])."""
    plans, steps, idx = [], [], []
    for p in range(step.shape[0]):
        for s in sorted(set(step[p][step[p] >= 0].tolist())):
            plans.append(p)
            steps.append(s)
            idx.append(np.flatnonzero(step[p] == s))
    w = max(len(i) for i in idx)
    mask = np.zeros((len(idx), w), bool)
    packed = np.zeros(arrays.shape[:-2] + (len(idx), w))
    for r, (p, i) in enumerate(zip(plans, idx)):
        mask[r, : len(i)] = True
        packed[..., r, : len(i)] = arrays[..., p, i]
    return np.asarray(plans), np.asarray(steps), mask, packed


def option_rounds(scores: Scores, tau: float, gammas: Sequence[int]) -> dict:
    """Each (drafter, γ) option's expected round starts per (plan, step) row
    (`loop_law.loop_alpha`, the drafter's step-1 law at every depth), and the rows'
    positions. Returns ``plan`` i32[R], ``step`` i32[R], ``positions`` f64[R],
    ``rounds`` f64[K, G, R], ``alpha_sum`` f64[K, R] (Σ α over the row), ``gammas``."""
    a, acc = scores.law(tau)
    plan, step, mask, packed = _step_rows(scores.step, np.stack([a, acc]))
    k = a.shape[0]
    rounds = np.zeros((k, len(gammas), len(plan)))
    for i in range(k):
        for g, gamma in enumerate(gammas):
            r = loop_law.loop_alpha(
                packed[0, i][..., None], packed[1, i][..., None], mask, int(gamma)
            )
            rounds[i, g] = r["rows"]["rounds"]
    return {
        "plan": plan,
        "step": step,
        "positions": mask.sum(1).astype(np.float64),
        "rounds": rounds,
        "alpha_sum": (packed[0] * mask).sum(-1),
        "gammas": list(map(int, gammas)),
    }


def _room_once(time_pr, time_r, pos_p, rounds_pr, rounds_r, plan_of_row, plans) -> dict:
    """The room's figures on the plans ``plans`` (indices, repeats allowed): times f64[O, P]
    per plan and f64[O, R] per row, per option O."""
    tp = time_pr[:, plans].sum(1)  # [O]
    fixed = int(np.argmin(tp))
    per_plan = time_pr[:, plans].min(0).sum()
    # Per step: every row of each drawn plan (a plan drawn twice counts twice).
    w = np.bincount(plans, minlength=time_pr.shape[1])[plan_of_row]
    per_step = (time_r.min(0) * w).sum()
    n = pos_p[plans].sum()
    best_p = time_pr[:, plans].argmin(0)
    best_r = time_r.argmin(0)
    rounds_plan = rounds_pr[best_p, plans].sum()
    rounds_step = (rounds_r[best_r, np.arange(len(best_r))] * w).sum()
    return {
        "fixed": fixed,
        "speedup_fixed": n / tp[fixed],
        "speedup_per_plan": n / per_plan,
        "speedup_per_step": n / per_step,
        "room_per_plan": tp[fixed] / per_plan,
        "room_per_step": tp[fixed] / per_step,
        "tokens_per_round_fixed": n / rounds_pr[fixed, plans].sum(),
        "tokens_per_round_per_plan": n / rounds_plan,
        "tokens_per_round_per_step": n / rounds_step,
    }


def _interval(x) -> list:
    return [float(np.percentile(x, 2.5)), float(np.percentile(x, 97.5))]


def room(
    rounds: dict,
    costs: Sequence[float],
    names: Sequence[str],
    plans: Sequence[int] | None = None,
    n_boot: int = 2000,
    seed: int = 0,
) -> dict:
    """The room routing has on the plans ``plans`` (default all) of `option_rounds`' rows,
    priced by the cost model (a round of drafter i at γ: 1 + γ·c_i verifier calls; the
    verifier alone: one per token), with 95 % bootstrap intervals over plans.

    Returns each option's speed-up over the verifier alone (``options``), the best fixed
    option (``fixed``: chosen on all the plans; each resample re-chooses it), the hindsight
    per-plan and per-step best options' speed-ups and expected tokens per round, and their
    ratio to the best fixed option (``room_per_plan``, ``room_per_step``), each with
    ``<name>_ci``; each drafter's mean α (``alpha``) with its interval."""
    costs = np.asarray(costs, np.float64)
    gammas = rounds["gammas"]
    k, g = rounds["rounds"].shape[:2]
    opts = [(i, gamma) for i in range(k) for gamma in gammas]
    price = np.asarray([1.0 + gamma * costs[i] for i, gamma in opts])  # per round
    rounds_r = rounds["rounds"].reshape(k * g, -1)  # [O, R]
    time_r = rounds_r * price[:, None]
    plan_of_row = rounds["plan"]
    n_p = int(plan_of_row.max()) + 1
    onehot = np.zeros((len(plan_of_row), n_p))
    onehot[np.arange(len(plan_of_row)), plan_of_row] = 1.0
    time_pr, rounds_pr = time_r @ onehot, rounds_r @ onehot
    pos_p = rounds["positions"] @ onehot
    alpha_p = rounds["alpha_sum"] @ onehot  # [K, P]
    plans = np.arange(n_p) if plans is None else np.asarray(sorted(plans))
    if len(plans) == 0:
        raise ValueError("room: no plans")
    args = (time_pr, time_r, pos_p, rounds_pr, rounds_r, plan_of_row)
    point = _room_once(*args, plans)
    rng = np.random.default_rng(seed)
    boots = [_room_once(*args, rng.choice(plans, len(plans))) for _ in range(int(n_boot))]
    out = {
        "plans": len(plans),
        "positions": float(pos_p[plans].sum()),
        "fixed": {"drafter": names[opts[point["fixed"]][0]], "gamma": opts[point["fixed"]][1]},
        "fixed_share": float(np.mean([b["fixed"] == point["fixed"] for b in boots])),
    }
    for key, v in point.items():
        if key != "fixed":
            out[key] = float(v)
            out[f"{key}_ci"] = _interval([b[key] for b in boots])
    sp = pos_p[plans].sum() / time_pr[:, plans].sum(1)
    out["options"] = {f"{names[i]}@{gamma}": float(s) for (i, gamma), s in zip(opts, sp)}
    alpha, alpha_ci = {}, {}
    draws = [rng.choice(plans, len(plans)) for _ in range(int(n_boot))]
    for i, name in enumerate(names):
        alpha[name] = float(alpha_p[i, plans].sum() / pos_p[plans].sum())
        alpha_ci[name] = _interval([alpha_p[i, d].sum() / pos_p[d].sum() for d in draws])
    out["alpha"], out["alpha_ci"] = alpha, alpha_ci
    best = time_pr[:, plans].argmin(0)
    out["per_plan_choice"] = {
        f"{names[opts[o][0]]}@{opts[o][1]}": int((best == o).sum()) for o in sorted(set(best))
    }
    return out
