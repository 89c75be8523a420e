"""The counters of one plan run, kept per plan so that figures can be bootstrapped over plans.

Every additive quantity of a run is an array whose first axis is the plan (`P` plans,
`K` drafters, `γ` positions); a pooled figure is a ratio of sums over plans
(`specjax.metrics`), and a bootstrap resample is the same ratio over resampled plans.
Per-step and per-branch records (`branch_records`, `step_records`) keep what the step
decision saw, so it can be replayed under other thresholds or the other consensus rule.

Glossary (used the same way in code, configs, metrics, plots and the README):
  drafter — a draft model q_i; chain — the γ tokens one drafter drafts in one round;
  sharing set — drafters that extend one committed prefix in one verifier block;
  branch — one parallel plan-execution branch: a sharing set and its own random stream;
  plan — a prompt and its `plan_steps` steps; step — text up to a step delimiter, committed
  by consensus (or fallback); round — one verifier call plus the drafting that fed it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from specjax.policy import boundary as boundary_lib

#: Per-plan additive counters: name -> trailing shape given (K, γ).
_FIELDS = {
    # committed text and time
    "tokens": lambda k, g: (),  # committed tokens
    "seconds": lambda k, g: (),  # measured wall clock, calls split evenly over rows
    "steps": lambda k, g: (),  # plan steps run
    "fallbacks": lambda k, g: (),  # steps committed by fallback (verifier alone)
    # the itemised cost (SPEC §7; `specjax.metrics.itemised_cost` prices these)
    "verifier_calls": lambda k, g: (),  # verifier forward calls of rounds and fallbacks
    "verifier_tokens": lambda k, g: (),  # drafts scored by those calls (γ·S per round)
    "verifier_prefills": lambda k, g: (),  # verifier prompt prefills
    "drafter_tokens": lambda k, g: (k,),  # tokens drafted (γ per round taken part in)
    "drafter_prefills": lambda k, g: (k,),
    "kl_passes": lambda k, g: (k,),  # drafter forward passes of the KL check
    "consensus_rounds": lambda k, g: (),
    # acceptance (engine counters, summed over the rows a plan ran)
    "rounds": lambda k, g: (),
    "from_draft": lambda k, g: (),
    "reached": lambda k, g: (),
    "multi_rounds": lambda k, g: (),
    "multi_from_draft": lambda k, g: (),
    "multi_reached": lambda k, g: (),
    "truncations": lambda k, g: (),
    "discarded": lambda k, g: (),
    "pruned": lambda k, g: (),
    "pruned_discarded": lambda k, g: (),
    "proposed": lambda k, g: (k,),
    "accepted": lambda k, g: (k,),
    "rejected": lambda k, g: (k,),
    "own_accepted_at": lambda k, g: (k, g),
    "own_reached_at": lambda k, g: (k, g),
    "match_at": lambda k, g: (k, g),
    "match_reached_at": lambda k, g: (k, g),
}
COUNTER_FIELDS = tuple(_FIELDS)
#: Engine counters (`specjax.engine.state.Counters`) copied into the plan counters.
ENGINE_FIELDS = (
    "rounds",
    "from_draft",
    "reached",
    "multi_rounds",
    "multi_from_draft",
    "multi_reached",
    "truncations",
    "discarded",
    "pruned",
    "pruned_discarded",
    "proposed",
    "accepted",
    "rejected",
    "own_accepted_at",
    "own_reached_at",
    "match_at",
    "match_reached_at",
)


@dataclasses.dataclass
class RunStats:
    """Counters of one run (a policy, a single-drafter baseline, a router or the verifier).

    Attributes:
      k / gamma / n_plans: drafters, draft window, plans.
      counts: name → array [P, ...] (see `_FIELDS`).
      kl_max / kl_mean / kl_outside: per step, the KL check on the common support (max and
        mean over ordered pairs) and the largest mass a drafter put outside a pair's
        common vocabulary.
      decisions: per step, the per-batch boundary records (`BoundaryDecision`) of the
        sharing sets with ≥ 2 drafters.
      branch_records: one dict per (step, plan, branch): the step decision's inputs
        (s_b, i_b, d_b, w_b, raw and agreement-weighted), the candidate and the verdict.
      step_records: one dict per (step, plan): the committed branch or fallback under the
        run's consensus rule, and the quorum vote's support.
      collapses: every `SpeculativePrefixCollapseError` of the step decisions, by reason.
      routes: per step, per plan, the drafter set an adaptive policy chose.
      priced: price key (`specjax.metrics.price_key`: a forward's kind, model, width, padded
        rows and cache) → f64[P] forwards of that shape the plan's calls ran, a call's
        shared evenly among its rows as its seconds are; `metrics.itemised_seconds` prices
        them at the machine's measured seconds (rows written before it: absent).
      gamma_routes: per step, per plan, the γ an adaptive policy ran a lone drafter at.
    """

    k: int
    gamma: int
    n_plans: int = 1
    counts: dict = None
    kl_max: list = dataclasses.field(default_factory=list)
    kl_mean: list = dataclasses.field(default_factory=list)
    kl_outside: list = dataclasses.field(default_factory=list)
    decisions: list = dataclasses.field(default_factory=list)
    branch_records: list = dataclasses.field(default_factory=list)
    step_records: list = dataclasses.field(default_factory=list)
    collapses: Any = dataclasses.field(default_factory=boundary_lib.CollapseLog)
    routes: list = dataclasses.field(default_factory=list)
    priced: dict = dataclasses.field(default_factory=dict)
    gamma_routes: list = dataclasses.field(default_factory=list)

    def __post_init__(self):
        if self.counts is None:
            self.counts = {
                n: np.zeros(
                    (self.n_plans,) + f(self.k, self.gamma),
                    np.float64 if n == "seconds" else np.int64,
                )
                for n, f in _FIELDS.items()
            }

    # Pooled views (sums over plans), named as the counters.
    def __getattr__(self, name):
        counts = self.__dict__.get("counts")
        if counts is not None and name in counts:
            x = counts[name].sum(0)
            return x if x.ndim else x.item()
        raise AttributeError(name)

    def add(self, name: str, plan: int, value) -> None:
        self.counts[name][plan] += value

    def add_priced(self, plan: int, items) -> None:
        """Adds forwards by price key (key → count) to plan `plan` (see `priced`)."""
        for key, n in items.items():
            if key not in self.priced:
                self.priced[key] = np.zeros((self.n_plans,), np.float64)
            self.priced[key][plan] += n

    def add_engine(self, counters, row: int, plan: int) -> None:
        """Adds one engine row's counters (numpy arrays, K drafters) to plan `plan`."""
        for name in ENGINE_FIELDS:
            x = np.asarray(getattr(counters, name)[row])
            want = self.counts[name].shape[1:]
            if x.shape != want:  # per-position counters of a call with a shorter window
                x = np.pad(x, [(0, w - n) for n, w in zip(x.shape, want)])
            self.counts[name][plan] += x

    def per_plan(self) -> dict:
        """JSON-ready per-plan counters (lists), for bootstrap intervals over plans."""
        return {n: np.asarray(v).tolist() for n, v in self.counts.items()}
