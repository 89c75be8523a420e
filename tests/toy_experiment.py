"""A toy experiment for the runner's tests: fast, deterministic, every SPEC §7 column.

Its numbers are a caricature of the seed's story (naive joint acceptance ≈ the product of
the drafters' acceptances, agreement-weighted invariants ≈ 0.5), produced from the cell's
values and a seeded RNG — no model is run. ``config.sleep_s`` makes each cell slow.

Two environment variables let the CLI tests synchronise with a sweep deterministically
(no sleeps, no kill windows); they are not part of the config, so a resumed sweep's config
is the same:

* ``SPECJAX_TOY_KILL_AT=n`` — the process kills itself (SIGKILL: no cleanup runs) when it
  is about to run its n-th cell, so exactly n - 1 cells are recorded;
* ``SPECJAX_TOY_GATE=path`` — the first cell creates ``path.started`` and waits until
  ``path`` exists, so a test knows the sweep holds its workdir's lock.
"""

from __future__ import annotations

import json
import math
import os
import random
import signal
import time
from pathlib import Path

from specjax.errors import check
from specjax.runner.registry import register_experiment

BASE_ACCEPTANCE = {"code": 0.68, "prose": 0.61, "reasoning": 0.54}


def validate(config) -> None:
    gammas = list(config.grid.get("gamma", [1]))
    check(
        all(isinstance(g, int) and not isinstance(g, bool) and g >= 1 for g in gammas),
        "grid.gamma",
        gammas,
        "integers >= 1",
    )
    check(config.sleep_s >= 0, "sleep_s", config.sleep_s, "a number >= 0")


def finalize(config, workdir: Path, results: list[dict]) -> None:
    by_policy: dict[str, list[float]] = {}
    for r in results:
        by_policy.setdefault(r["policy"], []).append(r["joint_acceptance"])
    summary = {
        "cells": len(results),
        "joint_acceptance_by_policy": {k: sum(v) / len(v) for k, v in by_policy.items()},
    }
    (Path(workdir) / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")


_CALLS = [0]


def _test_hooks() -> None:
    _CALLS[0] += 1
    kill_at = os.environ.get("SPECJAX_TOY_KILL_AT")
    if kill_at and _CALLS[0] == int(kill_at):
        os.kill(os.getpid(), signal.SIGKILL)
    gate = os.environ.get("SPECJAX_TOY_GATE")
    if gate and _CALLS[0] == 1:
        Path(gate + ".started").touch()
        while not Path(gate).exists():  # waiting for an event, not for a time
            time.sleep(0.01)


@register_experiment("toy", validate=validate, finalize=finalize)
def toy(config, cell: dict, workdir: Path) -> dict:
    del workdir
    _test_hooks()
    time.sleep(config.sleep_s)
    rng = random.Random(cell["cell_id"])
    gamma = cell.get("gamma", 4)
    tau_d = cell.get("drafter_temperature", 1.0)
    pairing = cell.get("pairing", ["code"])
    policy = cell.get("policy", "naive")
    if isinstance(policy, dict):
        policy = policy.get("name", "custom")
    noise = lambda s: rng.uniform(-s, s)  # pylint: disable=unnecessary-lambda-assignment
    acceptance = {
        d: round(
            min(0.99, BASE_ACCEPTANCE[d] * 0.98 ** (gamma - 1) * (1.1 - 0.2 * tau_d) + noise(0.02)),
            4,
        )
        for d in pairing
    }
    alphas = list(acceptance.values())
    naive = policy == "naive"
    if len(alphas) == 1:
        joint = alphas[0]
    elif naive:
        joint = math.prod(alphas)
    else:
        joint = 0.85 * sum(alphas) / len(alphas)
    independent = sum(alphas) / len(alphas)
    kl_max = 0.12 * (len(alphas) - 1) + 0.15 * tau_d + abs(noise(0.05))
    depth = gamma * (1 - joint) * (1.2 if naive else 0.5)
    single = 1.0 if len(alphas) == 1 else (0.4 if naive else 1.7) + noise(0.1)
    return {
        "policy": policy,
        "acceptance": acceptance,
        "joint_acceptance": round(joint, 4),
        "consensus_fallback_rate": round((0.8 if naive else 0.14) + noise(0.05), 4),
        "kl_max": round(kl_max, 4),
        "kl_mean": round(0.6 * kl_max, 4),
        "mean_truncation_depth": round(depth, 4),
        "shared_prefix_acceptance": round(joint, 4),
        "independent_branch_acceptance": round(independent, 4),
        "throughput_ratio_vs_single": round(single, 4),
        "wallclock_ratio_vs_single": round(0.8 * single, 4),
        "tv_distance": round(abs(noise(0.01)), 5),
        "mean_accepted_length": round((1 - joint ** (gamma + 1)) / (1 - joint), 4),
    }
