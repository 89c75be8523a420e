"""Parallel plan execution under a policy: branches, the step decision, fallback (SPEC §5–6).

A plan is a prompt followed by `plan_steps` steps; a step ends at a stop token (a verifier
token containing the step delimiter) or after `max_step_tokens`. For every step, all plans
of the batch advance together (one batch = one step of every plan):

The layout of a step (sets, branches, rows) is `specjax.policy.layout`; the configuration
`specjax.policy.plan_config.PlanConfig`.

  1. the policy forms *sharing sets* — drafters that extend one prefix in one verifier
     block: all drafters (switch 1 off) or one set per tokenizer group (switch 1 on), split
     further by the KL ceiling (switch 4) and by the decision boundary of the previous batch;
  2. *branches* are built from the sets (at least `n_branches`, default one per tokenizer
     group); every (plan, branch) is one engine row, and the rows of one drafter set run in
     one engine call with only that set's drafters; the rule is `token_tree` (switch 2 on) or
     the naive `shared_block` (off) — under the coupled rule `coupled` or `coupled_block`;
  3. each branch reports its statistics for the step — shared-prefix acceptance `s_b`,
     independent acceptance `i_b`, mean truncation depth `d_b` and vote weight `w_b`, raw or
     agreement-weighted by switch 3 — and `specjax.policy.consensus.decide_step` decides the
     step by the seed's own `execute_parallel_plan` (``consensus='seed'``: commit the
     weighted plurality of the branches whose `should_truncate_and_repropose` holds, else
     fallback) or by the quorum vote (``consensus='quorum'``); the other rule's verdict is
     recorded too;
  4. on fallback the verifier generates the step alone and a consensus round is charged;
     committed steps go to the plan journal exactly once; the batch's statistics feed the
     decision boundary (SPEC §6) for the next batch.

Randomness: every row's key is derived with `jax.random.fold_in` from (seed, plan, step,
branch), never by seed arithmetic, so a plan's noise does not depend on the batch it runs
in. Under the coupled rule the branches of a plan share the plan's key, and so do its
single-drafter baselines, the autoregressive reference and the fallback: all of them
commit the verifier's own sample for that noise.

State: every plan's verifier and drafter caches are carried from step to step
(`specjax.policy.plan_state`), so a step costs its own tokens: one verifier prefill per plan,
one drafter prefill per plan and drafter at its first use, catch-up passes for a drafter
that missed committed tokens.
"""

from __future__ import annotations

from typing import Callable, Sequence

import jax.numpy as jnp
import numpy as np

from specjax.engine.deployment import Deployment, prefix_distributions
from specjax.engine.gammas import widest_gamma
from specjax.metrics import price_key
from specjax.policy import boundary as boundary_lib
from specjax.policy.carried_scores import ScoreReads
from specjax.policy.consensus import BranchOutcome, branch_statistics, decide_step, exact_match
from specjax.policy.counters import RunStats
from specjax.policy.engine_calls import (
    autoregressive_carried,
    commit_carried,
    digest,
    drafter_temperatures,
    memoized,
    plan_keys,
    run_carried,
)
from specjax.policy.journal import PlanJournal
from specjax.policy.kl import pairwise_kl_common
from specjax.policy.layout import StepRows, branch_layout
from specjax.policy.plan_config import PlanConfig
from specjax.policy.plan_state import PlanStates, padded_count
from specjax.policy.scores import verifier_window
from specjax.policy.switches import Policy

# ---------------------------------------------------------------------------- the run


