"""The runner tests' toy sweep (no model is run; see tests/toy_experiment.py).

  python -m specjax.main --config=tests/configs/toy.py:runlocal --workdir=/tmp/toy
  python -m specjax.main --config=tests/configs/toy.py:runlocal,sleep_s=0.5,grid.gamma=[1,2,3] \
      --workdir=/tmp/toy_slow
"""

from pathlib import Path

import ml_collections

from specjax.configs.common import parse_config_arg


def defaults() -> ml_collections.ConfigDict:
    config = ml_collections.ConfigDict()
    config.experiment = "toy"  # the registered experiment run on every cell
    # Registers "toy"; a path, so that the sweep runs from any working directory.
    config.experiment_module = str(Path(__file__).resolve().parent.parent / "toy_experiment.py")
    config.sleep_s = 0.0  # seconds each cell sleeps (lets a test kill the sweep partway)
    config.report = True  # write report.md and plots/ after the cells

    config.grid = ml_collections.ConfigDict()  # the sweep: axis -> values
    config.grid.gamma = [1, 2, 4]  # drafts per round (γ)
    config.grid.drafter_temperature = [0.5, 1.0]  # τ of every drafter
    config.grid.verifier_temperature = [1.0]  # τ of the verifier
    config.grid.pairing = [("code",), ("code", "prose"), ("code", "prose", "reasoning")]
    config.grid.policy = ["naive", "all_on"]  # policy names (or switch dicts)
    config.grid.seed = [0]  # PRNG seed
    return config


def runlocal(config: ml_collections.ConfigDict) -> None:
    """8 cells."""
    config.grid.gamma = [1, 2]
    config.grid.pairing = [("code", "prose")]


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    return parse_config_arg(arg, defaults(), {"runlocal": runlocal})
