"""Acceptance and throughput against γ and temperature, naive vs all invariants on.

python -m specjax.main --config=configs/sweep_gamma_temperature.py:runlocal --workdir=runs/gamma_temp
python -m specjax.main --config=configs/sweep_gamma_temperature.py --workdir=runs/gamma_temp_full
"""

import ml_collections

from specjax.configs.common import parse_config_arg, plans_defaults


def defaults() -> ml_collections.ConfigDict:
    c = plans_defaults()  # shared fields, each commented (specjax/configs/common.py)
    c.grid.gamma = [1, 2, 3, 4, 6, 8]  # γ
    c.grid.drafter_temperature = [0.5, 1.0, 1.5]  # τ of every drafter
    c.grid.policy = ["naive", "all_on"]  # policy names
    return c


def runlocal(c: ml_collections.ConfigDict) -> None:
    c.plans_per_domain = 2
    c.plan_steps = 2
    c.grid.gamma = [2, 4]
    c.grid.drafter_temperature = [0.7, 1.3]


def get_config(arg=None):
    return parse_config_arg(arg, defaults(), {"runlocal": runlocal})
