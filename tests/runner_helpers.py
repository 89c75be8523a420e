"""Shared by the sweep-machinery tests (test_runner, test_runner_sweeps): the toy
experiment and its config, tests/configs/toy.py."""

from __future__ import annotations

from pathlib import Path

import ml_collections

from specjax.runner import registry

TESTS = Path(__file__).resolve().parent
TOY_CONFIG = TESTS / "configs" / "toy.py"
# The module the toy config names in `experiment_module` (imported once, by path).
toy_experiment = registry.import_experiment_module(str(TESTS / "toy_experiment.py"))


def load_toy_config(arg: str | None = None) -> ml_collections.ConfigDict:
    """tests/configs/toy.py's get_config(arg), as `--config=...:arg` would call it."""
    import importlib.util  # pylint: disable=import-outside-toplevel

    spec = importlib.util.spec_from_file_location("toy_config", TOY_CONFIG)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config(arg)
