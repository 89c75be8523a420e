"""Which invariant matters: all 16 switch combinations on the zoo's three drafters.

  python -m specjax.main --config=configs/ablation_invariants.py:runlocal --workdir=runs/ablation
  python -m specjax.main --config=configs/ablation_invariants.py --workdir=runs/ablation_full

`runlocal` is sized for a CPU (a few minutes); the default for an accelerator slice.
"""
import ml_collections

from specjax.policy.switches import all_combinations
from specjax.runner.config_args import parse_config_arg


def defaults() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.experiment = "plans"            # the registered experiment (specjax/runner/experiments.py)
    c.deployment = "zoo"              # 'zoo' (shipped tiny models) or 'synthetic' (exact tables)
    c.zoo_path = "zoo"                # where the zoo's manifest lives
    c.plans_per_domain = 24           # plan prompts per domain (code, prose, reasoning), mixed
    c.plan_steps = 4                  # steps per plan
    c.max_step_tokens = 32            # token budget of one step
    c.consensus_threshold = 0.5       # support needed to commit without fallback
    c.consensus_cost = 1.0            # modelled cost of a consensus round (verifier calls)
    c.bucket = 64                     # prompt widths rounded up to a multiple (no retrace)
    c.report = True                   # write report.md and plots/ after the cells
    c.seed_table = False              # also write the seed's table (seed_reproduction only)
    c.grid = ml_collections.ConfigDict()
    c.grid.policy = [p.name for p in all_combinations()]  # the 16 switch combinations
    c.grid.gamma = [4]                # γ, drafts per chain per round
    c.grid.verifier_temperature = [0.0]  # τ of the verifier (0 = greedy: exact-match consensus)
    c.grid.drafter_temperature = [None]  # None = each drafter's default (code 1.0, prose 1.0, reasoning 1.3)
    c.grid.pairing = [("code", "prose", "reasoning")]  # which drafters take part
    c.grid.seed = [0]                 # PRNG seed
    return c


def runlocal(c: ml_collections.ConfigDict) -> None:
    c.plans_per_domain = 4


def get_config(arg=None):
    return parse_config_arg(arg, defaults(), {"runlocal": runlocal})
