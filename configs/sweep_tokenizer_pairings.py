"""Joint vs per-drafter acceptance for same- and cross-tokenizer drafter pairings.

  python -m specjax.main --config=configs/sweep_tokenizer_pairings.py:runlocal --workdir=runs/pairings
  python -m specjax.main --config=configs/sweep_tokenizer_pairings.py --workdir=runs/pairings_full
"""
import ml_collections

from specjax.runner.config_args import parse_config_arg
from specjax.runner.experiments import plans_defaults


def defaults() -> ml_collections.ConfigDict:
    c = plans_defaults()  # shared fields, each commented (specjax/runner/experiments.py)
    # code shares the verifier's tokenizer; prose and reasoning each have their own.
    c.grid.pairing = [("code",), ("prose",), ("reasoning",), ("code", "prose"),
                      ("code", "reasoning"), ("prose", "reasoning"),
                      ("code", "prose", "reasoning")]
    c.grid.policy = ["naive", "all_on"]         # policy names
    return c


def runlocal(c: ml_collections.ConfigDict) -> None:
    c.plans_per_domain = 2
    c.plan_steps = 2
    c.grid.pairing = [("code", "prose"), ("prose", "reasoning"), ("code", "prose", "reasoning")]


def get_config(arg=None):
    return parse_config_arg(arg, defaults(), {"runlocal": runlocal})
