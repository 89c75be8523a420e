"""Parallel plan execution under a policy: branches, the step decision, fallback (SPEC §5–6).

A plan is a prompt followed by `plan_steps` steps; a step ends at a stop token (a verifier
token containing the step delimiter) or after `max_step_tokens`. For every step, all plans
of the batch advance together (one batch = one step of every plan):

  1. the policy forms *sharing sets* — drafters that extend one prefix in one verifier
     block: all drafters (switch 1 off) or one set per tokenizer group (switch 1 on), split
     further by the KL ceiling (switch 4) and by the decision boundary of the previous batch;
  2. *branches* are built from the sets (at least `n_branches`, default one per tokenizer
     group); every (plan, branch) is one engine row, and the rows of one drafter set run in
     one engine call with only that set's drafters; the rule is `token_tree` (switch 2 on) or
     the naive `shared_block` (off) — under the coupled rule `coupled` or `coupled_block`;
  3. each branch reports its statistics for the step — shared-prefix acceptance `s_b`,
     independent acceptance `i_b`, mean truncation depth `d_b` and vote weight `w_b`, raw or
     agreement-weighted by switch 3 (`branch_statistics`) — and the step is decided by the
     seed's own `execute_parallel_plan` (``consensus='seed'``: commit the weighted plurality
     of the branches whose `should_truncate_and_repropose` holds, else fallback) or by the
     quorum vote (``consensus='quorum'``); the other rule's verdict is recorded too;
  4. on fallback the verifier generates the step alone and a consensus round is charged;
     committed steps go to the plan journal exactly once; the batch's statistics feed the
     decision boundary (SPEC §6) for the next batch.

Randomness: every row's key is derived with `jax.random.fold_in` from (seed, plan, step,
branch), never by seed arithmetic, so a plan's noise does not depend on the batch it runs
in. Under the coupled rule the branches of a plan share the plan's key, and so do its
single-drafter baselines, the autoregressive reference and the fallback: all of them
commit the verifier's own sample for that noise.

State: every plan's verifier and drafter caches are carried from step to step
(`specjax.policy.carry`), so a step costs its own tokens: one verifier prefill per plan,
one drafter prefill per plan and drafter at its first use, catch-up passes for a drafter
that missed committed tokens.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

import jax.numpy as jnp
import numpy as np

from specjax.engine.deployment import Deployment, prefix_distributions
from specjax.engine.spec import EngineConfig
from specjax.errors import ConfigError
from specjax.policy import boundary as boundary_lib
from specjax.policy.calls import (autoregressive_carried, commit_carried, digest,
                                  drafter_temperatures, enable_shared_calls, memoized,
                                  plan_keys, run_carried,
                                  shared_calls)  # noqa: F401 (the last two re-exported)
from specjax.policy.carry import PlanStates
from specjax.policy.consensus import decide, exact_match, vote_weight
from specjax.policy.journal import PlanJournal
from specjax.policy.kl import kl_groups, pairwise_kl_common
from specjax.policy.runstats import RunStats
from specjax.policy.switches import Policy

CONSENSUS_RULES = ("seed", "quorum")


@dataclasses.dataclass(frozen=True)
class PlanConfig:
    """How plans are executed (every field is validated).

    Attributes:
      gamma: γ draft tokens per chain per round.
      verifier_temperature: τ of the verifier (0 = greedy).
      plan_steps: steps per plan.
      max_step_tokens: token budget of one step.
      consensus: the step decision: 'seed' (`execute_parallel_plan`: commit from the
        branches whose boundary check holds, else fallback) or 'quorum' (weighted plurality,
        committed iff its support ≥ `consensus_threshold`).
      consensus_threshold: the quorum rule's support threshold, in (0, 1].
      thresholds: the decision boundary's thresholds (the seed's by default).
      n_branches: minimum number of parallel branches (None = one per tokenizer group).
      rule: None (the policy's switch 2 picks the rule) or 'coupled' (shared Gumbel noise
        across the branches of a plan: drafter-invariant; switch 2 picks `coupled` or the
        naive `coupled_block`).
      consensus_cost: modelled cost of one consensus round, in verifier calls.
      share_verifier_call: the cost model batches the branches of a plan into one verifier
        call per round (True) or charges each branch's rounds as calls (False).
      kl_positions: the last positions of the shared prefix on which the KL is measured.
      boundary: act on the per-batch boundary (a set below it runs its drafters as
        independent branches in the next batch).
      bucket: prompts are padded to a multiple of this (no retrace per step).
      seed: PRNG seed.
    """
    gamma: int = 4
    verifier_temperature: float = 0.0
    plan_steps: int = 4
    max_step_tokens: int = 32
    consensus: str = "seed"
    consensus_threshold: float = 0.5
    thresholds: boundary_lib.BoundaryThresholds = boundary_lib.BoundaryThresholds()
    n_branches: int | None = None
    rule: str | None = None
    consensus_cost: float = 1.0
    share_verifier_call: bool = True
    kl_positions: int = 16
    boundary: bool = True
    bucket: int = 64
    seed: int = 0

    def __post_init__(self):
        EngineConfig(gamma=self.gamma, verifier_temperature=self.verifier_temperature,
                     max_new_tokens=self.max_step_tokens)
        def bad(field, allowed):
            raise ConfigError.invalid(field, getattr(self, field), allowed)
        if isinstance(self.plan_steps, bool) or not (isinstance(self.plan_steps, int)
                                                     and self.plan_steps >= 1):
            bad("plan_steps", "an integer ≥ 1")
        if self.consensus not in CONSENSUS_RULES:
            bad("consensus", list(CONSENSUS_RULES))
        if not (isinstance(self.consensus_threshold, (int, float))
                and 0 < self.consensus_threshold <= 1):
            bad("consensus_threshold", "a number in (0, 1]")
        if not isinstance(self.thresholds, boundary_lib.BoundaryThresholds):
            bad("thresholds", "a BoundaryThresholds")
        if self.rule not in (None, "coupled"):
            bad("rule", "None or 'coupled'")
        if self.n_branches is not None and not (isinstance(self.n_branches, int)
                                                and self.n_branches >= 1):
            bad("n_branches", "None or an integer ≥ 1")
        if not (isinstance(self.consensus_cost, (int, float)) and np.isfinite(
                self.consensus_cost) and self.consensus_cost >= 0):
            bad("consensus_cost", "a finite number ≥ 0")
        if not (isinstance(self.bucket, int) and self.bucket >= 1):
            bad("bucket", "an integer ≥ 1")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            bad("seed", "an integer ≥ 0")
        if not (isinstance(self.kl_positions, int) and self.kl_positions >= 1):
            bad("kl_positions", "an integer ≥ 1")

    @property
    def coupled(self) -> bool:
        return self.rule == "coupled"


# ---------------------------------------------------------------------------- layout

def sharing_sets(dep: Deployment, policy: Policy, kl_pair: np.ndarray | None,
                 split: set[tuple[int, ...]] = frozenset()) -> list[list[int]]:
    """The drafter sets that share a prefix (indices in priority order).

    Args:
      kl_pair: f32[K, K] KL per ordered pair (mean over the shared-prefix positions), used
        when the policy has a ceiling.
      split: sets the decision boundary sent to independent branches.
    """
    k = len(dep.drafters)
    if policy.prefix_partitioning:
        labels = list(dict.fromkeys(dep.groups))
        sets = [[i for i in range(k) if dep.groups[i] == g] for g in labels]
    else:
        sets = [list(range(k))]
    if policy.kl_ceiling is not None and kl_pair is not None:
        out = []
        for s in sets:
            sub = kl_groups(kl_pair[np.ix_(s, s)], policy.kl_ceiling)
            out += [[s[i] for i in g] for g in sub]
        sets = out
    final = []
    for s in sets:
        final += [[i] for i in s] if tuple(s) in split else [s]
    return final


def branch_layout(dep: Deployment, policy: Policy, kl_pair, split, n_branches: int):
    """(sets, branches, rule) of a policy: who shares a prefix, the branch list, the rule.

    Branches are the sharing sets, repeated in turn until there are `n_branches` of them
    (with one shared set, every branch runs the same drafters on its own random stream).
    """
    sets = sharing_sets(dep, policy, kl_pair, split)
    n_b = max(n_branches, len(sets))
    branches = [sets[b % len(sets)] for b in range(n_b)]
    rule = "token_tree" if policy.truncate_and_attribute else "shared_block"
    return sets, branches, rule


def branch_slots(branches) -> np.ndarray:
    """i32[n_branches, S]: each branch's drafters in priority order, -1 for an empty slot."""
    s_max = max(len(b) for b in branches)
    out = np.full((len(branches), s_max), -1, np.int32)
    for i, b in enumerate(branches):
        out[i, :len(b)] = b
    return out


