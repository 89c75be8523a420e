"""How plans are executed: `PlanConfig`, every field validated (SPEC §5–6).

`specjax.policy.plan.run_plans` reads it; the engine calls (`specjax.policy.engine_calls`)
and the carried state (`specjax.policy.plan_state`) take their γ, budget and bucket from it.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from specjax.engine.spec import EngineConfig
from specjax.errors import ConfigError
from specjax.policy import boundary as boundary_lib
from specjax.policy.consensus import CONSENSUS_RULES
from specjax.verify import registry


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
      rule: None (the policy's switch 2 picks `token_tree` or its naive twin; a one-drafter
        branch runs rule 1) or a rule a plan may name (`registry.plan_names()`): 'coupled'
        (shared Gumbel noise across the branches of a plan: drafter-invariant; switch 2
        picks `coupled` or the naive `coupled_block`), 'block_verification' (as None, but a
        one-drafter branch is verified as a block: more drafts kept, same law),
        'traversal' (several drafters verified leaf to root; one drafter as a block). The
        rule of each engine call: `call_rule`.
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
        EngineConfig(
            gamma=self.gamma,
            verifier_temperature=self.verifier_temperature,
            max_new_tokens=self.max_step_tokens,
        )

        def bad(field, allowed):
            raise ConfigError.invalid(field, getattr(self, field), allowed)

        if isinstance(self.plan_steps, bool) or not (
            isinstance(self.plan_steps, int) and self.plan_steps >= 1
        ):
            bad("plan_steps", "an integer ≥ 1")
        if self.consensus not in CONSENSUS_RULES:
            bad("consensus", list(CONSENSUS_RULES))
        if not (
            isinstance(self.consensus_threshold, (int, float)) and 0 < self.consensus_threshold <= 1
        ):
            bad("consensus_threshold", "a number in (0, 1]")
        if not isinstance(self.thresholds, boundary_lib.BoundaryThresholds):
            bad("thresholds", "a BoundaryThresholds")
        if self.rule is not None and self.rule not in registry.plan_names():
            bad("rule", f"None or one of {', '.join(registry.plan_names())}")
        if self.n_branches is not None and not (
            isinstance(self.n_branches, int) and self.n_branches >= 1
        ):
            bad("n_branches", "None or an integer ≥ 1")
        if not (
            isinstance(self.consensus_cost, (int, float))
            and np.isfinite(self.consensus_cost)
            and self.consensus_cost >= 0
        ):
            bad("consensus_cost", "a finite number ≥ 0")
        if not (isinstance(self.bucket, int) and self.bucket >= 1):
            bad("bucket", "an integer ≥ 1")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            bad("seed", "an integer ≥ 0")
        if not (isinstance(self.kl_positions, int) and self.kl_positions >= 1):
            bad("kl_positions", "an integer ≥ 1")

    @property
    def coupled(self) -> bool:
        """The plan's rule draws shared Gumbel noise (a plan's branches share it)."""
        return registry.plan_rule(self.rule).coupled

    def call_rule(self, chains: int, truncate_and_attribute: bool = True) -> str:
        """The rule an engine call of `chains` chains per row runs (switch 2 off: the naive
        twin of the plan's tree rule)."""
        return registry.call_rule(self.rule, chains, truncate_and_attribute).name
