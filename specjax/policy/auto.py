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
Scores (`score`). ``'own'`` (the default): α̂_i from each drafter's own chain test on the
rounds where it ran, so a drafter that sits out is measured again only when exploration
brings it back. ``'teacher_forced'``: after every step the plan runner scores every
candidate drafter, whether it ran or not, on the step's committed text
(`policy.scores.teacher_forced`: α̂_i = Σ_t Σ_x min(p_t, q_i,t) over the committed
positions ÷ their count, p the verifier's law at τ 1, q_i what drafter i would draw from
there; `observe_scores`), so every estimate is current and exploration is not needed
(``explore`` defaults to 0 in this mode; `run_plans` charges the scoring's seconds to the
plans). Teacher-forced α is the mean over all positions, where the loop's per-step α
weighs round starts (`specjax.measure.loop_law`); both modes feed the same cost model.

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
from specjax.policy import names as policy_names
from specjax.policy.plan_state import padded_count


class AutoRouter:
    """Per-plan drafter sets by expected cost per committed token (see the module docstring).

    Args:
      costs: c_i of the K drafters (per-token cost relative to a verifier call).
      gamma: the draft window γ of a shared block (sets of two or more).
      seed: seeds the exploration draws.
      explore: probability that a step adds the least-measured drafter (None: 0.15 with
        ``score='own'``, 0 with ``score='teacher_forced'``).
      max_set: largest set considered (1 or 2; the token tree over more is rarely cheaper).
      gammas: each drafter's own γ_i when it runs alone (None or a None entry: `gamma`).
      gamma_candidates: the γ a lone drafter may run at (each in [1, the run's widest γ]);
        None: its own γ_i only. A drafter's own γ_i is always a candidate.
      names: the drafters' names (for the price keys; default d0, d1, ...).
      measure: price keys → seconds (machine prices, `specjax.measure.prices.measure_prices`);
        None: the cost model.
      score: where α̂ comes from: ``'own'`` (each drafter's own chain test on the rounds it
        ran) or ``'teacher_forced'`` (every drafter scored on every step's committed text,
        `observe_scores`).
    """

    SCORES = policy_names.AUTO_SCORES

    def __init__(
        self,
        costs,
        gamma: int,
        seed: int = 0,
        explore: float | None = None,
        max_set: int = 2,
        prior_weight: float = 8.0,
        gammas=None,
        gamma_candidates=None,
        names=None,
        measure=None,
        score: str = "own",
    ):
        if score not in self.SCORES:
            raise ConfigError.invalid("auto score", score, list(self.SCORES))
        self.score = score
        if explore is None:
            explore = 0.0 if score == "teacher_forced" else 0.15
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
        self._seconds_at: dict[int, dict] | None = None  # padded rows → option → seconds
        #: Per step of `choose_batch`: the calls the plans' own choices made, the calls run,
        #: and the predicted seconds per committed token of each (a row's `auto_batches`).
        self.batch_log: list[dict] = []
        self._chosen_gamma: dict[int, int | None] = {}
        self.seed = int(seed)
        self.explore = float(explore)
        self.max_set = int(max_set)
        self.prior_weight = float(prior_weight)
        self.accepted: dict[int, np.ndarray] = {}
        self.reached: dict[int, np.ndarray] = {}
        self.pooled_accepted = np.zeros(self.k)
        self.pooled_reached = np.zeros(self.k)
        # Teacher-forced scores (score='teacher_forced'): Σ α and positions, per plan and pooled.
        self.tf_alpha: dict[int, np.ndarray] = {}
        self.tf_positions: dict[int, np.ndarray] = {}
        self.pooled_tf_alpha = np.zeros(self.k)
        self.pooled_tf_positions = np.zeros(self.k)

    @property
    def wants_scores(self) -> bool:
        """Whether the plan runner must score every drafter on each step's committed text
        and hand the sums to `observe_scores`."""
        return self.score == "teacher_forced"

    def _counts(self, plan: int):
        if self.score == "teacher_forced":
            return (
                self.tf_alpha.get(plan, np.zeros(self.k)),
                self.tf_positions.get(plan, np.zeros(self.k)),
                self.pooled_tf_alpha,
                self.pooled_tf_positions,
            )
        return (
            self.accepted.get(plan, np.zeros(self.k)),
            self.reached.get(plan, np.zeros(self.k)),
            self.pooled_accepted,
            self.pooled_reached,
        )

    def alpha(self, plan: int) -> np.ndarray:
        """f64[K] each drafter's α on this plan, shrunk towards its pooled α (the mode's
        counts: own chain tests, or teacher-forced scores)."""
        a, r, pa, pr = self._counts(plan)
        pooled = (pa + 1.0) / (pr + 2.0)
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
        padded row and at the run's whole batch of plans padded (`states`:
        `plan_state.PlanStates`; its caches' capacities), so a call of any row count is
        priced (`call_seconds`); called by `run_plans` before the first step. A no-op
        without `measure`."""
        if self.measure is None:
            return
        counts = sorted({1, padded_count(states.n_plans)})
        parts = {n: self._option_keys(states, n) for n in counts}
        wanted = sorted({k for pn in parts.values() for ks in pn.values() for k, _ in ks})
        self.prices = dict(self.measure(wanted))
        self.prices = metrics.check_prices(self.prices, "auto machine prices")
        missing = sorted(set(wanted) - set(self.prices))
        if missing:
            raise ValueError(
                f"auto machine prices: got no price for {missing[0]!r}, allowed: a price for "
                "every forward of every option"
            )
        self._seconds_at = {
            n: {o: sum(c * self.prices[k] for k, c in ks) for o, ks in pn.items()}
            for n, pn in parts.items()
        }
        self._round_seconds = self._seconds_at[1]

    def _option_keys(self, states, rows: int) -> dict:
        """(set, γ) → [(price key, forwards per round)] of one round at ``rows`` padded rows:
        the verifier's block, each drafter's consuming forward and its γ − 1 steps."""
        parts = {}
        for members, g in self.options():
            keys = [
                (
                    metrics.price_key(
                        "verify", "verifier", 1 + len(members) * g, rows, states.v_cap
                    ),
                    1,
                )
            ]
            width = 2 if len(members) == 1 else g + 1
            for i in members:
                cap = states.d_capacity(i)
                m = int(states.dep.d_data[i].retok.shape[1])
                name = self.names[i]
                keys.append(
                    (metrics.price_key("draft", name, consume_width(m, width), rows, cap), 1)
                )
                if g > 1:
                    keys.append((metrics.price_key("draft", name, 1, rows, cap), g - 1))
            parts[(members, g)] = keys
        return parts

    def call_seconds(self, option, rows: int) -> float | None:
        """Seconds of one round of ``option`` (set, γ) as one engine call of ``rows`` rows:
        measured at one padded row and at the batch's padded rows, linear in the padded
        row count between them; None without machine prices."""
        if self._seconds_at is None:
            return None
        lo, hi = min(self._seconds_at), max(self._seconds_at)
        t_lo = self._seconds_at[lo][option]
        if hi == lo:
            return t_lo
        t_hi = self._seconds_at[hi][option]
        return t_lo + (t_hi - t_lo) * (padded_count(rows) - lo) / (hi - lo)

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

    def _own_best(self, al: np.ndarray) -> tuple[tuple[int, ...], int]:
        """The (set, γ) with the lowest expected price per committed token for one row."""
        return min(
            self.options(),
            key=lambda o: (self.expected_cost_per_token(al, *o), len(o[0]), o[0], o[1]),
        )

    def _finish(self, plan: int, step: int, option, al: np.ndarray) -> tuple[int, ...]:
        """Exploration on top of the chosen option, then the set in priority order; keeps a
        lone drafter's γ for `gamma_for`."""
        best, g = option
        rng = np.random.default_rng([self.seed, plan, step, 0x617574])
        if self.k > len(best) and rng.random() < self.explore:
            out = [i for i in range(self.k) if i not in best]
            _, seen, _, pooled_seen = self._counts(plan)
            least = min(out, key=lambda i: (seen[i], pooled_seen[i], i))
            best = tuple(sorted(best + (least,)))
        lone = len(best) == 1 and g != self.gammas[best[0]]
        self._chosen_gamma[plan] = g if lone else None
        return tuple(sorted(best, key=lambda i: -al[i]))

    def choose(self, plan: int, step: int) -> tuple[int, ...]:
        """The drafter set (indices, priority order) for this plan's step, chosen for the
        plan alone; a lone drafter's window is `gamma_for(plan)`."""
        al = self.alpha(plan)
        return self._finish(plan, step, self._own_best(al), al)

    def batch_seconds(self, assign: dict, alphas: dict) -> float:
        """Predicted seconds per committed token of a step's batch: every distinct option
        of ``assign`` (plan → (set, γ)) is one engine call over its rows, priced by
        `call_seconds` at its row count, for as many rounds as its slowest row needs
        (a row commits E[tokens per round] per round; a call runs until its last row is
        done), over the tokens the batch commits."""
        groups: dict = {}
        for p, o in assign.items():
            groups.setdefault(o, []).append(p)
        total = 0.0
        for o, plans in groups.items():
            per_round = [self._tokens_per_round(alphas[p], o) for p in plans]
            total += self.call_seconds(o, len(plans)) / min(per_round)
        return total / len(assign)

    def _tokens_per_round(self, al: np.ndarray, option) -> float:
        members, g = option
        a = 1.0 - float(np.prod([1.0 - al[i] for i in members]))
        return float(metrics.leviathan_expected_tokens(min(max(a, 0.0), 1.0), g))

    def choose_batch(self, plans, step: int) -> list[tuple[int, ...]]:
        """The drafter sets of a step's plans, chosen for the batch: each plan's own best
        option, then, with machine prices, whole groups moved onto another option (one the
        batch already runs, or the best for the whole batch) while the batch's predicted
        seconds per committed token fall — fewer distinct calls where a second-best set in a
        shared call is cheaper overall. Exploration is drawn per plan afterwards."""
        plans = list(plans)
        al = {p: self.alpha(p) for p in plans}
        assign = {p: self._own_best(al[p]) for p in plans}
        if self._seconds_at is not None and len(plans) > 1:
            own_calls = len(set(assign.values()))
            before = cur = self.batch_seconds(assign, al)
            whole = min(
                self.options(), key=lambda o: self.batch_seconds(dict.fromkeys(plans, o), al)
            )
            while True:
                groups = sorted(set(assign.values()))
                best = None
                for src in groups:
                    for dst in sorted(set(groups) | {whole}):
                        if dst == src:
                            continue
                        moved = {p: dst if o == src else o for p, o in assign.items()}
                        c = self.batch_seconds(moved, al)
                        if c < cur * (1 - 1e-9) and (best is None or c < best[0]):
                            best = (c, moved)
                if best is None:
                    break
                cur, assign = best
            self.batch_log.append(
                {
                    "step": int(step),
                    "own_calls": own_calls,
                    "calls": len(set(assign.values())),
                    "own_seconds_per_token": before,
                    "seconds_per_token": cur,
                }
            )
        return [self._finish(p, step, assign[p], al[p]) for p in plans]

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

    def observe_scores(self, plan: int, step: int, alpha_sum, positions) -> None:
        """Adds every drafter's teacher-forced score on one step's committed text: Σ α
        (f64[K], `policy.scores.teacher_forced`) over ``positions`` positions."""
        del step
        a = np.asarray(alpha_sum, np.float64).reshape(self.k)
        n = np.full(self.k, float(positions))
        self.tf_alpha[plan] = self.tf_alpha.get(plan, np.zeros(self.k)) + a
        self.tf_positions[plan] = self.tf_positions.get(plan, np.zeros(self.k)) + n
        self.pooled_tf_alpha += a
        self.pooled_tf_positions += n
