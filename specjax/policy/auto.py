"""`auto`: an adaptive policy that decides, per plan and step, which drafters take part and,
for a lone drafter, its γ.

The seed's step decision never commits from a branch of one drafter (its gain over itself is
zero), and a fixed sharing set pays every round for drafters that do not help. `auto` uses
the statistics every round already produces — each drafter's chain tested alone against
p (`own_accepted_at` / `own_reached_at`, Leviathan's α) — to choose, for each plan and
step, the option (drafter set S, window γ_S) with the lowest expected price per committed
token:

    E[tokens per round](S, γ) = (1 − a_S^{γ+1}) / (1 − a_S),  a_S = 1 − Π_{i∈S} (1 − α̂_i)
    price per round(S, γ)     = T_verify(1 + |S|·γ) + Σ_{i∈S} (T_consume,i + (γ − 1)·T_step,i)
                                with machine prices (seconds: a verifier forward over the
                                block, each drafter's consuming forward and its γ − 1
                                one-token drafting forwards, `specjax.measure.prices`), else
                              = 1 + γ · Σ_{i∈S} c_i   (the cost model, in verifier calls)

Machine prices are used when the router is given `measure` (the runner passes
`specjax.measure.prices.measure_prices` of the cell's deployment): at the start of the run
(`start`, called by `policy.plan.run_plans` with the carried state) it measures every
forward its options can run, in the run's own process, at one padded row and the carried
caches' capacities, and keeps them (`prices`) for the result row. Without it, the cost
model (c_i) prices the options.

Options: every single drafter at each γ of `gamma_candidates` (default: only its own γ_i,
`grid.drafter_gamma`, else the config's γ; the runner passes a small set such as
{2, 4, 6, 8} ∪ {γ_i}, bounded by the run's widest γ — `gammas.widest_gamma`, which sizes the
carried state), and every pair at the shared block's γ (the config's: chains of one block
share its width, `policy.engine_calls.run_carried`). A candidate outside [1, widest γ] is a
one-line ConfigError. Each (drafter, γ) is its own compiled program (γ_i is static in
`DrafterStatic`), so the programs are bounded: K · |candidates| · (padded row counts), and
nothing retraces per step. Any drafter of the deployment is a candidate, the prompt-lookup
drafter (`lookup`, c = 0, near-free forwards) included.

(`a_S` treats the drafters' acceptances at a node as independent: a first-order model of
recursive rejection sampling over S.) A set of two shares one prefix (token tree), which is
how `auto` decides who shares. Running drafters as independent branches is never chosen:
with one committed output per step, a second independent branch costs a verifier pass and
adds no committed token. Drafters outside the chosen set sit the step out.

Estimates are per plan (the plan's domain is not told), shrunk towards each drafter's
α pooled over all plans so far (`prior_weight` positions of it; the pooled α itself starts
from a Beta(1, 1) prior), so a new plan starts from what the batch has learnt and a drafter
measured on other plans need not be re-measured from scratch. With no measurement at all
the estimates are equal and the cheapest option runs. With probability `explore` (a
deterministic draw from (seed, plan, step)) the drafter with the fewest measured positions on
this plan joins the chosen set for that step (a pair: the config's γ), so a dropped drafter
can come back.
Every choice is a set and a window verified by a lossless rule (rule 1 for one drafter at
any γ, the token tree or the coupled rule for several), so `auto` is lossless like every
policy: the choice depends only on past rounds, which is a predictable (stopping-time-like)
choice.
"""

from __future__ import annotations

import itertools

import numpy as np

from specjax import metrics
from specjax.engine.decode import consume_width
from specjax.engine.gammas import check_gamma, drafter_gammas, widest_gamma
from specjax.errors import ConfigError