def run_plans(
    dep: Deployment,
    cfg: PlanConfig,
    prompts: Sequence[str],
    *,
    policy: Policy | None = None,
    single: int | Sequence[int | Sequence[int]] | None = None,
    router=None,
    journal: PlanJournal | None = None,
    plan_ids: Sequence[str] | None = None,
    agreement: Callable[[str, str], bool] = exact_match,
    fail_hook: Callable[[int, int], None] | None = None,
) -> tuple[list[str], RunStats]:
    """Executes every plan for `cfg.plan_steps` steps.

    One of: `policy` (parallel branches + the step decision), `single` (a drafter index,
    or one per plan: that drafter alone, rule 1, one branch, no consensus — the
    single-drafter baseline, or with one index per plan the oracle router; an entry may
    be a tuple of indices, a fixed drafter set: one branch, a token tree under the plan's
    tree rule), `router` (an
    adaptive policy, e.g. `specjax.policy.auto.AutoRouter`: one branch per plan, its
    drafter set chosen per step), or none of them (the verifier alone, autoregressive).

    Args:
      journal / plan_ids: where committed steps go; steps already journaled are not rerun
        (resume), each new one is committed exactly once.
      fail_hook: called as fail_hook(step, batch_row) before committing (failure injection
        in tests: raising there loses nothing already committed).

    Returns:
      (the full text of each plan, RunStats).
    """
    if sum(x is not None for x in (policy, single, router)) > 1:
        raise ValueError("run_plans: give at most one of policy, single, router")
    n_plans = len(prompts)
    gamma = widest_gamma(cfg.gamma, [d.gamma for d in dep.drafters])
    stats = RunStats(k=len(dep.drafters), gamma=gamma, n_plans=n_plans)
    plan_ids = list(plan_ids or [f"plan{i}" for i in range(n_plans)])
    texts, hist, done_steps = _resume(dep, prompts, plan_ids, journal)
    single = _drafter_per_plan(single, n_plans)
    split = _SplitSets()
    left = cfg.plan_steps - min(done_steps)
    states = None
    if left > 0:
        states = _start_states(dep, cfg, texts, hist, left, gamma, router, stats)
    for step in range(cfg.plan_steps):
        todo = [
            i for i, pid in enumerate(plan_ids) if journal is None or journal.get(pid, step) is None
        ]
        if not todo:
            continue
        modes = (policy, single, router, agreement)
        new, meta = _step_tokens(dep, cfg, states, todo, step, stats, split, modes)
        for j, i in enumerate(todo):
            if fail_hook is not None:
                fail_hook(step, j)
            text = dep.decode(new[j])
            if journal is not None:
                journal.commit(plan_ids[i], step, text, {**meta[j], "tokens": list(new[j])})
            texts[i] += text
            stats.add("steps", i, 1)
        # Acting on the boundary is part of switch 2 (per-position attribution with
        # truncation); the naive deployment keeps its shared block whatever the boundary says.
        acts = (
            policy is not None
            and cfg.boundary
            and policy.truncate_and_attribute
            and stats.decisions
        )
        split.after_batch(stats.decisions[-1] if acts else [])
    return texts, stats


def _start_states(dep, cfg, texts, hist, left, gamma, router, stats) -> PlanStates:
    """Every plan's state, carried from step to step (specjax.policy.plan_state): the
    verifier prefills each prompt once (charged to ``stats``, a share per plan); a step
    costs its own tokens."""
    n_plans = len(texts)
    states = PlanStates(
        dep,
        texts,
        hist,
        steps=left,
        gamma=gamma,
        max_step_tokens=cfg.max_step_tokens,
        bucket=cfg.bucket,
    )
    if router is not None and hasattr(router, "start"):
        router.start(states)  # e.g. `auto` measures its machine prices here
    secs, priced = states.take_charges()
    priced[price_key("verify", "verifier", states.width, n_plans, states.v_cap)] = 1
    for i in range(n_plans):
        stats.add("verifier_prefills", i, 1)
        stats.add("seconds", i, secs / n_plans)
        stats.add_priced(i, {key: x / n_plans for key, x in priced.items()})
    return states


def _step_tokens(dep, cfg, states, todo, step, stats, split, modes) -> tuple:
    """One step's new tokens and journal meta for the plans ``todo``, by the run's mode
    (``modes``: policy, single, router, agreement): the verifier alone, one routed branch
    per plan, or the policy's parallel branches and step decision."""
    policy, single, router, agreement = modes
    if policy is None and single is None and router is None:
        return _autoregressive_step(dep, cfg, states, todo, step, stats)
    if policy is None:
        if single is not None:
            sets = [single[i] for i in todo]
        elif hasattr(router, "choose_batch"):
            sets = router.choose_batch(todo, step)  # priced as the step's calls together
        else:
            sets = [router.choose(i, step) for i in todo]
        return _routed_step(dep, cfg, states, todo, step, stats, sets, router)
    return _policy_step(dep, cfg, states, todo, step, stats, policy, split.sets, agreement)


