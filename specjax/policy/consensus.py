"""Consensus over the branches' candidate steps: the vote weights of switch 3, the quorum vote,
and the step decision (SPEC §5–6).

Each branch proposes a candidate step and carries a vote weight `w_b ∈ [0, 1]`. The
support of a candidate `c` is

        support(c) = (1/B) · Σ_{b : agreement(candidate_b, c)} w_b

over all `B` branches — not renormalised, so low weights lower support even when every
branch agrees. The plurality candidate is committed if its support ≥ the threshold
(default 0.5); otherwise the step falls back to the verifier alone.

Agreement is pluggable (`Agreement`), exact match of the step text by default.

The step decision of one plan (`decide_step`) reads each branch's statistics
(`branch_statistics`: `s_b`, `i_b`, `d_b`, `w_b` from its row's counters) as `BranchOutcome`s
and decides by the seed's rule (`execute_parallel_plan` with `SeedConsensus`: commit the
weighted plurality of the branches whose `should_truncate_and_repropose` holds, else
fallback) or by the quorum vote (`decide`); the other rule's verdict is recorded too.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence

from specjax.policy import boundary as boundary_lib

Agreement = Callable[[str, str], bool]


def exact_match(a: str, b: str) -> bool:
    """The default agreement: the two candidate steps are the same text."""
    return a == b


def whitespace_insensitive_match(a: str, b: str) -> bool:
    """An alternative agreement: equal after collapsing runs of whitespace and stripping."""
    return " ".join(a.split()) == " ".join(b.split())


def _count(name: str, value) -> float:
    value = float(value)
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"vote_weight: {name}={value!r} is not allowed; allowed: a count ≥ 0.")
    return value


def vote_weight(accepted, proposed, rejected, agreement_weighted: bool) -> float:
    """A branch's vote weight over one step (switch 3).

    * raw (`agreement_weighted=False`): `accepted / proposed` — every proposed draft token
        is in the denominator, so tokens discarded after a truncation count against the
        branch;
    * agreement-weighted (`agreement_weighted=True`): `accepted / (accepted + rejected)` —
        only positions up to each drafter's truncation count; positions discarded because a
        chain was truncated (by its own or another drafter's rejection) do not.

    0/0 is defined as 1.0: a branch that proposed nothing (raw) or whose drafters were never
    tested to a rejection nor accepted anything (agreement-weighted) has given no evidence
    against itself, so it is not penalised.

    Args:
        accepted: accepted draft tokens of the branch's drafters over the step.
        proposed: proposed draft tokens (≥ accepted + rejected).
        rejected: rejected positions (each a proposed token that was not accepted).
        agreement_weighted: the state of switch 3.

    Returns:
        The weight, a float in [0, 1].
    """
    accepted = _count("accepted", accepted)
    proposed = _count("proposed", proposed)
    rejected = _count("rejected", rejected)
    if accepted + rejected > proposed:
        raise ValueError(
            f"vote_weight: accepted ({accepted!r}) + rejected ({rejected!r}) exceeds proposed "
            f"({proposed!r}); allowed: accepted + rejected ≤ proposed."
        )
    denominator = (accepted + rejected) if agreement_weighted else proposed
    if denominator == 0:
        return 1.0
    return accepted / denominator


@dataclasses.dataclass(frozen=True)
class ConsensusDecision:
    """The outcome of one consensus vote.

    Attributes:
        committed: the committed candidate, or None on fallback.
        support: the plurality candidate's support, `(1/B) Σ_{b agrees} w_b`.
        plurality_index: index of the branch whose candidate has the highest support (ties →
            the lowest index).
        fallback: True iff support < threshold (the verifier then generates the step alone).
        supports: every branch candidate's support, in branch order.
    """

    committed: str | None
    support: float
    plurality_index: int
    fallback: bool
    supports: tuple[float, ...] = ()


def decide(
    candidates: Sequence[str],
    weights: Sequence[float],
    agreement: Agreement = exact_match,
    threshold: float = 0.5,
) -> ConsensusDecision:
    """Weighted plurality vote over the branches' candidate steps.

    Args:
        candidates: one candidate step per branch (B ≥ 1).
        weights: one vote weight per branch, each in [0, 1] (see `vote_weight`).
        agreement: whether two candidates agree; called as `agreement(candidate_b, c)`.
        threshold: the consensus threshold, in (0, 1].

    Returns:
        A `ConsensusDecision`; the plurality candidate is committed iff its support ≥
        `threshold`.
    """
    candidates = list(candidates)
    weights = [float(w) for w in weights]
    if not candidates:
        raise ValueError("decide: candidates is empty; allowed: one candidate per branch, B ≥ 1.")
    if len(candidates) != len(weights):
        raise ValueError(
            f"decide: {len(candidates)} candidates but {len(weights)} weights; allowed: one "
            "weight per candidate."
        )
    for b, w in enumerate(weights):
        if not 0.0 <= w <= 1.0:  # NaN fails too.
            raise ValueError(f"decide: weights[{b}]={w!r} is not allowed; allowed: [0, 1].")
    threshold = float(threshold)
    if not 0.0 < threshold <= 1.0:
        raise ValueError(f"decide: threshold={threshold!r} is not allowed; allowed: (0, 1].")
    n = len(candidates)
    supports = tuple(
        math.fsum(w for cand_b, w in zip(candidates, weights) if agreement(cand_b, c)) / n
        for c in candidates
    )
    # Key (support, −index): ties go to the lowest branch index.
    plurality = max(range(n), key=lambda i: (supports[i], -i))
    support = supports[plurality]
    fallback = support < threshold
    return ConsensusDecision(
        committed=None if fallback else candidates[plurality],
        support=support,
        plurality_index=plurality,
        fallback=fallback,
        supports=supports,
    )


# ---------------------------------------------------------------------------- the step decision


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
    return {
        "s": pick(s_w, s_r),
        "i": pick(i_w, i_r),
        "w": pick(w_w, w_r),
        "d": depth,
        "s_weighted": s_w,
        "s_raw": s_r,
        "i_weighted": i_w,
        "i_raw": i_r,
        "w_weighted": w_w,
        "w_raw": w_r,
        "truncations": tr,
        "pruned": int(c.pruned[row]),
    }


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
        totals = [
            sum(o.weight for o in branches if self.agreement(o.candidate, b.candidate))
            for b in branches
        ]
        return branches[max(range(len(branches)), key=lambda i: (totals[i], -i))]

    def fallback(self, branches, verifier=None) -> None:
        return None


def seed_step_decision(
    outcomes: Sequence[BranchOutcome], thresholds, log=None, agreement=exact_match
) -> tuple[BranchOutcome | None, list]:
    """The seed's step decision over one plan's branches: (the committed branch or None for
    fallback, the per-branch `BoundaryDecision` records)."""
    records = []
    chosen = boundary_lib.execute_parallel_plan(
        outcomes,
        None,
        SeedConsensus(agreement),
        log=log,
        on_decisions=records.extend,
        **thresholds.kwargs(),
    )
    return chosen, records


#: The step decision's rules: the seed's `execute_parallel_plan`, or the quorum vote.
CONSENSUS_RULES = ("seed", "quorum")


@dataclasses.dataclass(frozen=True)
class StepDecision:
    """One plan's step decision, under both rules (the one not run is recorded too).

    Attributes:
        committed: the branch committed under the run's rule (its index), or None for
            fallback (the verifier then generates the step alone).
        seed_commit: the seed rule's verdict (a branch index or None).
        quorum_commit: the quorum vote's verdict (a branch index or None).
        quorum_support: the quorum vote's plurality support.
        verdicts: branch index → what `should_truncate_and_repropose` said of it: True,
            False, or the collapse reason (only branches the seed rule checked).
    """

    committed: int | None
    seed_commit: int | None
    quorum_commit: int | None
    quorum_support: float
    verdicts: dict


def decide_step(
    outcomes: Sequence[BranchOutcome],
    rule: str,
    thresholds: boundary_lib.BoundaryThresholds,
    quorum_threshold: float = 0.5,
    agreement: Agreement = exact_match,
    log=None,
) -> StepDecision:
    """The step decision over one plan's branches (SPEC §5–6).

    Args:
        outcomes: one `BranchOutcome` per branch, in branch order (``outcomes[b].index == b``).
        rule: 'seed' (`execute_parallel_plan`: commit the weighted plurality of the branches
            whose boundary check holds, else fallback) or 'quorum' (`decide`: the weighted
            plurality, committed iff its support ≥ `quorum_threshold`).
        thresholds: the decision boundary's thresholds (the seed rule's check).
        quorum_threshold: the quorum vote's support threshold, in (0, 1].
        agreement: whether two candidate steps agree (both rules).
        log: a `boundary.CollapseLog` counting the seed rule's collapses, or None.

    Returns:
        A `StepDecision`: the committed branch under `rule`, both rules' verdicts, the quorum
        support and each checked branch's boundary verdict.
    """
    if rule not in CONSENSUS_RULES:
        raise ValueError(
            f"decide_step: rule={rule!r} is not allowed; allowed: {list(CONSENSUS_RULES)}."
        )
    chosen, records = seed_step_decision(outcomes, thresholds, log, agreement)
    vote = decide(
        [o.candidate for o in outcomes], [o.weight for o in outcomes], agreement, quorum_threshold
    )
    seed_commit = None if chosen is None else chosen.index
    quorum_commit = None if vote.fallback else vote.plurality_index
    return StepDecision(
        committed=seed_commit if rule == "seed" else quorum_commit,
        seed_commit=seed_commit,
        quorum_commit=quorum_commit,
        quorum_support=vote.support,
        verdicts={
            o.index: rec.reason if rec.reason else bool(rec.decision)
            for rec, o in zip(records, outcomes)
        },
    )
