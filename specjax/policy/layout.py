"""The layout of a step: which drafters share a prefix (sharing sets) and the branches.

Switch 1 makes one sharing set per tokenizer group (off: one set of every drafter), switch 4
splits a set whose pairwise KL on the shared prefix exceeds the ceiling, and the decision
boundary of the previous batch sends a set to independent branches. Branches are the sets,
repeated in turn up to the minimum branch count; switch 2 picks the verification rule.
"""

from __future__ import annotations

import numpy as np

from specjax.engine.deployment import Deployment
from specjax.policy.kl import kl_groups
from specjax.policy.switches import Policy
from specjax.verify import registry


def sharing_sets(
    dep: Deployment,
    policy: Policy,
    kl_pair: np.ndarray | None,
    split: set[tuple[int, ...]] = frozenset(),
) -> list[list[int]]:
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


def branch_layout(
    dep: Deployment, policy: Policy, kl_pair, split, n_branches: int, plan_rule: str | None = None
):
    """(sets, branches, rule) of a policy: who shares a prefix, the branch list, the rule.

    Branches are the sharing sets, repeated in turn until there are `n_branches` of them
    (with one shared set, every branch runs the same drafters on its own random stream).
    The rule is the one sets of several drafters run: the plan config's rule
    (`PlanConfig.rule`, None: `token_tree`), or its naive twin with switch 2 off.
    """
    sets = sharing_sets(dep, policy, kl_pair, split)
    n_b = max(n_branches, len(sets))
    branches = [sets[b % len(sets)] for b in range(n_b)]
    rule = registry.call_rule(plan_rule, 2, policy.truncate_and_attribute).name
    return sets, branches, rule


def branch_slots(branches) -> np.ndarray:
    """i32[n_branches, S]: each branch's drafters in priority order, -1 for an empty slot."""
    s_max = max(len(b) for b in branches)
    out = np.full((len(branches), s_max), -1, np.int32)
    for i, b in enumerate(branches):
        out[i, : len(b)] = b
    return out


class StepRows:
    """The engine rows of one step: one per (plan, branch); under the coupled rule the
    branches of a plan that run the same drafter set are one row (they share its noise).

    Attributes:
      sets: each row's drafter set.
      plans: each row's plan (an index into the step's plans).
      key_branches: each row's branch for its key (−1: the plan's own key, coupled rule).
    """

    def __init__(self, branches, n_plans: int, coupled: bool):
        self.branches, self.coupled = branches, coupled
        self._index: dict = {}
        self.sets, self.plans, self.key_branches = [], [], []
        for p in range(n_plans):
            for b, bs in enumerate(branches):
                ident = self._ident(p, b)
                if ident not in self._index:
                    self._index[ident] = len(self.sets)
                    self.sets.append(tuple(bs))
                    self.plans.append(p)
                    self.key_branches.append(-1 if coupled else b)

    def _ident(self, p: int, b: int):
        return (p, tuple(self.branches[b])) if self.coupled else (p, b)

    def row(self, p: int, b: int) -> int:
        """The row of plan `p`'s branch `b`."""
        return self._index[self._ident(p, b)]