def _resume(dep, prompts, plan_ids, journal):
    """(each plan's text, verifier tokens and steps done): its prompt, and on a resume the
    journaled steps (their own verifier tokens; a journal written before steps kept their
    tokens is re-encoded)."""
    texts = list(prompts)
    hist = [dep.encode(t) for t in prompts]
    done_steps = [0] * len(prompts)
    if journal is None:
        return texts, hist, done_steps
    for i, pid in enumerate(plan_ids):
        steps = journal.committed_steps(pid)
        texts[i] = prompts[i] + "".join(s.text for s in steps)
        done_steps[i] = len(steps)
        if all("tokens" in s.meta for s in steps):
            hist[i] = hist[i] + [int(t) for s in steps for t in s.meta["tokens"]]
        else:
            hist[i] = dep.encode(texts[i])
    return texts, hist, done_steps


def _drafter_per_plan(single, n_plans: int) -> list[tuple[int, ...]] | None:
    """`single` (one drafter index or set, or one per plan) as one drafter set per plan."""
    if single is None:
        return None

    def as_set(x) -> tuple[int, ...]:
        members = tuple(int(i) for i in np.atleast_1d(x))
        if not members or len(set(members)) != len(members):
            raise ValueError(f"run_plans: drafter set {x!r} is empty or repeats a drafter")
        return members

    if np.ndim(single) == 0:
        return [as_set(single)] * n_plans
    out = [as_set(x) for x in single]
    if len(out) != n_plans:
        raise ValueError(f"run_plans: single has {len(out)} entries for {n_plans} plans")
    return out


class _SplitSets:
    """Sharing sets the decision boundary sent to independent branches: a split set stays
    independent for one batch, then is re-probed."""

    def __init__(self):
        self.sets: set = set()
        self._cooldown: dict = {}

    def after_batch(self, decisions) -> None:
        """Counts a batch down, then splits the sets the batch's boundary decided against."""
        for s in list(self._cooldown):
            self._cooldown[s] -= 1
            if self._cooldown[s] <= 0:
                self.sets.discard(s)
                del self._cooldown[s]
        for d in decisions:
            if not d.decision:
                self.sets.add(d.branch_id)
                self._cooldown[d.branch_id] = 2


# ---------------------------------------------------------------------------- the steps


def _autoregressive_step(dep, cfg, states, todo, step, stats):
    keys = plan_keys(cfg.seed, todo, step)
    new, secs, fwd = autoregressive_carried(states, dep, cfg, todo, keys)
    for i in todo:
        n = len(new[i])
        stats.add("tokens", i, n)
        stats.add("verifier_calls", i, n)  # one verifier call per token
        stats.add("seconds", i, secs / len(todo))
        stats.add_priced(i, {key: x / len(todo) for key, x in fwd.items()})
    return [new[i] for i in todo], [{"mode": "autoregressive"}] * len(todo)


def _charge_rows(stats, cfg, plan, rows, res):
    """Adds the engine counters and the itemised cost of one plan's distinct rows: its
    verifier calls (one per round, batched over the plan's rows or not), drafted tokens,
    drafter prefills (a drafter's first use in the plan) and catch-up passes."""
    counters = res.counters
    rounds = [int(counters.rounds[r]) for r in rows]
    stats.add("verifier_calls", plan, max(rounds) if cfg.share_verifier_call else sum(rounds))
    for r in rows:
        stats.add("verifier_tokens", plan, rounds[rows.index(r)] * res.drafts_per_round[r])
        stats.add_engine(counters, r, plan)
        stats.add("drafter_tokens", plan, counters.proposed[r])
        pre = np.asarray(counters.catchups[r]).copy()  # the engine's catch-up forwards
        pre[list(res.prefills[r])] += 1
        stats.add("drafter_prefills", plan, pre)
        if res.fills and res.fills[r]:  # the verifier's features for feature drafters
            stats.add("verifier_prefills", plan, res.fills[r])
        stats.add("seconds", plan, res.seconds[r])
        stats.add_priced(plan, res.priced[r])


