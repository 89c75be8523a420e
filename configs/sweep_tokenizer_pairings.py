"""Joint vs per-drafter acceptance for same- and cross-tokenizer drafter pairings.

python -m specjax.main --config=configs/sweep_tokenizer_pairings.py:runlocal --workdir=runs/pairings
python -m specjax.main --config=configs/sweep_tokenizer_pairings.py --workdir=runs/pairings_full
"""

import ml_collections

from specjax.configs.common import parse_config_arg, plans_defaults


def defaults() -> ml_collections.ConfigDict:
    c = plans_defaults()  # shared fields, each commented (specjax/configs/common.py)
    # code and prose share the verifier's tokenizer; reasoning has its own; prose512 (an
    # extra drafter of the zoo) a third: same-group, cross-group and three-tokenizer pairings.
    c.grid.pairing = [
        ("code",),
        ("prose",),
        ("reasoning",),
        ("prose512",),
        ("code", "prose"),
        ("code", "reasoning"),
        ("prose", "prose512"),
        ("code", "prose512"),
        ("code", "prose", "reasoning"),
        ("code", "reasoning", "prose512"),
    ]
    c.grid.policy = ["naive", "all_on"]  # policy names
    return c


def runlocal(c: ml_collections.ConfigDict) -> None:
    c.plans_per_domain = 2
    c.plan_steps = 2
    c.grid.pairing = [("code", "prose"), ("code", "prose512"), ("code", "reasoning", "prose512")]


def get_config(arg=None):
    return parse_config_arg(arg, defaults(), {"runlocal": runlocal})
