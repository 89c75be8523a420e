"""The seed's table reproduced on the shipped zoo (what `make reproduce` runs).

  python -m specjax.main --config=configs/seed_reproduction.py:runlocal --workdir=runs/seed_reproduction
  python -m specjax.main --config=configs/seed_reproduction.py --workdir=runs/seed_full
  python -m specjax.main --config=configs/seed_reproduction.py:routing_mixed --workdir=runs/seed_routing_mixed

The zoo is deployed like the seed's: code and prose drafters in the verifier's tokenizer
group, a hotter reasoning drafter with its own tokenizer and thinking tokens, all three on
mixed-domain plans. Every policy of the ablation (naive, all-on, each invariant removed
alone and added alone) plus `auto` (adaptive drafter sets) and `oracle` (each plan drafted
by its own domain's drafter alone, the domain known), over a small γ grid (each policy is
reported at its best γ) and three seeds, with 95% bootstrap intervals over plans. The step
decision is the seed's `execute_parallel_plan`; the quorum vote's verdict on the same steps
is recorded too.

Operating point: the verifier samples at τ = 1 and the drafters at their own temperatures
under the coupled rule — drafts and verification share Gumbel noise, so every policy
commits the verifier's own sample for the plan's noise (the text does not depend on the
step decision, which makes its counterfactuals exact) and identical computations are
shared across policies. Per-drafter α is still Leviathan's (each chain also tested alone
with rule 1's test). `grid.rule=[default]` runs independent noise.
"""

import ml_collections

from specjax.configs.common import parse_config_arg, plans_defaults
from specjax.policy.names import FIELD_REPORT_NAMES, single_name


def defaults() -> ml_collections.ConfigDict:
    c = plans_defaults()  # shared fields, each commented (specjax/configs/common.py)
    c.seed_table = True  # write summary.json + seed_report.md (the seed's table)
    c.grid.policy = list(FIELD_REPORT_NAMES)  # 10 switch policies, adaptive, oracle router
    c.grid.gamma = [2, 3, 4]  # each policy is reported at its best γ of this grid
    c.grid.seed = [0, 1, 2]  # PRNG seeds (intervals bootstrap over plans)
    return c


def runlocal(c: ml_collections.ConfigDict) -> None:
    c.plans_per_domain = 2
    c.grid.gamma = [3, 4]


def routing_mixed(c: ml_collections.ConfigDict) -> None:
    """Routing with room: the three domains mixed with the ``edit`` prompts (steps that copy
    their context with small edits, specjax/data/edit.py, where prompt lookup is the
    specialist), prompt lookup a fourth drafter; `auto` scored teacher forced (no
    exploration) and by the drafters that ran (with exploration), each drafter alone and
    the fixed token tree of prompt lookup and the code drafter. No `oracle`: no drafter is
    named after the ``edit`` domain. experiments/routing_room.py measures the room
    (hindsight per-plan and per-step best drafters) on the same plans."""
    drafters = ("code", "prose", "reasoning", "lookup")
    c.prompt_domains = ["code", "edit", "prose", "reasoning"]
    c.plans_per_domain = 6  # 24 plans, 6 of each prompt set
    c.grid.pairing = [drafters]
    c.grid.policy = (
        ["auto:teacher_forced", "auto:own"]
        + [single_name(d) for d in drafters]
        + ["set:code+lookup"]
    )
    # γ 1 and 4: each single drafter at its best γ of the two (the routers' fair baseline),
    # and `auto` at γ 1 choosing drafters alone beside `auto` at γ 4 choosing drafter and γ.
    c.grid.gamma = [1, 4]
    c.grid.seed = [0, 1]
    c.auto_gammas = [1, 2, 3, 4]  # a cell uses those ≤ its γ


def get_config(arg=None):
    return parse_config_arg(arg, defaults(), {"runlocal": runlocal, "routing_mixed": routing_mixed})
