"""Which invariant matters: all 16 switch combinations on the zoo's three drafters.

  python -m specjax.main --config=configs/ablation_invariants.py:runlocal --workdir=runs/ablation
  python -m specjax.main --config=configs/ablation_invariants.py --workdir=runs/ablation_full

`runlocal` is sized for a CPU (a few minutes); the default for an accelerator slice.
"""

import ml_collections

from specjax.configs.common import parse_config_arg, plans_defaults
from specjax.policy.switches import all_combinations


def defaults() -> ml_collections.ConfigDict:
    c = plans_defaults()  # shared fields, each commented (specjax/configs/common.py)
    c.grid.policy = [p.name for p in all_combinations()]  # the 16 switch combinations
    return c


def runlocal(c: ml_collections.ConfigDict) -> None:
    c.plans_per_domain = 2


def get_config(arg=None):
    return parse_config_arg(arg, defaults(), {"runlocal": runlocal})
