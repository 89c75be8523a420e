"""Parallel plan execution under a policy: branches, consensus, fallback, the boundary.

A plan is a prompt followed by `plan_steps` steps; a step ends at a stop token (a verifier
token containing the step delimiter) or after `max_step_tokens`. For every step, all plans
of the batch advance together (one batch = one step of every plan):

  1. the policy forms *sharing sets* — drafters that extend one prefix in one verifier
     block: all drafters (switch 1 off) or one set per tokenizer group (switch 1 on), split
     further by the KL ceiling (switch 4) and by the decision boundary of the previous batch;
  2. branches are built from the sets (at least `n_branches`, default one per tokenizer
     group); every (plan, branch) is one engine row, its slots its set's drafters, and the
     rows of one drafter set run in one engine call with only that set's drafters; the rule
     is `token_tree` (switch 2 on) or the naive `shared_block` (off) — under the coupled rule
     `coupled` or `coupled_block`, with one call per plan and set (shared noise);
  3. per plan, the branches' candidate steps are voted on with raw or agreement-weighted
     weights (switch 3); the plurality is committed if its support reaches the threshold,
     else the verifier generates the step alone (fallback, one consensus round charged);
  4. committed steps go to the plan journal exactly once; the batch's statistics feed the
     decision boundary (SPEC §6) for the next batch.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, Sequence

import jax
import numpy as np

from specjax.engine.deployment import Deployment, prefix_distributions
from specjax.engine.generate import (GenerateResult, autoregressive_generate, row_keys_for,
                                     speculative_generate)
from specjax.engine.spec import EngineConfig
from specjax.errors import ConfigError
from specjax.policy import boundary as boundary_lib
from specjax.policy.consensus import decide, exact_match, vote_weight
from specjax.policy.journal import PlanJournal
from specjax.policy.kl import kl_groups, pairwise_kl
from specjax.policy.switches import Policy


@dataclasses.dataclass(frozen=True)
class PlanConfig:
    """How plans are executed (every field is validated).

    Attributes:
      gamma: γ draft tokens per chain per round.
      verifier_temperature: τ of the verifier (0 = greedy).
      plan_steps: steps per plan.
      max_step_tokens: token budget of one step.
      consensus_threshold: support needed to commit without fallback, in (0, 1].
      n_branches: minimum number of parallel branches (None = one per tokenizer group).
      rule: None (the policy's switch 2 picks the rule) or 'coupled' (shared Gumbel noise
        across the branches of a plan: drafter-invariant, consensus by construction; switch
        2 picks `coupled` or the naive `coupled_block`).
      consensus_cost: modelled cost of one consensus round, in verifier calls.
      kl_positions: the last positions of the shared prefix on which the KL is measured.
      boundary: act on the decision boundary (split a set whose batch falls below it).
      bucket: prompts are padded to a multiple of this (no retrace per step).
      seed: PRNG seed.
    """
    gamma: int = 4
    verifier_temperature: float = 0.0
    plan_steps: int = 4
    max_step_tokens: int = 32
    consensus_threshold: float = 0.5
    n_branches: int | None = None
    rule: str | None = None
    consensus_cost: float = 1.0
    kl_positions: int = 16
    boundary: bool = True
    bucket: int = 64
    seed: int = 0

    def __post_init__(self):
        EngineConfig(gamma=self.gamma, verifier_temperature=self.verifier_temperature,
                     max_new_tokens=self.max_step_tokens)
        if not (isinstance(self.plan_steps, int) and self.plan_steps >= 1):
            raise ConfigError(f"plan_steps: got {self.plan_steps!r}; allowed: an integer ≥ 1")
        if not (0 < self.consensus_threshold <= 1):
            raise ConfigError(f"consensus_threshold: got {self.consensus_threshold!r}; "
                              "allowed: (0, 1]")
        if self.rule not in (None, "coupled"):
            raise ConfigError(f"rule: got {self.rule!r}; allowed: None or 'coupled'")
        if self.n_branches is not None and self.n_branches < 1:
            raise ConfigError(f"n_branches: got {self.n_branches!r}; allowed: None or ≥ 1")


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


@dataclasses.dataclass
class RunStats:
    """Counters of one run (a policy, a single-drafter baseline or autoregressive)."""
    k: int
    gamma: int
    tokens: int = 0
    cost: float = 0.0
    seconds: float = 0.0
    verifier_calls: int = 0
    drafter_tokens: np.ndarray = None
    rounds: int = 0
    from_draft: int = 0
    reached: int = 0
    multi_from_draft: int = 0
    multi_reached: int = 0
    truncations: int = 0
    discarded: int = 0
    proposed: np.ndarray = None
    accepted: np.ndarray = None
    rejected: np.ndarray = None
    own_accepted_at: np.ndarray = None
    own_reached_at: np.ndarray = None
    steps: int = 0
    fallbacks: int = 0
    kl_max: list = dataclasses.field(default_factory=list)
    kl_mean: list = dataclasses.field(default_factory=list)
    decisions: list = dataclasses.field(default_factory=list)
    supports: list = dataclasses.field(default_factory=list)
    collapses: Any = dataclasses.field(default_factory=boundary_lib.CollapseLog)
    distance: list = dataclasses.field(default_factory=list)

    def __post_init__(self):
        z = lambda *s: np.zeros(s, np.int64)
        self.drafter_tokens = z(self.k)
        self.proposed, self.accepted, self.rejected = z(self.k), z(self.k), z(self.k)
        self.own_accepted_at, self.own_reached_at = z(self.k, self.gamma), z(self.k, self.gamma)

    def add_counters(self, c, rows: np.ndarray):
        self.rounds += int(c.rounds[rows].sum())
        self.from_draft += int(c.from_draft[rows].sum())
        self.reached += int(c.reached[rows].sum())
        self.multi_from_draft += int(c.multi_from_draft[rows].sum())
        self.multi_reached += int(c.multi_reached[rows].sum())
        self.truncations += int(c.truncations[rows].sum())
        self.discarded += int(c.discarded[rows].sum())
        self.proposed += c.proposed[rows].sum(0)
        self.accepted += c.accepted[rows].sum(0)
        self.rejected += c.rejected[rows].sum(0)
        self.own_accepted_at += c.own_accepted_at[rows].sum(0)
        self.own_reached_at += c.own_reached_at[rows].sum(0)


def _batch_stats(c, rows):
    """Boundary inputs of one sharing set over one batch (SPEC §6), from the round's counters."""
    mr, mf = c.multi_reached[rows].sum(), c.multi_from_draft[rows].sum()
    shared = mf / mr if mr else float("nan")
    tr = c.truncations[rows].sum()
    depth = c.discarded[rows].sum() / tr if tr else 0.0
    oa, orr = c.own_accepted_at[rows].sum(), c.own_reached_at[rows].sum()
    indep = oa / orr if orr else float("nan")
    return boundary_lib.BoundaryStats(float(shared), float(depth), float(indep))


