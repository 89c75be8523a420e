"""The verification rules by name: what every caller asks instead of comparing names (SPEC §12).

The modules imported below register their rules (`specjax.verify.rule.register`) when they
are imported; this import is the one line a new rule's module adds itself to. A caller asks
`get(name)` for the typed `Rule` (its call, whether it is coupled, how many chains a row may
hold, its naive twin, …), `names()` for the list, and `call_rule` for the rule an engine
call of a plan runs (the policy's one question about rules).
"""

from __future__ import annotations

from specjax.errors import ConfigError
from specjax.verify import rules, traversal  # noqa: F401  (each module registers its rules)
from specjax.verify.rule import Rule, registered

#: The rule family a plan runs when its config names none (`PlanConfig.rule` None): the token
#: tree (switch 2 off: its naive twin), rule 1 for a one-drafter call.
DEFAULT = 'token_tree'
#: The spelling of `DEFAULT` in a sweep's `grid.rule` (None is the same cell).
DEFAULT_SPELLING = 'default'


def names() -> tuple[str, ...]:
    """Every registered rule's name, in registration order."""
    return tuple(registered())


def all_rules() -> tuple[Rule, ...]:
    """Every registered rule, in registration order."""
    return tuple(registered().values())


def get(name: str) -> Rule:
    """The rule named `name`.

    Raises:
        ConfigError (a ValueError): naming the value and the registered rules.
    """
    rule = registered().get(name) if isinstance(name, str) else None
    if rule is None:
        raise ConfigError(f"rule: got {name!r}; allowed: one of {', '.join(names())}")
    return rule


def plan_names() -> tuple[str, ...]:
    """The rules a plan config (`PlanConfig.rule`) or a sweep's `grid.rule` may name."""
    return tuple(r.name for r in all_rules() if r.plan)


def plan_rule(name: str | None) -> Rule:
    """The rule a plan config names (None: `DEFAULT`)."""
    return get(DEFAULT if name is None else name)


def call_rule(plan: str | None, chains: int, truncate_and_attribute: bool = True) -> Rule:
    """The rule an engine call of `chains` chains per row runs under the plan config's rule
    `plan`: a one-drafter call its `lone` rule, a call of several chains its `tree` rule, or
    that rule's `naive` twin with switch 2 (`truncate_and_attribute`) off."""
    rule = plan_rule(plan)
    if chains == 1:
        return get(rule.lone or rule.name)
    tree = get(rule.tree or rule.name)
    return tree if truncate_and_attribute else get(tree.naive or tree.name)


def _check_links() -> None:
    """Every rule a rule names exists and can verify what it is named for."""
    for r in all_rules():
        for field, other, slots in (
            ('naive', r.naive, 2),
            ('lone', r.lone, 1),
            ('tree', r.tree, 2),
        ):
            if other is None:
                continue
            if other not in registered():
                raise ValueError(f'rule {r.name!r}: {field} {other!r} is not registered')
            if not get(other).allows_slots(slots):
                raise ValueError(f'rule {r.name!r}: {field} {other!r} cannot verify {slots} chains')
            if field != 'tree' and get(other).coupled != r.coupled:
                raise ValueError(f'rule {r.name!r}: {field} {other!r} draws other noise')


_check_links()
