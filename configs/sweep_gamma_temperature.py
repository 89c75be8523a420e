"""Acceptance and throughput against γ and temperature, naive vs all invariants on.

  python -m specjax.main --config=configs/sweep_gamma_temperature.py:runlocal --workdir=runs/gamma_temp
  python -m specjax.main --config=configs/sweep_gamma_temperature.py --workdir=runs/gamma_temp_full
"""
import ml_collections

from specjax.runner.config_args import parse_config_arg


def defaults() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.experiment = "plans"            # the registered experiment (specjax/runner/experiments.py)
    c.deployment = "zoo"              # 'zoo' (shipped tiny models) or 'synthetic' (exact tables)
    c.zoo_path = "zoo"                # where the zoo's manifest lives
    c.plans_per_domain = 24           # plan prompts per domain, mixed
    c.plan_steps = 4                  # steps per plan
    c.max_step_tokens = 32            # token budget of one step
    c.consensus_threshold = 0.5       # support needed to commit without fallback
    c.consensus_cost = 1.0            # modelled cost of a consensus round (verifier calls)
    c.bucket = 64                     # prompt widths rounded up to a multiple (no retrace)
    c.report = True                   # write report.md and plots/ after the cells
    c.seed_table = False              # the seed's table is seed_reproduction's
    c.grid = ml_collections.ConfigDict()
    c.grid.gamma = [1, 2, 3, 4, 6, 8]           # γ
    c.grid.drafter_temperature = [0.5, 1.0, 1.5]  # τ of every drafter
    c.grid.verifier_temperature = [0.0]         # τ of the verifier
    c.grid.pairing = [("code", "prose", "reasoning")]
    c.grid.policy = ["naive", "all_on"]         # policy names
    c.grid.seed = [0]                           # PRNG seed
    return c


def runlocal(c: ml_collections.ConfigDict) -> None:
    c.plans_per_domain = 2
    c.plan_steps = 2
    c.grid.gamma = [2, 4]
    c.grid.drafter_temperature = [0.7, 1.3]


def get_config(arg=None):
    return parse_config_arg(arg, defaults(), {"runlocal": runlocal})