def _routed_step(dep, cfg, states, todo, step, stats, sets, router):
    """One branch per plan, its drafter set given per plan (baseline, oracle, router)."""
    if cfg.coupled:
        keys = plan_keys(cfg.seed, todo, step)
    else:
        keys = plan_keys(cfg.seed, todo, step, branches=[0] * len(todo))
    rule = cfg.call_rule(2)  # sets of several drafters (a lone drafter: `run_carried`)
    gammas = None
    if router is not None and hasattr(router, "gamma_for"):
        gammas = [router.gamma_for(i) for i in todo]  # a lone drafter's γ (None: its own)
        stats.gamma_routes.append({i: g for i, g in zip(todo, gammas) if g is not None})
    res = run_carried(states, dep, cfg, rule, [tuple(s) for s in sets], list(todo), keys, gammas)
    commit_carried(
        states,
        res,
        list(todo),
        {i: j for j, i in enumerate(todo)},
        {i: res.tokens[j] for j, i in enumerate(todo)},
    )
    _charge_carry(stats, states, todo)
    out, meta = [], []
    for j, i in enumerate(todo):
        _charge_rows(stats, cfg, i, [j], res)
        stats.add("tokens", i, len(res.tokens[j]))
        out.append(res.tokens[j])
        names = [dep.names[x] for x in sets[j]]
        meta.append({"mode": "routed", "drafters": names})
        if router is not None:
            router.observe(i, step, sets[j], res.counters, j)
    if router is not None and getattr(router, "wants_scores", False):
        _score_step(dep, states, todo, step, [len(t) for t in out], router, stats)
    if router is not None:
        stats.routes.append({todo[j]: [dep.names[x] for x in sets[j]] for j in range(len(todo))})
    return out, meta