class AutoRouter:
    """Per-plan drafter sets by expected cost per committed token (see the module docstring).

    Args:
      costs: c_i of the K drafters (per-token cost relative to a verifier call).
      gamma: the draft window γ of a shared block (sets of two or more).
      seed: seeds the exploration draws.
      explore: probability that a step adds the least-measured drafter.
      max_set: largest set considered (1 or 2; the token tree over more is rarely cheaper).
      gammas: each drafter's own γ_i when it runs alone (None or a None entry: `gamma`).
      gamma_candidates: the γ a lone drafter may run at (each in [1, the run's widest γ]);
        None: its own γ_i only. A drafter's own γ_i is always a candidate.
      names: the drafters' names (for the price keys; default d0, d1, ...).
      measure: price keys → seconds (machine prices, `specjax.measure.prices.measure_prices`);
        None: the cost model.
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
        gamma_candidates=None,
        names=None,
        measure=None,
    ):
        self.costs = np.asarray(costs, np.float64)
        self.k = len(self.costs)
        self.gamma = int(gamma)
        self.gammas = list(drafter_gammas(self.gamma, gammas, self.k, "AutoRouter gammas"))
        self.widest = widest_gamma(self.gamma, gammas)
        cands = () if gamma_candidates is None else gamma_candidates
        if isinstance(cands, (str, bytes)) or not hasattr(cands, "__iter__"):
            raise ConfigError.invalid(
                "auto gamma candidates", gamma_candidates, "a list of integers γ"
            )
        self.gamma_candidates = tuple(
            sorted({check_gamma(g, "auto gamma candidates", self.widest) for g in cands})
        )
        self.names = list(names) if names is not None else [f"d{i}" for i in range(self.k)]
        if len(self.names) != self.k:
            raise ConfigError.invalid("AutoRouter names", self.names, f"{self.k} drafter names")
        self.measure = measure
        self.prices: dict | None = None
        self._round_seconds: dict | None = None
        self._chosen_gamma: dict[int, int | None] = {}
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

    def options(self) -> list[tuple[tuple[int, ...], int]]:
        """Every (drafter set, γ) `choose` may pick: each lone drafter at its own γ_i and
        at each candidate, each pair (up to `max_set`) at the shared block's γ."""
        out = []
        for n in range(1, min(self.max_set, self.k) + 1):
            for c in itertools.combinations(range(self.k), n):
                if n == 1:
                    gs = sorted({self.gammas[c[0]], *self.gamma_candidates})
                    out += [(c, g) for g in gs]
                else:
                    out.append((c, self.gamma))
        return out

    def start(self, states) -> None:
        """Measures the machine prices of every option's forwards (with `measure`), at one
        padded row and the carried caches' capacities (`states`: `plan_state.PlanStates`);
        called by `run_plans` before the first step. A no-op without `measure`."""
        if self.measure is None:
            return
        parts = {}
        for members, g in self.options():
            keys = [
                (metrics.price_key("verify", "verifier", 1 + len(members) * g, 1, states.v_cap), 1)
            ]
            width = 2 if len(members) == 1 else g + 1
            for i in members:
                cap = states.d_capacity(i)
                m = int(states.dep.d_data[i].retok.shape[1])
                name = self.names[i]
                keys.append((metrics.price_key("draft", name, consume_width(m, width), 1, cap), 1))
                if g > 1:
                    keys.append((metrics.price_key("draft", name, 1, 1, cap), g - 1))
            parts[(members, g)] = keys
        self.prices = dict(self.measure(sorted({k for ks in parts.values() for k, _ in ks})))
        self.prices = metrics.check_prices(self.prices, "auto machine prices")
        missing = sorted({k for ks in parts.values() for k, _ in ks} - set(self.prices))
        if missing:
            raise ValueError(
                f"auto machine prices: got no price for {missing[0]!r}, allowed: a price for "
                "every forward of every option"
            )
        self._round_seconds = {o: sum(n * self.prices[k] for k, n in ks) for o, ks in parts.items()}

    def expected_cost_per_token(self, alphas: np.ndarray, members, gamma: int | None = None):
        """Expected price per committed token of `members` at window `gamma` (default
        `set_gamma`): seconds with machine prices (after `start`), else verifier calls."""
        members = tuple(members)
        g = self.set_gamma(members) if gamma is None else int(gamma)
        a = 1.0 - float(np.prod([1.0 - alphas[i] for i in members]))
        tokens = float(metrics.leviathan_expected_tokens(min(max(a, 0.0), 1.0), g))
        if self._round_seconds is not None and (members, g) in self._round_seconds:
            return self._round_seconds[(members, g)] / tokens
        return (1.0 + g * float(self.costs[list(members)].sum())) / tokens

    def choose(self, plan: int, step: int) -> tuple[int, ...]:
        """The drafter set (indices, priority order) for this plan's step; a lone drafter's
        window is `gamma_for(plan)`."""
        al = self.alpha(plan)
        best, g = min(
            self.options(),
            key=lambda o: (self.expected_cost_per_token(al, *o), len(o[0]), o[0], o[1]),
        )
        rng = np.random.default_rng([self.seed, plan, step, 0x617574])
        if self.k > len(best) and rng.random() < self.explore:
            out = [i for i in range(self.k) if i not in best]
            seen = self.reached.get(plan, np.zeros(self.k))
            least = min(out, key=lambda i: (seen[i], self.pooled_reached[i], i))
            best = tuple(sorted(best + (least,)))
        lone = len(best) == 1 and g != self.gammas[best[0]]
        self._chosen_gamma[plan] = g if lone else None
        return tuple(sorted(best, key=lambda i: -al[i]))

    def gamma_for(self, plan: int) -> int | None:
        """The γ the plan's last chosen set runs at when it is a lone drafter whose window
        differs from its own γ_i; None: the set's own window (no other program)."""
        return self._chosen_gamma.get(plan)

    def observe(self, plan: int, step: int, members, counters, row: int) -> None:
        """Adds one row's per-drafter own-test counts (engine counters over all K)."""
        acc = np.asarray(counters.own_accepted_at[row]).sum(-1).astype(np.float64)
        reach = np.asarray(counters.own_reached_at[row]).sum(-1).astype(np.float64)
        self.accepted[plan] = self.accepted.get(plan, np.zeros(self.k)) + acc
        self.reached[plan] = self.reached.get(plan, np.zeros(self.k)) + reach
        self.pooled_accepted += acc
        self.pooled_reached += reach
