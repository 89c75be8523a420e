"""Acceptance and throughput against γ and the drafters' temperature, naive vs all invariants on.

  python -m specjax.main --config=configs/sweep_gamma_temperature.py:runlocal --workdir=runs/gamma_temp_local
  python -m specjax.main --config=configs/sweep_gamma_temperature.py:published --workdir=runs/sweep_gamma_temperature
  python -m specjax.main --config=configs/sweep_gamma_temperature.py --workdir=runs/gamma_temp_full
  python -m specjax.main --config=configs/sweep_gamma_temperature.py:real --workdir=runs/sweep_gamma_temperature_real

The grid (issue 22): γ ∈ {2, 3, 4, 6, 8} × drafter τ ∈ {0.5, 0.7, 1.0, 1.3} (every drafter at
that τ) × policy ∈ {naive, all_on}: 40 cells, the zoo's three drafters (code, prose,
reasoning) on mixed-domain plans, verifier τ = 1, the coupled rule.

Sizes (how long each published run took, and on which machine, is on its page):

* default: 24 plans per domain × 4 steps × ≤ 32 tokens (12× the published variant's
  plan-tokens; not published).
* ``published`` (`make sweeps`, docs/results/sweep_gamma_temperature.md): 4 plans per
  domain × 2 steps × ≤ 32 tokens, the whole grid (the issue's). Each γ's first cell computes
  the baselines and compiles that γ's programs; the other cells reuse them.
* ``real`` (`make sweeps-real`, docs/results/sweep_gamma_temperature_real.md): the real
  verifier SmolLM2-135M-Instruct and its drafters code, prose (distilled, its tokenizer) and
  reasoning (own tokenizer); 1 plan per domain × 1 step × ≤ 16 tokens, γ ∈ {2, 4, 8} × τ ∈
  {0.5, 0.7, 1.0, 1.3} (24 cells: the tokens cannot shrink further, so the γ axis is thinned;
  τ reuses the compiled programs, γ does not: per γ the programs of 3 single-drafter
  baselines, naive's block and all_on's sets).
* ``runlocal`` (tests): 2 plans per domain × 2 steps, γ ∈ {2, 4} × τ ∈ {0.7, 1.3}.
"""

import ml_collections

from specjax.configs.common import parse_config_arg, plans_defaults, real_sweep


def defaults() -> ml_collections.ConfigDict:
    c = plans_defaults()  # shared fields, each commented (specjax/configs/common.py)
    c.grid.gamma = [2, 3, 4, 6, 8]  # γ
    c.grid.drafter_temperature = [0.5, 0.7, 1.0, 1.3]  # τ of every drafter
    c.grid.policy = ["naive", "all_on"]  # policy names
    return c


def published(c: ml_collections.ConfigDict) -> None:
    """The size of docs/results/sweep_gamma_temperature.md (`make sweeps`)."""
    c.plans_per_domain = 4
    c.plan_steps = 2


def real(c: ml_collections.ConfigDict) -> None:
    """The real verifier, SmolLM2-135M-Instruct (`make sweeps-real`)."""
    real_sweep(c)  # smollm2, 1 plan per domain × 1 step × ≤ 16 tokens
    c.grid.gamma = [2, 4, 8]


def runlocal(c: ml_collections.ConfigDict) -> None:
    c.plans_per_domain = 2
    c.plan_steps = 2
    c.grid.gamma = [2, 4]
    c.grid.drafter_temperature = [0.7, 1.3]


def get_config(arg=None):
    return parse_config_arg(
        arg, defaults(), {"runlocal": runlocal, "published": published, "real": real}
    )
