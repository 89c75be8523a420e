"""The seed's table reproduced on the shipped zoo (what `make reproduce` runs).

  python -m specjax.main --config=configs/seed_reproduction.py:runlocal --workdir=runs/seed_reproduction
  python -m specjax.main --config=configs/seed_reproduction.py --workdir=runs/seed_full

The zoo's code, prose and reasoning drafters against its verifier on mixed-domain plans:
the naive deployment, the four invariants on, and the ablation (each invariant removed
alone and added alone). Writes summary.json, seed_report.md and plots/ beside results.jsonl.

Operating point: the verifier samples at τ = 1 and the drafters at their own temperatures
(code 1.0, prose 1.0, reasoning 1.3) under the coupled rule — drafts and verification share
Gumbel noise, so every branch of a plan yields the verifier's own sample and consensus is
decided by the vote weights alone (switch 2 picks the rule's form: each chain cut at its own
mismatch, or the whole block cut at the first mismatch of any chain). At τ = 0 the tiny
verifier's greedy text degenerates into repetition; `grid.rule=[default],
grid.verifier_temperature=[0.0]` runs that regime.
"""
import ml_collections

from specjax.runner.config_args import parse_config_arg
from specjax.runner.experiments import plans_defaults

SWITCHES = ("prefix_partitioning", "truncate_and_attribute", "agreement_weighted_consensus",
            "kl_ceiling")


def defaults() -> ml_collections.ConfigDict:
    c = plans_defaults()  # shared fields, each commented (specjax/runner/experiments.py)
    c.seed_table = True               # write summary.json + seed_report.md (the seed's table)
    c.grid.policy = (["naive", "all_on"] + [f"all_on_minus_{s}" for s in SWITCHES]
                     + [f"naive_plus_{s}" for s in SWITCHES])  # 10 policies
    return c


def runlocal(c: ml_collections.ConfigDict) -> None:
    c.plans_per_domain = 2


def get_config(arg=None):
    return parse_config_arg(arg, defaults(), {"runlocal": runlocal})
