"""The seed's table reproduced on the shipped zoo (what `make reproduce` runs).

  python -m specjax.main --config=configs/seed_reproduction.py:runlocal --workdir=runs/seed_reproduction
  python -m specjax.main --config=configs/seed_reproduction.py --workdir=runs/seed_full

The zoo's code, prose and reasoning drafters against its verifier on mixed-domain plans:
the naive deployment, the four invariants on, and the ablation (each invariant removed
alone and added alone). `grid.rule=[default,coupled],grid.verifier_temperature=[1.0]` adds
the coupled rule (consensus by construction at τ > 0). Writes summary.json, seed_report.md and
plots/ beside results.jsonl. `runlocal` runs in a few minutes on a 2-core CPU.
"""
import ml_collections

from specjax.runner.config_args import parse_config_arg

SWITCHES = ("prefix_partitioning", "truncate_and_attribute", "agreement_weighted_consensus",
            "kl_ceiling")


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
    c.seed_table = True               # write summary.json + seed_report.md (the seed's table)
    c.grid = ml_collections.ConfigDict()
    c.grid.policy = (["naive", "all_on"] + [f"all_on_minus_{s}" for s in SWITCHES]
                     + [f"naive_plus_{s}" for s in SWITCHES])  # 10 policies
    c.grid.gamma = [4]                # γ, drafts per chain per round
    c.grid.verifier_temperature = [0.0]  # τ of the verifier (0 = greedy: exact-match consensus)
    c.grid.drafter_temperature = [None]  # None = each drafter's default temperature
    c.grid.pairing = [("code", "prose", "reasoning")]  # the seed's three drafters
    c.grid.rule = ["default"]         # 'default' (switch 2 picks) or 'coupled'
    c.grid.seed = [0]                 # PRNG seed
    return c


def runlocal(c: ml_collections.ConfigDict) -> None:
    c.plans_per_domain = 4


def get_config(arg=None):
    return parse_config_arg(arg, defaults(), {"runlocal": runlocal})