def _prompts(dep: Deployment, texts: Sequence[str]):
    v = [dep.encode(t) for t in texts]
    d = [[enc(t) for t in texts] for enc in dep.drafter_encode]
    return v, d


def run_widths(dep: Deployment, cfg: PlanConfig, texts: Sequence[str]) -> tuple[int, list[int]]:
    """Padded prompt widths (verifier, each drafter) that hold every step of a run.

    The prompts grow by at most `(plan_steps − 1) · max_step_tokens` verifier tokens; a
    drafter's by that times its measured tokens-per-verifier-token ratio (with a margin).
    Padding every call of the run to these widths keeps ONE compiled program per engine
    configuration instead of one per length bucket (compilation dominates short CPU runs).
    A prompt that still outgrows its width is padded to the next bucket (correct, one more
    compilation).
    """
    from specjax.engine.decode import consume_width  # pylint: disable=import-outside-toplevel
    v, d = _prompts(dep, texts)
    grow = (cfg.plan_steps - 1) * cfg.max_step_tokens
    room_v = dep.verifier.max_len - cfg.max_step_tokens - len(dep.drafters) * cfg.gamma
    wv = min(_bucket(max(map(len, v)) + grow, cfg.bucket), max(room_v // cfg.bucket, 1) * cfg.bucket)
    wd = []
    for spec, data, dk in zip(dep.drafters, dep.d_data, d):
        ratio = max(len(a) / max(len(b), 1) for a, b in zip(dk, v))
        m = int(np.asarray(data.retok).shape[1])
        room = spec.lm.max_len - consume_width(m, cfg.gamma + 1) - cfg.gamma
        want = max(map(len, dk)) + int(np.ceil(1.25 * ratio * grow))
        wd.append(min(_bucket(want, cfg.bucket), max(room // cfg.bucket, 1) * cfg.bucket))
    return wv, wd


def run_plans(dep: Deployment, cfg: PlanConfig, prompts: Sequence[str], *,
              policy: Policy | None = None, single: int | None = None,
              journal: PlanJournal | None = None, plan_ids: Sequence[str] | None = None,
              agreement: Callable[[str, str], bool] = exact_match,
              fail_hook: Callable[[int, int], None] | None = None) -> tuple[list[str], RunStats]:
    """Executes every plan for `cfg.plan_steps` steps.

    Exactly one of `policy` (parallel branches + consensus), `single` (the single-drafter
    baseline: that drafter, rule 1, one branch, no consensus) or neither (the verifier
    alone, autoregressive) is used.

    Args:
      journal / plan_ids: where committed steps go; steps already journaled are not rerun
        (resume), each new one is committed exactly once.
      fail_hook: called as fail_hook(step, batch_row) before committing (failure injection
        in tests: raising there loses nothing already committed).

    Returns:
      (the full text of each plan, RunStats).
    """
    if policy is not None and single is not None:
        raise ValueError("run_plans: give policy or single, not both")
    k = len(dep.drafters)
    stats = RunStats(k=k, gamma=cfg.gamma)
    plan_ids = list(plan_ids or [f"plan{i}" for i in range(len(prompts))])
    texts = list(prompts)
    if journal is not None:  # Resume: replay committed steps.
        for i, pid in enumerate(plan_ids):
            texts[i] = prompts[i] + "".join(s.text for s in journal.committed_steps(pid))
    split: set = set()
    cooldown: dict = {}
    n_groups = len(dict.fromkeys(dep.groups))
    widths = run_widths(dep, cfg, texts)
    for step in range(cfg.plan_steps):
        todo = [i for i, pid in enumerate(plan_ids)
                if journal is None or journal.get(pid, step) is None]
        if not todo:
            continue
        step_texts = [texts[i] for i in todo]
        if policy is None and single is None:
            new, meta = _autoregressive_step(dep, cfg, step_texts, step, stats, widths)
        else:
            new, meta = _speculative_step(dep, cfg, step_texts, step, stats, policy, single,
                                          split, n_groups, agreement, widths)
        for j, i in enumerate(todo):
            if fail_hook is not None:
                fail_hook(step, j)
            if journal is not None:
                journal.commit(plan_ids[i], step, new[j], meta[j])
            texts[i] += new[j]
        stats.steps += len(todo)
        # Boundary bookkeeping: split sets stay independent for one batch, then re-probe.
        for s in list(cooldown):
            cooldown[s] -= 1
            if cooldown[s] <= 0:
                split.discard(s)
                del cooldown[s]
        for d in stats.decisions[-1] if stats.decisions and policy is not None else []:
            if cfg.boundary and not d.decision and policy.truncate_and_attribute:
                split.add(d.branch_id)
                cooldown[d.branch_id] = 2
    return texts, stats


def _autoregressive_step(dep, cfg, texts, step, stats, widths, rows=None, n_rows=None,
                         stream=None):
    """The verifier alone on `texts`; with `rows`, they are rows `rows` of an `n_rows` batch
    (the others are inactive padding, so the compiled program does not change) and row r
    uses the PRNG key of row r of stream `stream` (default: this step's)."""
    v = [dep.encode(t) for t in texts]  # the verifier alone: no drafter re-encoding
    rows = list(range(len(v))) if rows is None else list(rows)
    n_rows = len(v) if n_rows is None else n_rows
    keys = row_keys_for(cfg.seed * 1000 + (step if stream is None else stream), n_rows)
    full = [v[0]] * n_rows
    for j, r in enumerate(rows):
        full[r] = v[j]
    active = np.zeros((n_rows,), bool)
    active[rows] = True
    res = autoregressive_generate(dep.verifier, dep.v_params, full, keys,
                                  temperature=cfg.verifier_temperature,
                                  max_new_tokens=cfg.max_step_tokens, stop_table=dep.stop_table,
                                  coupled=cfg.rule == "coupled", bucket=cfg.bucket,
                                  min_width=widths[0], active=active)
    new = [dep.decode(res.new_tokens(r)) for r in rows]
    stats.seconds += res.seconds
    n = int((res.length - res.start)[rows].sum())
    stats.tokens += n
    stats.verifier_calls += n      # one verifier call per token
    stats.cost += n
    return new, [{"mode": "autoregressive"}] * len(v)


def _speculative_step(dep, cfg, texts, step, stats, policy, single, split, n_groups,
                      agreement, widths):
    k = len(dep.drafters)
    n_plans = len(texts)
    v, d = _prompts(dep, texts)
    if single is not None:
        sets, branches, rule = [[single]], [[single]], "rejection"
    else:
        kl_pair = _kl_on_prefix(dep, cfg, v, stats, widths[0])  # measured under every policy
        sets, branches, rule = branch_layout(dep, policy, kl_pair, split,
                                             cfg.n_branches or n_groups)
    coupled = cfg.rule == "coupled"
    if coupled:
        # Switch 2 picks the coupled rule's form: each chain cut at its own mismatch (on) or
        # the whole block cut at the first mismatch of any chain (off, the naive design).
        rule = "coupled" if single is not None or policy.truncate_and_attribute else "coupled_block"
    n_b = len(branches)
    n_rows = n_plans * n_b
    keys = row_keys_for(cfg.seed * 1000 + step, n_rows, share=n_b if coupled else 1)
    res = _run_sets(dep, cfg, rule, branches, v, d, keys, widths, dedupe=coupled)
    c = res.counters
    slots = np.tile(branch_slots(branches), (n_plans, 1))
    stats.seconds += res.seconds
    all_rows = np.arange(n_plans * n_b)
    stats.add_counters(c, all_rows)
    # Cost model: a round is one verifier call for all branches of a plan (batched);
    # each drafter is charged γ tokens per round it drafted for any of them.
    costs = np.array([dd.cost for dd in dep.drafters])
    for p in range(n_plans):
        rows = all_rows[p * n_b:(p + 1) * n_b]
        r = int(c.rounds[rows].max())
        stats.verifier_calls += r
        used = np.zeros(k, np.int64)
        for row in rows:
            for dj in slots[row][slots[row] >= 0]:
                used[dj] = max(used[dj], int(c.rounds[row]))
        stats.drafter_tokens += used * cfg.gamma
        stats.cost += r + float((used * cfg.gamma * costs).sum())
    cand = [dep.decode(res.new_tokens(i)) for i in range(n_plans * n_b)]
    if single is not None:
        stats.tokens += int((res.length - res.start).sum())
        return cand, [{"mode": f"single:{dep.names[single]}"}] * n_plans
    # Decision boundary, per sharing set with ≥ 2 drafters, from this batch's counters.
    per_set = {}
    for s in sets:
        if len(s) < 2:
            continue
        rows = np.array([p * n_b + b for p in range(n_plans)
                         for b, bs in enumerate(branches) if bs == s])
        per_set[tuple(s)] = _batch_stats(c, rows)
    decisions = boundary_lib.evaluate_boundary(per_set, log=stats.collapses) if per_set else []
    stats.decisions.append(decisions)
    # Consensus per plan.
    out, meta, fallback_plans = [None] * n_plans, [None] * n_plans, []
    for p in range(n_plans):
        rows = range(p * n_b, (p + 1) * n_b)
        weights = [vote_weight(int(c.accepted[r].sum()), int(c.proposed[r].sum()),
                               int(c.rejected[r].sum()), policy.agreement_weighted_consensus)
                   for r in rows]
        dec = decide([cand[r] for r in rows], weights, agreement, cfg.consensus_threshold)
        if dec.fallback:
            fallback_plans.append(p)
        else:
            out[p] = dec.committed
            stats.tokens += int(res.length[p * n_b + dec.plurality_index]
                                - res.start[p * n_b + dec.plurality_index])
        stats.supports.append(float(dec.support))
        meta[p] = {"support": round(float(dec.support), 4), "fallback": bool(dec.fallback),
                   "weights": [round(float(w), 4) for w in weights]}
    if fallback_plans:
        # The verifier generates the step alone, in a batch of the plans' shape (one compiled
        # program). Under the coupled rule it uses the branches' noise, so the fallback
        # commits the very step the branches produced (the output stays the verifier's own
        # sample whatever the vote); otherwise an independent stream.
        fb_texts = [texts[p] for p in fallback_plans]
        sub = RunStats(k=k, gamma=cfg.gamma)
        fb_new, _ = _autoregressive_step(dep, cfg, fb_texts, step, sub, widths,
                                         rows=fallback_plans, n_rows=n_plans,
                                         stream=step if coupled else 10_000 + step)
        for j, p in enumerate(fallback_plans):
            out[p] = fb_new[j]
        stats.fallbacks += len(fallback_plans)
        stats.tokens += sub.tokens
        stats.seconds += sub.seconds
        stats.verifier_calls += sub.verifier_calls
        stats.cost += sub.cost + cfg.consensus_cost * len(fallback_plans)
    return out, meta


def _run_sets(dep, cfg, rule, branches, v, d, keys, widths, dedupe: bool) -> GenerateResult:
    """Every (plan, branch) row of a step, one engine call per distinct drafter set.

    Each call runs only its set's drafters (a sub-deployment), so no row pays for drafters
    it does not use, and a one-drafter set runs the very program of that drafter's
    single-drafter baseline (one compilation serves both). A one-drafter set uses rule 1
    (`rejection`, or `coupled`): with one chain every rule reduces to it. With `dedupe`
    (coupled rule: the branches of a plan share their noise) a set that several branches
    share runs once per plan. Returns the result laid out per (plan, branch) row, counters
    over all K drafters, `seconds` summed over the calls.
    """
    k, n_b, n_plans = len(dep.drafters), len(branches), len(v)
    uniq = list(dict.fromkeys(tuple(b) for b in branches))
    results, source, seconds = [], np.zeros(n_plans * n_b, np.int64), 0.0
    for u in uniq:
        members = [b for b in range(n_b) if tuple(branches[b]) == u]
        runs = members[:1] if dedupe else members
        rows = [p * n_b + b for p in range(n_plans) for b in runs]
        sub = dep.subset([dep.names[j] for j in u])
        set_rule = ("coupled" if rule.startswith("coupled") else "rejection") if len(u) == 1 else rule
        ecfg = EngineConfig(gamma=cfg.gamma, rule=set_rule,
                            verifier_temperature=cfg.verifier_temperature, n_slots=len(u),
                            max_new_tokens=cfg.max_step_tokens)
        res = speculative_generate(
            ecfg, sub.verifier, sub.v_params, sub.drafters, sub.d_data,
            [v[r // n_b] for r in rows], [[d[j][r // n_b] for r in rows] for j in u],
            keys[np.asarray(rows)], stop_table=dep.stop_table, bucket=cfg.bucket,
            min_width=widths[0], drafter_min_width=[widths[1][j] for j in u])
        seconds += res.seconds
        offset = sum(len(r.length) for r in results)
        results.append(dataclasses.replace(res, counters=_expand_counters(res.counters,
                                                                           list(u), k)))
        for i, r in enumerate(rows):  # every branch of this set in the row's plan reads row i
            for b in (members if dedupe else [r % n_b]):
                source[(r // n_b) * n_b + b] = offset + i
    width = max(r.tokens.shape[1] for r in results)
    tokens = np.concatenate([np.pad(r.tokens, ((0, 0), (0, width - r.tokens.shape[1])))
                             for r in results])
    counters = jax.tree.map(lambda *xs: np.concatenate(xs)[source],
                            *[r.counters for r in results])
    return GenerateResult(tokens=tokens[source],
                          length=np.concatenate([r.length for r in results])[source],
                          start=np.concatenate([r.start for r in results])[source],
                          counters=counters, seconds=seconds)


def _expand_counters(c, index, k):
    """Counters of a sub-deployment (drafters `index`) laid out over all K drafters."""
    if list(index) == list(range(k)):
        return c

    def widen(x):
        out = np.zeros((x.shape[0], k) + x.shape[2:], x.dtype)
        out[:, index] = x
        return out
    return c.replace(proposed=widen(c.proposed), accepted=widen(c.accepted),
                     rejected=widen(c.rejected), own_accepted_at=widen(c.own_accepted_at),
                     own_reached_at=widen(c.own_reached_at))


def _kl_on_prefix(dep, cfg, v, stats, width: int = 0):
    """f32[K, K] KL per ordered pair, mean over the last positions of every plan's prefix."""
    if len(dep.drafters) < 2:
        return None
    from specjax.engine.generate import pad_prompts
    arr, lens = pad_prompts(v)
    width = _bucket(max(arr.shape[1], width), cfg.bucket)
    arr = np.pad(arr, ((0, 0), (0, width - arr.shape[1])))
    q, ok = prefix_distributions(dep, arr, lens, min(cfg.kl_positions, int(lens.min())))
    kl = np.asarray(pairwise_kl(q))[:, :, ok]                        # [K, K, N]
    pair = kl.mean(-1)
    off = ~np.eye(len(pair), dtype=bool)
    stats.kl_max.append(float(pair[off].max()))
    stats.kl_mean.append(float(pair[off].mean()))
    return pair