def _bucket(n: int, b: int) -> int:
    return ((n + b - 1) // b) * b


# ---------------------------------------------------------------------------- statistics

def branch_statistics(c, row: int, n_set: int, gamma: int, agreement_weighted: bool) -> dict:
    """A branch's step statistics from its row's counters (SPEC §5).

    Returns raw and agreement-weighted forms of `s` (shared-prefix acceptance: the joint
    acceptance over the blocks its set verified together; a one-drafter set shares nothing,
    so `s = i`), `i` (independent acceptance: its drafters' chains tested alone against p),
    `w` (vote weight), and `d` (mean truncation depth, the boundary's input) with `s`, `i`,
    `w` as switch 3 picks them. Raw: accepted / proposed positions (tokens discarded after a
    truncation count against the branch); agreement-weighted: accepted / (accepted +
    rejected), i.e. positions after a chain's cut are not counted.
    """
    def ratio(a, b):
        return float(a) / float(b) if b else float("nan")
    own_acc = c.own_accepted_at[row].sum()
    own_reach = c.own_reached_at[row].sum()
    proposed = c.proposed[row].sum()
    i_w, i_r = ratio(own_acc, own_reach), ratio(own_acc, proposed)
    if n_set >= 2:
        s_w = ratio(c.multi_from_draft[row], c.multi_reached[row])
        s_r = ratio(c.multi_from_draft[row], gamma * c.multi_rounds[row])
    else:
        s_w, s_r = i_w, i_r
    acc, rej = int(c.accepted[row].sum()), int(c.rejected[row].sum())
    w_w = vote_weight(acc, int(proposed), rej, True)
    w_r = vote_weight(acc, int(proposed), rej, False)
    tr = int(c.truncations[row])
    depth = float(c.discarded[row]) / tr if tr else 0.0
    pick = (lambda wtd, raw: wtd) if agreement_weighted else (lambda wtd, raw: raw)
    return {"s": pick(s_w, s_r), "i": pick(i_w, i_r), "w": pick(w_w, w_r), "d": depth,
            "s_weighted": s_w, "s_raw": s_r, "i_weighted": i_w, "i_raw": i_r,
            "w_weighted": w_w, "w_raw": w_r, "truncations": tr,
            "pruned": int(c.pruned[row])}


@dataclasses.dataclass
class BranchOutcome:
    """One branch of one step, as `execute_parallel_plan` reads it (SPEC §5–6)."""
    index: int
    candidate: str
    weight: float
    shared_acceptance: float
    truncation_depth: float
    independent_acceptance: float
    collapse: str | None = None

    def record_collapse(self, exc: boundary_lib.SpeculativePrefixCollapseError) -> None:
        self.collapse = exc.reason


class SeedConsensus:
    """`execute_parallel_plan`'s consensus: commit the candidate with the largest total
    weight among the passing branches (ties → branch priority); fallback is executed by the
    caller (the verifier generates the step alone, batched over the plans that need it)."""

    def __init__(self, agreement: Callable[[str, str], bool] = exact_match):
        self.agreement = agreement

    def commit(self, branches: Sequence[BranchOutcome], verifier=None) -> BranchOutcome:
        totals = [sum(o.weight for o in branches if self.agreement(o.candidate, b.candidate))
                  for b in branches]
        return branches[max(range(len(branches)), key=lambda i: (totals[i], -i))]

    def fallback(self, branches, verifier=None) -> None:
        return None


def seed_step_decision(outcomes: Sequence[BranchOutcome], thresholds, log=None,
                       agreement=exact_match) -> tuple[BranchOutcome | None, list]:
    """The seed's step decision over one plan's branches: (the committed branch or None for
    fallback, the per-branch `BoundaryDecision` records)."""
    records = []
    chosen = boundary_lib.execute_parallel_plan(
        outcomes, None, SeedConsensus(agreement), log=log, on_decisions=records.extend,
        **thresholds.kwargs())
    return chosen, records


# ---------------------------------------------------------------------------- the run

def run_plans(dep: Deployment, cfg: PlanConfig, prompts: Sequence[str], *,
              policy: Policy | None = None, single: int | Sequence[int] | None = None,
              router=None, journal: PlanJournal | None = None,
              plan_ids: Sequence[str] | None = None,
              agreement: Callable[[str, str], bool] = exact_match,
              fail_hook: Callable[[int, int], None] | None = None) -> tuple[list[str], RunStats]:
    """Executes every plan for `cfg.plan_steps` steps.

    One of: `policy` (parallel branches + the step decision), `single` (a drafter index,
    or one per plan: that drafter alone, rule 1, one branch, no consensus — the
    single-drafter baseline, or with one index per plan the oracle router), `router` (an
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
    k = len(dep.drafters)
    n_plans = len(prompts)
    gamma = max([cfg.gamma] + [d.gamma for d in dep.drafters if d.gamma])  # per-drafter γ_i
    stats = RunStats(k=k, gamma=gamma, n_plans=n_plans)
    plan_ids = list(plan_ids or [f"plan{i}" for i in range(n_plans)])
    texts = list(prompts)
    hist = [dep.encode(t) for t in prompts]
    done_steps = [0] * n_plans
    if journal is not None:  # Resume: replay committed steps (their own verifier tokens).
        for i, pid in enumerate(plan_ids):
            steps = journal.committed_steps(pid)
            texts[i] = prompts[i] + "".join(s.text for s in steps)
            done_steps[i] = len(steps)
            if all("tokens" in s.meta for s in steps):
                hist[i] = hist[i] + [int(t) for s in steps for t in s.meta["tokens"]]
            else:   # a journal written before steps kept their tokens
                hist[i] = dep.encode(texts[i])
    if single is not None:
        single = [int(single)] * n_plans if np.ndim(single) == 0 else [int(x) for x in single]
        if len(single) != n_plans:
            raise ValueError(f"run_plans: single has {len(single)} entries for {n_plans} plans")
    split: set = set()
    cooldown: dict = {}
    left = cfg.plan_steps - min(done_steps)
    states = None
    if left > 0:
        # Every plan's state is carried from step to step (specjax.policy.carry): the
        # verifier prefills each prompt once; a step costs its own tokens.
        states = PlanStates(dep, texts, hist, steps=left, gamma=gamma,
                            max_step_tokens=cfg.max_step_tokens, bucket=cfg.bucket)
        secs = states.take_seconds()
        for i in range(n_plans):
            stats.add("verifier_prefills", i, 1)
            stats.add("seconds", i, secs / n_plans)
    for step in range(cfg.plan_steps):
        todo = [i for i, pid in enumerate(plan_ids)
                if journal is None or journal.get(pid, step) is None]
        if not todo:
            continue
        if policy is None and single is None and router is None:
            new, meta = _autoregressive_step(dep, cfg, states, todo, step, stats)
        elif policy is None:
            sets = ([(single[i],) for i in todo] if single is not None
                    else [router.choose(i, step) for i in todo])
            new, meta = _routed_step(dep, cfg, states, todo, step, stats, sets, router)
        else:
            new, meta = _policy_step(dep, cfg, states, todo, step, stats, policy, split,
                                     agreement)
        for j, i in enumerate(todo):
            if fail_hook is not None:
                fail_hook(step, j)
            text = dep.decode(new[j])
            if journal is not None:
                journal.commit(plan_ids[i], step, text, {**meta[j], "tokens": list(new[j])})
            texts[i] += text
            stats.add("steps", i, 1)
        # Boundary bookkeeping: split sets stay independent for one batch, then re-probe.
        for s in list(cooldown):
            cooldown[s] -= 1
            if cooldown[s] <= 0:
                split.discard(s)
                del cooldown[s]
        # Acting on the boundary is part of switch 2 (per-position attribution with
        # truncation); the naive deployment keeps its shared block whatever the boundary says.
        if (policy is not None and cfg.boundary and policy.truncate_and_attribute
                and stats.decisions):
            for d in stats.decisions[-1]:
                if not d.decision:
                    split.add(d.branch_id)
                    cooldown[d.branch_id] = 2
    return texts, stats


def _autoregressive_step(dep, cfg, states, todo, step, stats):
    keys = plan_keys(cfg.seed, todo, step)
    new, secs = autoregressive_carried(states, dep, cfg, todo, keys)
    for i in todo:
        n = len(new[i])
        stats.add("tokens", i, n)
        stats.add("verifier_calls", i, n)  # one verifier call per token
        stats.add("seconds", i, secs / len(todo))
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
        pre = np.asarray(counters.catchups[r]).copy()   # the engine's catch-up forwards
        pre[list(res.prefills[r])] += 1
        stats.add("drafter_prefills", plan, pre)
        stats.add("seconds", plan, res.seconds[r])


def _routed_step(dep, cfg, states, todo, step, stats, sets, router):
    """One branch per plan, its drafter set given per plan (baseline, oracle, router)."""
    if cfg.coupled:
        keys = plan_keys(cfg.seed, todo, step)
    else:
        keys = plan_keys(cfg.seed, todo, step, branches=[0] * len(todo))
    rule = ("coupled" if cfg.coupled else "token_tree")
    res = run_carried(states, dep, cfg, rule, [tuple(s) for s in sets], list(todo), keys)
    commit_carried(states, res, list(todo), {i: j for j, i in enumerate(todo)},
                   {i: res.tokens[j] for j, i in enumerate(todo)})
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
    if router is not None:
        stats.routes.append({todo[j]: [dep.names[x] for x in sets[j]] for j in range(len(todo))})
    return out, meta


def _policy_step(dep, cfg, states, todo, step, stats, policy, split, agreement):
    k = len(dep.drafters)
    v = [states.hist[i] for i in todo]
    kl_pair = _kl_on_prefix(dep, cfg, v, stats)  # measured under every policy
    n_groups = len(dict.fromkeys(dep.groups))
    sets, branches, rule = branch_layout(dep, policy, kl_pair, split,
                                         cfg.n_branches or n_groups)
    if cfg.coupled:
        rule = "coupled" if policy.truncate_and_attribute else "coupled_block"
    n_b, n_p = len(branches), len(todo)
    # Rows: one per (plan, branch); under coupling identical branches of a plan are one row.
    row_of, row_sets, row_plans, row_keys = {}, [], [], []
    for p in range(n_p):
        for b, bs in enumerate(branches):
            ident = (p, tuple(bs)) if cfg.coupled else (p, b)
            if ident not in row_of:
                row_of[ident] = len(row_sets)
                row_sets.append(tuple(bs))
                row_plans.append(p)
                row_keys.append((todo[p], -1 if cfg.coupled else b))
    keys = plan_keys(cfg.seed, [pl for pl, _ in row_keys], step,
                     branches=[br for _, br in row_keys])
    res = run_carried(states, dep, cfg, rule, row_sets, [todo[p] for p in row_plans], keys)
    c = res.counters

    def row(p, b):
        return row_of[(p, tuple(branches[b])) if cfg.coupled else (p, b)]

    # Per-batch boundary (SPEC §6), per sharing set with ≥ 2 drafters.
    per_set = {}
    for s in sets:
        if len(s) < 2:
            continue
        rows = sorted({row(p, b) for p in range(n_p) for b, bs in enumerate(branches)
                       if bs == s})
        per_set[tuple(s)] = _batch_stats(c, rows, cfg.gamma, policy.agreement_weighted_consensus)
    decisions = (boundary_lib.evaluate_boundary(per_set, **cfg.thresholds.kwargs())
                 if per_set else [])
    stats.decisions.append(decisions)

    out, meta, fallback_plans = [None] * n_p, [None] * n_p, []
    for p in range(n_p):
        plan = todo[p]
        prow = sorted({row(p, b) for b in range(n_b)})
        _charge_rows(stats, cfg, plan, prow, res)
        if policy.kl_ceiling is not None and k >= 2:
            stats.add("kl_passes", plan, np.ones(k, np.int64))
        outcomes, cands = [], []
        for b in range(n_b):
            r = row(p, b)
            st = branch_statistics(c, r, len(branches[b]), cfg.gamma,
                                   policy.agreement_weighted_consensus)
            cand = dep.decode(res.tokens[r])
            cands.append(cand)
            outcomes.append(BranchOutcome(b, cand, st["w"], st["s"], st["d"], st["i"]))
            stats.branch_records.append(dict(
                step=step, plan=plan, branch=b, drafters=[dep.names[j] for j in branches[b]],
                candidate=cands.index(cand), **{x: _r(y) for x, y in st.items()}))
        chosen, records = seed_step_decision(outcomes, cfg.thresholds, stats.collapses,
                                             agreement)
        for rec, o in zip(records, outcomes):
            stats.branch_records[-n_b + o.index]["decision"] = (
                rec.reason if rec.reason else bool(rec.decision))
        vote = decide(cands, [o.weight for o in outcomes], agreement, cfg.consensus_threshold)
        seed_commit = None if chosen is None else chosen.index
        quorum_commit = None if vote.fallback else vote.plurality_index
        commit = seed_commit if cfg.consensus == "seed" else quorum_commit
        stats.step_records.append(dict(
            step=step, plan=plan, seed_commit=seed_commit, quorum_commit=quorum_commit,
            quorum_support=_r(vote.support), committed=commit,
            candidates=len(set(cands))))
        meta[p] = {"consensus": cfg.consensus, "fallback": commit is None,
                   "branch": commit, "quorum_support": _r(vote.support),
                   "weights": [_r(o.weight) for o in outcomes]}
        if commit is None:
            fallback_plans.append(p)
        else:
            out[p] = list(res.tokens[row(p, commit)])
            stats.add("tokens", plan, len(out[p]))
    if fallback_plans:
        # The verifier generates the step alone, from the plan's carried state, in a batch
        # of every plan's row. Under the coupled rule it uses the plan's noise, so the
        # fallback commits the very step the branches produced (the output stays the
        # verifier's own sample whatever the decision); otherwise the plan's fallback stream.
        plans = [todo[p] for p in fallback_plans]
        keys = plan_keys(cfg.seed, plans, step, fallback=not cfg.coupled)
        new, secs = autoregressive_carried(states, dep, cfg, plans, keys)
        for p in fallback_plans:
            plan = todo[p]
            out[p] = new[plan]
            n = len(new[plan])
            stats.add("tokens", plan, n)
            stats.add("verifier_calls", plan, n)
            stats.add("consensus_rounds", plan, 1)
            stats.add("fallbacks", plan, 1)
            stats.add("seconds", plan, secs / len(plans))
    committed = {todo[p]: (None if out_row is None else out_row)
                 for p, out_row in enumerate(
                     [None if p in fallback_plans else row(p, meta[p]["branch"])
                      for p in range(n_p)])}
    commit_carried(states, res, [todo[p] for p in row_plans], committed,
                   {todo[p]: out[p] for p in range(n_p)})
    _charge_carry(stats, states, todo)
    return out, meta


def _charge_carry(stats, states, todo):
    """The seconds of carrying the step's state (commit programs), split over its plans."""
    secs = states.take_seconds()
    for i in todo:
        stats.add("seconds", i, secs / len(todo))


def _r(x):
    return round(float(x), 6) if isinstance(x, float) and np.isfinite(x) else x


def _batch_stats(c, rows, gamma, agreement_weighted):
    """Boundary inputs of one sharing set over one batch (SPEC §6), pooled over its rows."""
    rows = np.asarray(rows)
    mr, mf, mrounds = (c.multi_reached[rows].sum(), c.multi_from_draft[rows].sum(),
                       c.multi_rounds[rows].sum())
    oa, orr, prop = (c.own_accepted_at[rows].sum(), c.own_reached_at[rows].sum(),
                     c.proposed[rows].sum())
    if agreement_weighted:
        shared, indep = (mf / mr if mr else float("nan")), (oa / orr if orr else float("nan"))
    else:
        shared = mf / (gamma * mrounds) if mrounds else float("nan")
        indep = oa / prop if prop else float("nan")
    tr = c.truncations[rows].sum()
    depth = c.discarded[rows].sum() / tr if tr else 0.0
    return boundary_lib.BoundaryStats(float(shared), float(depth), float(indep))


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
        return np.asarray(kl)[:, :, ok], np.asarray(outside)[:, :, ok]   # [K, K, N]

    key = ("kl", tuple(id(dd.params) for dd in dep.d_data), drafter_temperatures(dep), last,
           digest(arr, lens))
    kl, outside = memoized(key, tuple(dd.params for dd in dep.d_data), compute)
    pair = kl.mean(-1)
    off = ~np.eye(len(pair), dtype=bool)
    stats.kl_max.append(float(pair[off].max()))
    stats.kl_mean.append(float(pair[off].mean()))
    stats.kl_outside.append(float(outside.mean(-1)[off].max()))
    return pair
