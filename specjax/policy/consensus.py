"""Consensus over the branches' candidate steps, and the vote weights of switch 3 (SPEC §5).

Each branch proposes a candidate step and carries a vote weight `w_b ∈ [0, 1]`. The
support of a candidate `c` is

        support(c) = (1/B) · Σ_{b : agreement(candidate_b, c)} w_b

over all `B` branches — not renormalised, so low weights lower support even when every
branch agrees. The plurality candidate is committed if its support ≥ the threshold
(default 0.5); otherwise the step falls back to the verifier alone.

Agreement is pluggable (`Agreement`), exact match of the step text by default.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence

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
