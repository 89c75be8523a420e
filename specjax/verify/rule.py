"""The typed verification rule (SPEC §12): what a caller may ask of a rule, never its name.

A `Rule` is a frozen description of one lossless rule: the function that verifies a round
(one call signature for every rule) and the facts the engine, the policy and the runner
derive from it. A module of `specjax/verify/` defines its rules and passes each to
`register` when it is imported; `specjax.verify.registry` imports every such module (its one
registration line) and answers the callers (`registry.get(name)`, `registry.names()`, …).

The call signature, one row (lift with `jax.vmap`; shapes in `specjax.verify.rules`):

    rule.verify(key, p_root, p_nodes, q, drafts, active, gumbel) -> Verdict

`key` drives the rule's uniforms (the coupled rules: only the per-drafter measurement, None
turns it off); `gumbel` f32[γ+1, V] is the round's shared Gumbel noise for a rule with
`coupled` (the drafts are Gumbel-max samples with it), None for the others, which ignore it.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

#: Every registered rule, by name, in registration order (filled by `register`).
_RULES: dict[str, 'Rule'] = {}


@dataclasses.dataclass(frozen=True)
class Rule:
    """One lossless verification rule.

    Attributes:
        name: the name configs, result rows and flags give it (`EngineConfig.rule`).
        verify: the rule, `(key, p_root, p_nodes, q, drafts, active, gumbel) -> Verdict`.
        chains: how many chains (slots) a row may hold: 1 for a one-chain rule, None for
            any number.
        coupled: the drafts are Gumbel-max samples with the round's shared noise (the
            engine draws Gumbel noise instead of uniforms and passes it as `gumbel`).
        naive: the rule switch 2 off runs instead (the naive shared block); None: itself.
        lone: the rule a one-drafter engine call runs when a plan picks this rule (the
            program of that drafter's single-drafter baseline); None: itself.
        tree: for a one-chain rule a plan may pick, the rule of its several-drafter calls;
            None: itself.
        twins_without_replacement: twins (one drafter named several times in a call) draw
            their first drafts without replacement in each row's slot order
            (`specjax.engine.drafting.draft_group`); the rule stays exact with that law.
        plan: a plan config or a sweep's `grid.rule` may name it (`PlanConfig.rule`).
        rule1: Leviathan's token-level test on one chain, what `specjax.measure.loop_law` predicts.
        summary: one line for tables and error messages.
    """

    name: str
    verify: Callable
    chains: int | None = None
    coupled: bool = False
    naive: str | None = None
    lone: str | None = None
    tree: str | None = None
    twins_without_replacement: bool = False
    plan: bool = False
    rule1: bool = False
    summary: str = ''

    @property
    def one_chain(self) -> bool:
        """Whether a row holds exactly one chain."""
        return self.chains == 1

    def allows_slots(self, n_slots: int) -> bool:
        """Whether a row of `n_slots` chains can be verified by this rule."""
        return self.chains is None or n_slots == self.chains


def register(rule: Rule) -> Rule:
    """Adds `rule` to the registry (a name registered twice is an error) and returns it."""
    if not isinstance(rule, Rule):
        raise TypeError(f'register: got {type(rule).__name__}, expected a Rule')
    if rule.name in _RULES:
        raise ValueError(f'register: a rule named {rule.name!r} is already registered')
    if rule.chains is not None and (not isinstance(rule.chains, int) or rule.chains < 1):
        raise ValueError(f'register: rule {rule.name!r}: chains must be None or an int >= 1')
    _RULES[rule.name] = rule
    return rule


def registered() -> dict[str, Rule]:
    """The registered rules by name (a copy), in registration order."""
    return dict(_RULES)
