"""`auto`: an adaptive policy that decides, per plan and step, which drafters take part.

The seed's step decision never commits from a branch of one drafter (its gain over itself is
zero), and a fixed sharing set pays every round for drafters that do not help. `auto` uses
the statistics every round already produces — each drafter's chain tested alone against
p (`own_accepted_at` / `own_reached_at`, Leviathan's α) — to choose, for each plan and
step, the drafter set with the lowest expected cost per committed token:

    E[tokens per round](S) = (1 − a_S^{γ_S+1}) / (1 − a_S),  a_S = 1 − Π_{i∈S} (1 − α̂_i)
    cost per round(S)      = 1 + γ_S · Σ_{i∈S} c_i

where γ_S is the window the engine runs S with: a drafter alone drafts its own γ_i (SPEC §2,
`grid.drafter_gamma`), a shared block of several drafters the config's γ
(`specjax.policy.engine_calls.run_carried`).

(`a_S` treats the drafters' acceptances at a node as independent: a first-order model of
recursive rejection sampling over S.) Candidates are every single drafter and every pair;
a set of two shares one prefix (token tree), which is how `auto` decides who shares.
Running drafters as independent branches is never chosen: with one committed output per
step, a second independent branch costs a verifier pass and adds no committed token.
Drafters outside the chosen set sit the step out.

Estimates are per plan (the plan's domain is not told), shrunk towards each drafter's
α pooled over all plans so far (`prior_weight` positions of it; the pooled α itself starts
from a Beta(1, 1) prior), so a new plan starts from what the batch has learnt and a drafter
measured on other plans need not be re-measured from scratch. With no measurement at all
the estimates are equal and the cheapest drafter runs alone. With probability `explore` (a
deterministic draw from (seed, plan, step)) the drafter with the fewest measured positions on
this plan joins the chosen set for that step, so a dropped drafter can come back.
Every choice is a set verified by a lossless rule (rule 1 for one drafter, the token tree
or the coupled rule for several), so `auto` is lossless like every policy: the choice
depends only on past rounds, which is a predictable (stopping-time-like) choice.
"""

from __future__ import annotations

import itertools

import numpy as np

from specjax import metrics
from specjax.gammas import drafter_gammas


class AutoRouter:
    """Per-plan drafter sets by expected cost per committed token (see the module docstring).

    Args:
      costs: c_i of the K drafters (per-token cost relative to a verifier call).
      gamma: the draft window γ of a shared block (sets of two or more).
      seed: seeds the exploration draws.
      explore: probability that a step adds the least-measured drafter.
      max_set: largest set considered (1 or 2; the token tree over more is rarely cheaper).
      gammas: each drafter's own γ_i when it runs alone (None or a None entry: `gamma`).
    """

    def __init__(
        self,
        costs,
        gamma: int,
        seed: int = 0,
        explore: float = 0.15,
        max_set: int = 2,
        prior_weight: float = 8.0,
        gammas=None,
    ):
        self.costs = np.asarray(costs, np.float64)
        self.k = len(self.costs)
        self.gamma = int(gamma)
        self.gammas = list(drafter_gammas(self.gamma, gammas, self.k, "AutoRouter gammas"))
        self.seed = int(seed)
        self.explore = float(explore)
        self.max_set = int(max_set)
        self.prior_weight = float(prior_weight)
        self.accepted: dict[int, np.ndarray] = {}
        self.reached: dict[int, np.ndarray] = {}
        self.pooled_accepted = np.zeros(self.k)
        self.pooled_reached = np.zeros(self.k)

    def alpha(self, plan: int) -> np.ndarray:
        """f64[K] each drafter's α on this plan, shrunk towards its pooled α."""
        pooled = (self.pooled_accepted + 1.0) / (self.pooled_reached + 2.0)
        a = self.accepted.get(plan, np.zeros(self.k))
        r = self.reached.get(plan, np.zeros(self.k))
        return (a + self.prior_weight * pooled) / (r + self.prior_weight)

    def set_gamma(self, members) -> int:
        """γ_S: a lone drafter's own γ_i, the shared block's γ otherwise."""
        return self.gammas[members[0]] if len(members) == 1 else self.gamma

    def expected_cost_per_token(self, alphas: np.ndarray, members) -> float:
        members = tuple(members)
        g = self.set_gamma(members)
        a = 1.0 - float(np.prod([1.0 - alphas[i] for i in members]))
        tokens = float(metrics.leviathan_expected_tokens(min(max(a, 0.0), 1.0), g))
        return (1.0 + g * float(self.costs[list(members)].sum())) / tokens

    def choose(self, plan: int, step: int) -> tuple[int, ...]:
        """The drafter set (indices, priority order) for this plan's step."""
        al = self.alpha(plan)
        cands = [
            c
            for n in range(1, min(self.max_set, self.k) + 1)
            for c in itertools.combinations(range(self.k), n)
        ]
        best = min(cands, key=lambda c: (self.expected_cost_per_token(al, c), len(c), c))
        rng = np.random.default_rng([self.seed, plan, step, 0x617574])
        if self.k > len(best) and rng.random() < self.explore:
            out = [i for i in range(self.k) if i not in best]
            seen = self.reached.get(plan, np.zeros(self.k))
            least = min(out, key=lambda i: (seen[i], self.pooled_reached[i], i))
            best = tuple(sorted(best + (least,)))
        return tuple(sorted(best, key=lambda i: -al[i]))

    def observe(self, plan: int, step: int, members, counters, row: int) -> None:
        """Adds one row's per-drafter own-test counts (engine counters over all K)."""
        acc = np.asarray(counters.own_accepted_at[row]).sum(-1).astype(np.float64)
        reach = np.asarray(counters.own_reached_at[row]).sum(-1).astype(np.float64)
        self.accepted[plan] = self.accepted.get(plan, np.zeros(self.k)) + acc
        self.reached[plan] = self.reached.get(plan, np.zeros(self.k)) + reach
        self.pooled_accepted += acc
        self.pooled_reached += reach