def _score_step(dep, states, todo, step, new, router, stats) -> None:
    """Every drafter scored teacher forced on the step's committed text of each plan in
    ``todo``, the sums over the positions that predicted the step's ``new`` tokens handed to
    the router (`AutoRouter.observe_scores`). The verifier continues from the carried cache
    over a block of the step's length (`policy.scores.verifier_window`: one program per
    run, like a verify call of max_step_tokens + 1 tokens) and every drafter's own carried
    read advances over the step's new tokens (`policy.carried_scores.ScoreReads`; a
    feature drafter reads the verifier's features of the step from the same block).
    The scoring is charged to the plans: its programs' seconds; in the modelled cost a
    verifier call and one forward of every drafter
    per plan and step (counted with the drafter prefills, c_i each, like a catch-up); by the
    machine prices, the verifier's block and every drafter's read program (a prefill at its
    first use)."""
    rows = [states.hist[i] for i in todo]
    pad = padded_count(len(rows)) - len(rows)
    window = -(-(max(states.max_step_tokens, *new) + 1) // 8) * 8
    plans = list(todo) + [todo[0]] * pad
    steps = list(new) + [new[0]] * pad
    v_law, lo, secs, hidden = verifier_window(
        dep, states.v.vcache, states.v_cap, plans, rows + [rows[0]] * pad, steps, window
    )
    if states.score_reads is None:
        states.score_reads = ScoreReads(dep, states)
    got, d_secs, priced = states.score_reads.score(plans, v_law, lo, steps, hidden)
    secs += d_secs
    sums = [got[:, j] for j in range(len(rows))]
    # Priced as the forwards it is: the verifier's block of `window` tokens over the
    # padded rows from the carried cache, and each drafter's read of the step (its
    # program: gather, read the new pieces, score, put back; a prefill at first use).
    key = price_key("verify", "verifier", window, len(plans), states.v_cap)
    priced[key] = priced.get(key, 0) + 1
    for j, i in enumerate(todo):
        router.observe_scores(i, step, sums[j], int(new[j]))
        stats.add("seconds", i, secs / len(todo))
        stats.add("verifier_calls", i, 1)
        stats.add_priced(i, {k: x / len(todo) for k, x in priced.items()})
        stats.add("drafter_prefills", i, np.ones(len(dep.drafters), np.int64))


def _policy_step(dep, cfg, states, todo, step, stats, policy, split, agreement):
    """One step of every plan in `todo` under `policy`: the layout, one engine call per
    drafter set, the per-batch boundary, each plan's step decision, then the fallback of
    the plans that fell back and the carried state past the step."""
    kl_pair = _kl_on_prefix(dep, cfg, [states.hist[i] for i in todo], stats)  # every policy
    n_groups = len(dict.fromkeys(dep.groups))
    sets, branches, rule = branch_layout(
        dep, policy, kl_pair, split, cfg.n_branches or n_groups, cfg.rule
    )
    n_p = len(todo)
    rows = StepRows(branches, n_p, cfg.coupled)
    keys = plan_keys(cfg.seed, [todo[p] for p in rows.plans], step, branches=rows.key_branches)
    res = run_carried(states, dep, cfg, rule, rows.sets, [todo[p] for p in rows.plans], keys)
    stats.decisions.append(_boundary_decisions(cfg, policy, sets, rows, res.counters, n_p))
    out, meta = [None] * n_p, [None] * n_p
    for p in range(n_p):
        out[p], meta[p] = _decide_plan(
            dep, cfg, policy, stats, step, p, todo[p], rows, res, agreement
        )
    fallback = [p for p in range(n_p) if out[p] is None]
    if fallback:
        _fallback_step(dep, cfg, states, todo, fallback, step, stats, out)
    committed = {
        todo[p]: None if p in fallback else rows.row(p, meta[p]["branch"]) for p in range(n_p)
    }
    commit_carried(
        states, res, [todo[p] for p in rows.plans], committed, {todo[p]: out[p] for p in range(n_p)}
    )
    _charge_carry(stats, states, todo)
    return out, meta


def _boundary_decisions(cfg, policy, sets, rows: StepRows, c, n_p: int) -> list:
    """The per-batch boundary (SPEC §6) of every sharing set with ≥ 2 drafters."""
    per_set = {}
    for s in sets:
        if len(s) < 2:
            continue
        set_rows = sorted(
            {rows.row(p, b) for p in range(n_p) for b, bs in enumerate(rows.branches) if bs == s}
        )
        per_set[tuple(s)] = _batch_stats(
            c, set_rows, cfg.gamma, policy.agreement_weighted_consensus
        )
    return boundary_lib.evaluate_boundary(per_set, **cfg.thresholds.kwargs()) if per_set else []


def _decide_plan(dep, cfg, policy, stats, step, p, plan, rows: StepRows, res, agreement):
    """Plan `plan`'s step decision from its branches' rows (`decide_step`), with its costs
    charged and what the decision read recorded; returns (the committed tokens, or None
    for fallback; the journal's meta)."""
    k, branches = len(dep.drafters), rows.branches
    n_b = len(branches)
    _charge_rows(stats, cfg, plan, sorted({rows.row(p, b) for b in range(n_b)}), res)
    if policy.kl_ceiling is not None and k >= 2:
        stats.add("kl_passes", plan, np.ones(k, np.int64))
    outcomes, cands = [], []
    for b in range(n_b):
        r = rows.row(p, b)
        st = branch_statistics(
            res.counters, r, len(branches[b]), cfg.gamma, policy.agreement_weighted_consensus
        )
        cand = dep.decode(res.tokens[r])
        cands.append(cand)
        outcomes.append(BranchOutcome(b, cand, st["w"], st["s"], st["d"], st["i"]))
        stats.branch_records.append(
            dict(
                step=step,
                plan=plan,
                branch=b,
                drafters=[dep.names[j] for j in branches[b]],
                candidate=cands.index(cand),
                **{x: _r(y) for x, y in st.items()},
            )
        )
    decision = decide_step(
        outcomes, cfg.consensus, cfg.thresholds, cfg.consensus_threshold, agreement, stats.collapses
    )
    for b, verdict in decision.verdicts.items():
        stats.branch_records[-n_b + b]["decision"] = verdict
    commit = decision.committed
    stats.step_records.append(
        dict(
            step=step,
            plan=plan,
            seed_commit=decision.seed_commit,
            quorum_commit=decision.quorum_commit,
            quorum_support=_r(decision.quorum_support),
            committed=commit,
            candidates=len(set(cands)),
        )
    )
    meta = {
        "consensus": cfg.consensus,
        "fallback": commit is None,
        "branch": commit,
        "quorum_support": _r(decision.quorum_support),
        "weights": [_r(o.weight) for o in outcomes],
    }
    if commit is None:
        return None, meta
    tokens = list(res.tokens[rows.row(p, commit)])
    stats.add("tokens", plan, len(tokens))
    return tokens, meta


def _fallback_step(dep, cfg, states, todo, fallback, step, stats, out) -> None:
    """The verifier generates the step alone for the plans (indices into `todo`) that fell
    back, from their carried state, in a call of their rows only; fills `out`. Under the
    coupled rule it uses the plan's noise, so the fallback commits the very step the
    branches produced (the output stays the verifier's own sample whatever the decision);
    otherwise the plan's fallback stream."""
    plans = [todo[p] for p in fallback]
    keys = plan_keys(cfg.seed, plans, step, fallback=not cfg.coupled)
    new, secs, fwd = autoregressive_carried(states, dep, cfg, plans, keys)
    for p in fallback:
        plan = todo[p]
        out[p] = new[plan]
        n = len(new[plan])
        stats.add("tokens", plan, n)
        stats.add("verifier_calls", plan, n)
        stats.add("consensus_rounds", plan, 1)
        stats.add("fallbacks", plan, 1)
        stats.add("seconds", plan, secs / len(plans))
        stats.add_priced(plan, {key: x / len(plans) for key, x in fwd.items()})


def _charge_carry(stats, states, todo):
    """The seconds and the price keys of carrying the step's state (commit programs),
    split over its plans."""
    secs, priced = states.take_charges()
    for i in todo:
        stats.add("seconds", i, secs / len(todo))
        stats.add_priced(i, {key: x / len(todo) for key, x in priced.items()})


def _r(x):
    return round(float(x), 6) if isinstance(x, float) and np.isfinite(x) else x


def _batch_stats(c, rows, gamma, agreement_weighted):
    """Boundary inputs of one sharing set over one batch (SPEC §6), pooled over its rows."""
    rows = np.asarray(rows)
    mr, mf, mrounds = (
        c.multi_reached[rows].sum(),
        c.multi_from_draft[rows].sum(),
        c.multi_rounds[rows].sum(),
    )
    oa, orr, prop = (
        c.own_accepted_at[rows].sum(),
        c.own_reached_at[rows].sum(),
        c.proposed[rows].sum(),
    )
    if agreement_weighted:
        shared, indep = (mf / mr if mr else float("nan")), (oa / orr if orr else float("nan"))
    else:
        shared = mf / (gamma * mrounds) if mrounds else float("nan")
        indep = oa / prop if prop else float("nan")
    tr = c.truncations[rows].sum()
    depth = c.discarded[rows].sum() / tr if tr else 0.0
    return boundary_lib.BoundaryStats(float(shared), float(depth), float(indep))


def _bucket(n: int, b: int) -> int:
    return ((n + b - 1) // b) * b


def _kl_on_prefix(dep, cfg, v, stats, width: int = 0):
    """f32[K, K] KL per ordered pair on the common support, mean over the last positions of
    every plan's prefix; records the max, the mean and the mass outside the support."""
    if len(dep.drafters) < 2:
        return None
    from specjax.engine.prefill import pad_prompts  # pylint: disable=import-outside-toplevel

    arr, lens = pad_prompts(v)
    width = _bucket(max(arr.shape[1], width), cfg.bucket)
    arr = np.pad(arr, ((0, 0), (0, width - arr.shape[1])))
    last = min(cfg.kl_positions, int(lens.min()))

    def compute():
        q, ok = prefix_distributions(dep, arr, lens, last)
        support = jnp.stack([jnp.asarray(dd.from_verifier) >= 0 for dd in dep.d_data])
        kl, outside = pairwise_kl_common(q, support)
        return np.asarray(kl)[:, :, ok], np.asarray(outside)[:, :, ok]  # [K, K, N]

    key = (
        "kl",
        tuple(id(dd.params) for dd in dep.d_data),
        drafter_temperatures(dep),
        last,
        digest(arr, lens),
    )
    kl, outside = memoized(key, tuple(dd.params for dd in dep.d_data), compute)
    pair = kl.mean(-1)
    off = ~np.eye(len(pair), dtype=bool)
    stats.kl_max.append(float(pair[off].max()))
    stats.kl_mean.append(float(pair[off].mean()))
    stats.kl_outside.append(float(outside.mean(-1)[off].max()))
    return pair
