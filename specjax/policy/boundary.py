"""The per-batch decision boundary: truncate-and-repropose or independent branches (SPEC §6).

The public API is the seed's: `SpeculativePrefixCollapseError`,
`should_truncate_and_repropose` and `execute_parallel_plan`, with the seed's thresholds
(acceptance floor 0.45, depth ceiling 2.5 tokens, overhead ratio 0.15). Around it:
`evaluate_boundary` turns one batch's per-branch statistics into `BoundaryDecision`
records, and `CollapseLog` counts every collapse by its reason.

All three inputs come from the round that was run anyway (no extra verifier call):
shared-prefix acceptance is the joint acceptance of SPEC §7 over the batch,
independent-branch acceptance the mean acceptance of each branch's chains tested alone
against `p`, and the mean truncation depth the draft tokens discarded per truncation.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from typing import Any, NamedTuple, Protocol

from specjax.field_report import ACCEPTANCE_FLOOR, DEPTH_CEILING, TRUNCATION_OVERHEAD_RATIO

ACCEPTANCE_OUT_OF_RANGE = "acceptance_out_of_range"
ACCEPTANCE_BELOW_FLOOR = "acceptance_below_floor"
TRUNCATION_THRASH = "truncation_thrash"
REASONS = (ACCEPTANCE_OUT_OF_RANGE, ACCEPTANCE_BELOW_FLOOR, TRUNCATION_THRASH)

# The gain test is `(shared − independent) > overhead`. Acceptances are ratios of counts
# given as floats, so a gain that equals the overhead in decimal (0.65 − 0.5 vs 0.15) can
# land one ulp either side of it; a gain within this tolerance of the overhead counts as
# equal, i.e. not greater. It only resolves round-off, never a measured difference.
_GAIN_TIE_TOLERANCE = 1e-12


class SpeculativePrefixCollapseError(RuntimeError):
    """Raised when joint acceptance on a shared prefix collapses below the
    truncate-and-repropose decision boundary, indicating worst-drafter dominance.

    Attributes:
        reason: one of `REASONS` — 'acceptance_out_of_range', 'acceptance_below_floor',
            'truncation_thrash'.
    """

    def __init__(self, message: str, reason: str):
        if reason not in REASONS:
            raise ValueError(f"reason={reason!r} is not allowed; allowed: {', '.join(REASONS)}.")
        super().__init__(message)
        self.reason = reason

    def __reduce__(self):  # Keep `reason` across pickling (e.g. multiprocessing).
        return (type(self), (str(self), self.reason))


def _acceptance_in_range(name: str, value: float) -> None:
    # NaN fails the comparison, so it counts as outside [0, 1].
    if not (0.0 <= value <= 1.0):
        raise SpeculativePrefixCollapseError(
            f"{name}={value!r} is outside the allowed range [0, 1]", ACCEPTANCE_OUT_OF_RANGE
        )


def should_truncate_and_repropose(
    shared_prefix_acceptance: float,
    mean_truncation_depth: float,
    independent_branch_acceptance: float,
    truncation_overhead_ratio: float = TRUNCATION_OVERHEAD_RATIO,
    acceptance_floor: float = ACCEPTANCE_FLOOR,
    depth_ceiling: float = DEPTH_CEILING,
) -> bool:
    """Whether this batch's branches should keep sharing a prefix (truncate-and-repropose).

    Checks, in order: both acceptances in [0, 1] (NaN is outside); shared-prefix acceptance
    ≥ `acceptance_floor` (the floor itself passes); mean truncation depth ≤ `depth_ceiling`
    (the ceiling itself passes). Then the answer is
    `(shared_prefix_acceptance − independent_branch_acceptance) > truncation_overhead_ratio`
    (strictly; a gain equal to the overhead up to 1e-12 of float round-off is not greater).

    Args:
        shared_prefix_acceptance: joint acceptance on the shared prefix over the batch.
        mean_truncation_depth: draft tokens discarded per truncation (≥ 0).
        independent_branch_acceptance: mean acceptance of the branches' chains tested alone.
        truncation_overhead_ratio: the gain the shared prefix must exceed.
        acceptance_floor: below it the prefix is doing negative work.
        depth_ceiling: above it truncation thrash costs more than independent branches.

    Returns:
        True: truncate and re-propose on the shared prefix; False: run the branches against
        independent verifier passes, consensus only at commit points.

    Raises:
        SpeculativePrefixCollapseError: with `reason` 'acceptance_out_of_range',
            'acceptance_below_floor' or 'truncation_thrash'; the message states the value and
            the threshold.
        ValueError: a truncation depth that is negative or NaN (a bug upstream, not a
            collapse).
    """
    shared = float(shared_prefix_acceptance)
    independent = float(independent_branch_acceptance)
    depth = float(mean_truncation_depth)
    _acceptance_in_range("shared_prefix_acceptance", shared)
    _acceptance_in_range("independent_branch_acceptance", independent)
    if shared < acceptance_floor:
        raise SpeculativePrefixCollapseError(
            f"shared-prefix acceptance {shared!r} is below the floor {acceptance_floor!r}; "
            "the prefix is doing negative work",
            ACCEPTANCE_BELOW_FLOOR,
        )
    if not depth >= 0.0:
        raise ValueError(
            f"mean_truncation_depth={depth!r} is not allowed; allowed: a number ≥ 0 "
            "(draft tokens discarded per truncation; 0 when nothing was truncated)."
        )
    if depth > depth_ceiling:
        raise SpeculativePrefixCollapseError(
            f"mean truncation depth {depth!r} tokens is above the ceiling {depth_ceiling!r}; "
            "truncation thrash exceeds the cost of independent branches",
            TRUNCATION_THRASH,
        )
    marginal_gain = shared - independent
    return marginal_gain > truncation_overhead_ratio + _GAIN_TIE_TOLERANCE


# ----------------------------------------------------------------------------- records


@dataclasses.dataclass(frozen=True)
class BoundaryThresholds:
    """The boundary's three thresholds (the config holds one of these; the seed's defaults).

    Attributes:
        truncation_overhead_ratio: the gain `s − i` a shared prefix must exceed.
        acceptance_floor: below it the shared prefix collapses ('acceptance_below_floor').
        depth_ceiling: above it truncation thrash collapses it ('truncation_thrash').
    """

    truncation_overhead_ratio: float = TRUNCATION_OVERHEAD_RATIO
    acceptance_floor: float = ACCEPTANCE_FLOOR
    depth_ceiling: float = DEPTH_CEILING

    def __post_init__(self):
        import math  # pylint: disable=import-outside-toplevel

        from specjax.errors import ConfigError  # pylint: disable=import-outside-toplevel

        for name, lo, hi in (
            ("truncation_overhead_ratio", -1.0, 1.0),
            ("acceptance_floor", 0.0, 1.0),
            ("depth_ceiling", 0.0, math.inf),
        ):
            v = getattr(self, name)
            if (
                isinstance(v, bool)
                or not isinstance(v, (int, float))
                or not (math.isfinite(v) or v == math.inf)
                or not lo <= v <= hi
            ):
                raise ConfigError.invalid(f"boundary.{name}", v, f"a number in [{lo}, {hi}]")
            object.__setattr__(self, name, float(v))

    def kwargs(self) -> dict[str, float]:
        """The keyword arguments of `should_truncate_and_repropose`."""
        return dataclasses.asdict(self)


class BoundaryStats(NamedTuple):
    """One branch's inputs to the boundary, named as `should_truncate_and_repropose`'s."""

    shared_prefix_acceptance: float
    mean_truncation_depth: float
    independent_branch_acceptance: float


@dataclasses.dataclass(frozen=True)
class BoundaryDecision:
    """The boundary's verdict for one branch of one batch.

    Attributes:
        branch_id: the branch's key (its index when the statistics came as a sequence).
        decision: True = truncate and re-propose on the shared prefix; False = independent
            branches (always False after a collapse).
        reason: the collapse reason (one of `REASONS`), or None when there was no collapse.
        shared_prefix_acceptance, mean_truncation_depth, independent_branch_acceptance: the
            inputs, as measured.
        message: the collapse error's message, or None.
    """

    branch_id: Hashable
    decision: bool
    reason: str | None
    shared_prefix_acceptance: float
    mean_truncation_depth: float
    independent_branch_acceptance: float
    message: str | None = None

    @property
    def collapsed(self) -> bool:
        return self.reason is not None


class CollapseLog:
    """Counts collapses by reason, and keeps each one (branch id, reason, message)."""

    def __init__(self):
        self._counts: collections.Counter[str] = collections.Counter()
        self.events: list[tuple[Hashable, str, str]] = []

    def record(self, error: SpeculativePrefixCollapseError, branch_id: Hashable = None) -> None:
        self._counts[error.reason] += 1
        self.events.append((branch_id, error.reason, str(error)))

    def counts(self) -> dict[str, int]:
        """Every reason in `REASONS` → how many collapses it caused (0 included)."""
        return {reason: self._counts[reason] for reason in REASONS}

    def __getitem__(self, reason: str) -> int:
        if reason not in REASONS:
            raise KeyError(f"{reason!r} is not a collapse reason; allowed: {', '.join(REASONS)}")
        return self._counts[reason]

    @property
    def total(self) -> int:
        return sum(self._counts.values())

    def __repr__(self) -> str:
        return f"CollapseLog({self.counts()})"


# Attribute names of the branch protocol of `execute_parallel_plan`.
_BRANCH_ATTRS = ("shared_acceptance", "truncation_depth", "independent_acceptance")


def _read_stats(stats: Any) -> BoundaryStats:
    """Accepts a BoundaryStats, a mapping with its field names, or a branch-like object."""
    if isinstance(stats, BoundaryStats):
        return stats
    if isinstance(stats, Mapping):
        try:
            return BoundaryStats(*(stats[f] for f in BoundaryStats._fields))
        except KeyError as missing:
            raise ValueError(
                f"boundary statistics {dict(stats)!r} lack key {missing}; required keys: "
                f"{', '.join(BoundaryStats._fields)}"
            ) from None
    if all(hasattr(stats, a) for a in BoundaryStats._fields):
        return BoundaryStats(*(getattr(stats, f) for f in BoundaryStats._fields))
    if all(hasattr(stats, a) for a in _BRANCH_ATTRS):
        return BoundaryStats(*(getattr(stats, a) for a in _BRANCH_ATTRS))
    raise ValueError(
        f"cannot read boundary statistics from {stats!r}; give a BoundaryStats, a mapping "
        f"with keys {', '.join(BoundaryStats._fields)}, or an object with attributes "
        f"{', '.join(_BRANCH_ATTRS)}"
    )


def _decide(
    branch_id: Hashable, stats: BoundaryStats, thresholds: Mapping[str, float]
) -> tuple[BoundaryDecision, SpeculativePrefixCollapseError | None]:
    try:
        decision = should_truncate_and_repropose(*stats, **thresholds)
    except SpeculativePrefixCollapseError as exc:
        return BoundaryDecision(branch_id, False, exc.reason, *stats, message=str(exc)), exc
    return BoundaryDecision(branch_id, bool(decision), None, *stats), None


def evaluate_boundary(
    stats_per_branch: Mapping[Hashable, Any] | Sequence[Any],
    *,
    log: CollapseLog | None = None,
    truncation_overhead_ratio: float = TRUNCATION_OVERHEAD_RATIO,
    acceptance_floor: float = ACCEPTANCE_FLOOR,
    depth_ceiling: float = DEPTH_CEILING,
) -> list[BoundaryDecision]:
    """Evaluates the boundary for every branch of one batch; a collapse becomes a record.

    Args:
        stats_per_branch: branch id → statistics, or a sequence of statistics (ids are the
            indices). Statistics are a `BoundaryStats`, a mapping with its field names, or an
            object exposing `.shared_acceptance`, `.truncation_depth`, `.independent_acceptance`.
        log: if given, every collapse is also counted there.
        truncation_overhead_ratio, acceptance_floor, depth_ceiling: as in
            `should_truncate_and_repropose`.

    Returns:
        One `BoundaryDecision` per branch, in input order.
    """
    thresholds = dict(
        truncation_overhead_ratio=truncation_overhead_ratio,
        acceptance_floor=acceptance_floor,
        depth_ceiling=depth_ceiling,
    )
    items: Iterable[tuple[Hashable, Any]] = (
        stats_per_branch.items()
        if isinstance(stats_per_branch, Mapping)
        else enumerate(stats_per_branch)
    )
    decisions = []
    for branch_id, stats in items:
        record, exc = _decide(branch_id, _read_stats(stats), thresholds)
        if exc is not None and log is not None:
            log.record(exc, branch_id)
        decisions.append(record)
    return decisions


class Branch(Protocol):
    shared_acceptance: float
    truncation_depth: float
    independent_acceptance: float

    def record_collapse(self, exc: SpeculativePrefixCollapseError) -> None: ...


class Consensus(Protocol):
    def fallback(self, branches: Sequence[Branch], verifier: Any) -> Any: ...

    def commit(self, branches: Sequence[Branch], verifier: Any) -> Any: ...


def execute_parallel_plan(
    branches: Sequence[Branch],
    verifier: Any,
    consensus: Consensus,
    *,
    log: CollapseLog | None = None,
    truncation_overhead_ratio: float = TRUNCATION_OVERHEAD_RATIO,
    acceptance_floor: float = ACCEPTANCE_FLOOR,
    depth_ceiling: float = DEPTH_CEILING,
    on_decisions: Callable[[list[BoundaryDecision]], None] | None = None,
):
    """The seed's plan step: branches that pass the boundary commit, else fallback.

    Each branch is evaluated with `should_truncate_and_repropose`; a branch whose check
    raises `SpeculativePrefixCollapseError` is told via `branch.record_collapse(exc)` (and
    counted in `log`, if given) and counts as not passing. If no branch passes, the result
    is `consensus.fallback(branches, verifier=verifier)`; otherwise
    `consensus.commit(passing_branches, verifier=verifier)`, the passing branches in input
    order.

    Args:
        branches: objects exposing `.shared_acceptance`, `.truncation_depth`,
            `.independent_acceptance` and `.record_collapse(exc)`.
        verifier: not used here; it is passed through, as the keyword argument `verifier`, to
            `consensus.fallback` / `consensus.commit`, which need it (fallback generates the
            step with the verifier alone; commit may verify at the commit point).
        consensus: exposes `.fallback(branches, verifier=...)` and
            `.commit(branches, verifier=...)`.
        log: optional `CollapseLog`.
        truncation_overhead_ratio, acceptance_floor, depth_ceiling: the boundary's thresholds.
        on_decisions: optional callback receiving the batch's `BoundaryDecision` records
            (for metrics), called before fallback/commit.

    Returns:
        Whatever `consensus.fallback` or `consensus.commit` returns.
    """
    thresholds = dict(
        truncation_overhead_ratio=truncation_overhead_ratio,
        acceptance_floor=acceptance_floor,
        depth_ceiling=depth_ceiling,
    )
    records = []
    passing = []
    for index, branch in enumerate(branches):
        record, exc = _decide(index, _read_stats(branch), thresholds)
        if exc is not None:
            branch.record_collapse(exc)
            if log is not None:
                log.record(exc, index)
        records.append(record)
        if record.decision:
            passing.append(branch)
    if on_decisions is not None:
        on_decisions(records)
    if not passing:
        return consensus.fallback(branches, verifier=verifier)
    return consensus.commit(passing, verifier=verifier)


def replay_step_decisions(
    branch_records: Sequence[Mapping[str, Any]], thresholds: "BoundaryThresholds | None" = None
) -> dict:
    """Re-decides recorded steps with `execute_parallel_plan`'s rule under `thresholds`.

    The branch statistics a step decision reads (`s`, `i`, `d`: already raw or
    agreement-weighted as the run's switch 3 chose) are recorded per (step, plan, branch)
    by the plan runner; the decision depends on nothing else, so the fallback rate under
    other thresholds is exact for the recorded branches. (Under independent noise later
    steps would have other text, so it is exact for the recorded steps, not for a rerun.)

    Returns:
      {'steps', 'fallbacks', 'fallback_rate', 'branches', 'true', 'false',
      'acceptance_below_floor', 'truncation_thrash', 'acceptance_out_of_range'}.
    """
    kw = (thresholds or BoundaryThresholds()).kwargs()
    steps: dict = {}
    counts = collections.Counter()
    for r in branch_records:
        try:
            ok = should_truncate_and_repropose(r["s"], r["d"], r["i"], **kw)
            counts["true" if ok else "false"] += 1
        except SpeculativePrefixCollapseError as e:
            ok = False
            counts[e.reason] += 1
        key = (r.get("seed", 0), r["step"], r["plan"])
        steps[key] = steps.get(key, False) or ok
    n = len(steps)
    fb = sum(not v for v in steps.values())
    out = {
        "steps": n,
        "fallbacks": fb,
        "fallback_rate": fb / n if n else float("nan"),
        "branches": len(branch_records),
    }
    for k in ("true", "false") + REASONS:
        out[k] = counts[k]
    return out


__all__ = [
    "ACCEPTANCE_BELOW_FLOOR",
    "ACCEPTANCE_OUT_OF_RANGE",
    "REASONS",
    "TRUNCATION_THRASH",
    "BoundaryDecision",
    "BoundaryThresholds",
    "BoundaryStats",
    "CollapseLog",
    "SpeculativePrefixCollapseError",
    "evaluate_boundary",
    "replay_step_decisions",
    "execute_parallel_plan",
    "should_truncate_and_repropose",
]
