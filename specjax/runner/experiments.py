"""The project's experiments: parallel plans under a policy, measured against baselines.

One experiment, `plans`, serves every shipped config: a grid cell fixes the policy, γ,
the drafters' and the verifier's temperatures, the tokenizer pairing (which drafters take
part), the rule override and the seed; the cell runs the plan prompts under the policy and
returns the SPEC §7 figures, with ratios to the single-drafter baselines (each drafter of
the pairing alone, rule 1, one branch, no consensus) and to the verifier alone. Baselines
are computed once per (pairing, γ, temperatures, seed) and kept in the workdir.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

from specjax import metrics
from specjax.engine.gammas import drafter_gammas, widest_gamma
from specjax.errors import ConfigError
from specjax.field_report import FIELD_REPORT_COSTS
from specjax.measure.prices import measure_prices
from specjax.policy import names as policy_names
from specjax.policy.auto import AutoRouter
from specjax.policy.engine_calls import enable_shared_calls
from specjax.policy.plan import run_plans
from specjax.policy.summary import plan_totals, summarize
from specjax.policy.switches import Policy
from specjax.runner.plans_setup import (
    cell_deployment,
    load_deployment,
    load_zoo_checked,
    plan_config,
    plan_domains,
    plan_prompts,
    plan_thresholds,
    resolve_zoo_path,
)
from specjax.runner.registry import register_experiment

#: The experiment and, from `plans_setup` (where they live), the setup it shares with its
#: validation, importable from here as before.
__all__ = [
    "AUTO_GAMMAS",
    "auto_gamma_candidates",
    "load_deployment",
    "load_zoo_checked",
    "oracle_drafters",
    "plan_domains",
    "plan_prompts",
    "plan_thresholds",
    "plans",
    "resolve_zoo_path",
    "validate",
]


def validate(config) -> dict | None:
    """Checks every field, grid value and cell the experiment reads, before anything is
    written (`specjax.runner.plans_validation`: sizes bounded, duplicate spellings refused,
    each cell's drafters, oracle domains and context budget as the cell will run).

    For the zoo deployment the zoo is loaded and verified here (manifest, sha256 of every
    file, shapes), so a bad zoo is refused before the workdir is touched.

    Returns:
      The run's inputs besides the config (`specjax.runner.registry`): for the zoo, its
      folder, where the folder came from, and the sha256 of its manifest; else None.
    """
    from specjax.runner import plans_validation  # pylint: disable=import-outside-toplevel

    return plans_validation.validate(config)


def _costs(dep):
    costs = [d.cost for d in dep.drafters]
    seed = [FIELD_REPORT_COSTS.get(n) for n in dep.names]
    return costs, (None if any(c is None for c in seed) else seed)


def _regime(dep, priced: dict, gamma: int) -> dict | None:
    """T_score(γ+1) and T_step of the verifier at the padded rows and cache of the cell's
    most frequent verifier call (its rounds), measured now like every machine price: the
    ratio says whether the cell's rounds were memory-bound (≈ 1) or compute-bound."""
    calls = {}
    for key, n in priced.items():
        kind, _, width, rows, cap = metrics.parse_price_key(key)
        if kind == "verify" and width > 1:
            calls[(rows, cap)] = calls.get((rows, cap), 0.0) + float(np.sum(n))
    if not calls:
        return None
    rows, cap = max(calls, key=calls.get)
    step = metrics.price_key("verify", "verifier", 1, rows, cap)
    score = metrics.price_key("verify", "verifier", gamma + 1, rows, cap)
    got = measure_prices(dep, [step, score])
    return {
        "rows": rows,
        "capacity": cap,
        "gamma": gamma,
        "t_step": got[step],
        "t_score": got[score],
    }


def _baselines(config, cell, dep, pcfg, prompts, workdir: Path):
    """Per-plan totals of each single drafter and of the verifier alone (cached on disk)."""
    costs, seed_costs = _costs(dep)
    key = json.dumps(
        {
            "v": 5,  # 5: per-plan priced counts (n:<item>); 4: warm programs only
            "pairing": list(dep.names),
            "gamma": pcfg.gamma,
            "tv": pcfg.verifier_temperature,
            "rule": pcfg.rule,
            "td": [d.temperature for d in dep.drafters],
            "seed": pcfg.seed,
            "steps": pcfg.plan_steps,
            "max_step_tokens": pcfg.max_step_tokens,
            "costs": costs,
            "consensus_cost": pcfg.consensus_cost,
            "prompts": hashlib.sha256(json.dumps(prompts).encode()).hexdigest(),
        },
        sort_keys=True,
    )
    path = workdir / "baselines" / (hashlib.sha256(key.encode()).hexdigest()[:16] + ".json")
    cached = _read_cached(path, json.loads(key))
    if cached is not None:
        return cached
    totals = lambda st: plan_totals(st.counts, costs, seed_costs, pcfg.consensus_cost)
    single = {}
    for i, n in enumerate(dep.names):
        _, st = run_plans(dep, pcfg, prompts, single=i)
        single[n] = totals(st)
        single[n]["per_drafter_alpha"] = summarize(st, dep.names, costs)["per_drafter_alpha"]
    ar_texts, ar_stats = run_plans(dep, pcfg, prompts)
    exact_ref = pcfg.verifier_temperature == 0 or pcfg.coupled
    data = {
        "key": json.loads(key),
        "single": single,
        "autoregressive": totals(ar_stats),
        "reference_texts": ar_texts if exact_ref else None,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    from specjax.runner import results  # pylint: disable=import-outside-toplevel

    results.atomic_write_text(path, json.dumps(data))
    return data


def _read_cached(path: Path, key: dict) -> dict | None:
    """A cached baselines file, or None when it is missing, unreadable or of another key
    (a damaged cache is recomputed, never a cell's error)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return None
    ok = (
        isinstance(data, dict)
        and data.get("key") == key
        and isinstance(data.get("single"), dict)
        and isinstance(data.get("autoregressive"), dict)
    )
    return data if ok else None


def oracle_drafters(dep, domains) -> list[int]:
    """The oracle router's drafter per plan: the drafter named after the plan's domain."""
    out = []
    for d in domains:
        if d not in dep.names:
            raise ConfigError(
                f"grid.policy: got 'oracle', but the pairing {list(dep.names)} has "
                f"no drafter for the domain {d!r}; allowed: a pairing with a "
                "drafter named after every plan domain"
            )
        out.append(dep.names.index(d))
    return out


@register_experiment("plans", validate=validate, finalize=lambda c, w, r: _finalize(c, w, r))
def plans(config, cell: dict, workdir: Path) -> dict:
    """One cell: the plan prompts under the cell's policy, with baselines and SPEC §7 figures.

    The KL check on a prefix, identical across the run's cells, is computed once per process
    (`specjax.policy.engine_calls.shared_calls`); each cell is charged its measured seconds.
    Engine calls continue each plan's carried state (`specjax.policy.plan_state`) and run per
    cell.
    """
    enable_shared_calls()
    dep = cell_deployment(config, cell)
    pcfg = plan_config(config, cell)
    prompts, ids = plan_prompts(config)
    policy = policy_names.parse(cell.get("policy", "all_on"))
    costs, seed_costs = _costs(dep)
    base = _baselines(config, cell, dep, pcfg, prompts, Path(workdir))
    with_prices = bool(config.get("machine_prices", True))
    texts, stats, router = _run_policy(config, dep, pcfg, prompts, ids, policy, costs, with_prices)
    name = policy_names.canonical_name(policy)
    # Machine prices of every forward shape the cell ran, measured now, in this process
    # (cached per process: a shape measured for an earlier cell is not measured again).
    prices = measure_prices(dep, stats.priced) if with_prices else None
    row = summarize(
        stats,
        dep.names,
        costs,
        seed_costs=seed_costs,
        consensus_cost=pcfg.consensus_cost,
        consensus=pcfg.consensus,
        consensus_threshold=pcfg.consensus_threshold,
        thresholds=pcfg.thresholds,
        single=base["single"],
        autoregressive=base["autoregressive"],
        prices=prices,
    )
    if prices is not None:
        row["machine_prices"] = (
            prices  # price key → seconds of one forward (specjax.measure.prices)
        )
        row["regime"] = _regime(dep, stats.priced, pcfg.gamma)
    row.update(_tv_distance(texts, base.get("reference_texts"), pcfg))
    row.update(_cell_record(name, policy, pcfg, ids, dep, base, stats, router))
    return row


def _run_policy(config, dep, pcfg, prompts, ids, policy, costs, with_prices) -> tuple:
    """The cell's plans under ``policy``: a switch policy's parallel branches, the adaptive
    `auto` router (``auto:<score>`` pins its score, plain ``auto`` takes the run's
    ``auto_score``), the oracle router, one drafter alone or a fixed drafter set; (texts,
    RunStats, the router or None)."""
    router = None
    score = policy_names.auto_score(policy, config.get("auto_score", "own"))
    if isinstance(policy, Policy):
        texts, stats = run_plans(dep, pcfg, prompts, policy=policy)
    elif score is not None:
        own = [d.gamma for d in dep.drafters]
        router = AutoRouter(
            costs,
            pcfg.gamma,
            seed=pcfg.seed,
            # Teacher-forced scores see every drafter every step: no exploration needed.
            explore=float(config.get("auto_explore", 0.15)) if score == "own" else 0.0,
            gammas=own,
            gamma_candidates=auto_gamma_candidates(config, pcfg.gamma, own),
            names=dep.names,
            measure=(lambda keys: measure_prices(dep, keys)) if with_prices else None,
            score=score,
        )
        texts, stats = run_plans(dep, pcfg, prompts, router=router)
    elif policy == "oracle":
        texts, stats = run_plans(
            dep, pcfg, prompts, single=oracle_drafters(dep, plan_domains(config, ids))
        )
    elif policy_names.set_drafters(policy) is not None:
        members = tuple(dep.names.index(n) for n in policy_names.set_drafters(policy))
        texts, stats = run_plans(dep, pcfg, prompts, single=[members] * len(prompts))
    else:  # single:<drafter>
        texts, stats = run_plans(
            dep, pcfg, prompts, single=dep.names.index(policy_names.single_drafter(policy))
        )
    return texts, stats, router


def _tv_distance(texts, ref, pcfg) -> dict:
    """The row's TV distance to the target and its kind, against the reference plans
    ``ref`` (None where no reference was computed)."""
    if ref is not None:
        # τ = 0: the target is a point mass (the greedy plan), so the exact TV distance is
        # the fraction of plans off it. Coupled rule: the reference is the verifier's own
        # sample with the same noise, and by the coupling inequality the fraction of plans
        # that differ from it bounds TV from above (0: the policy reproduced the target's
        # sampler plan for plan).
        return {
            "tv_distance": sum(a != b for a, b in zip(texts, ref)) / len(ref),
            "tv_distance_kind": "exact" if pcfg.verifier_temperature == 0 else "coupling_bound",
        }
    # Not computable exactly for a neural verifier at τ > 0.
    return {"tv_distance": None, "tv_distance_kind": None}


def _cell_record(name, policy, pcfg, ids, dep, base, stats, router) -> dict:
    """What the cell ran with and what it recorded, so every report reads it from the row
    (not from defaults)."""
    row = {}
    row["policy"] = name
    row["kl_ceiling"] = policy.kl_ceiling if isinstance(policy, Policy) else None
    row["thresholds"] = pcfg.thresholds.kwargs()
    row["plan_ids"] = list(ids)
    row["pairing"] = list(dep.names)
    row["baselines"] = {"single": base["single"], "autoregressive": base["autoregressive"]}
    row["drafter_costs"] = {d.name: d.cost for d in dep.drafters}
    row["drafter_temperatures"] = {d.name: d.temperature for d in dep.drafters}
    row["drafter_gammas"] = dict(
        zip(dep.names, drafter_gammas(pcfg.gamma, [d.gamma for d in dep.drafters]))
    )
    row["branch_records"] = stats.branch_records
    row["step_records"] = stats.step_records
    if stats.routes:
        row["routes"] = stats.routes
    if stats.gamma_routes:
        row["gamma_routes"] = [{str(p): g for p, g in r.items()} for r in stats.gamma_routes]
    if router is not None and router.prices is not None:
        row["auto_machine_prices"] = router.prices  # what auto chose by (specjax.measure.prices)
    if router is not None and getattr(router, "batch_log", None):
        row["auto_batches"] = router.batch_log  # per step: calls before and after pricing
    return row


#: The γ a lone drafter may run at under `auto` unless the config's `auto_gammas` says
#: otherwise; those above the run's widest γ are left out (they would resize the state).
AUTO_GAMMAS = (2, 4, 6, 8)


def auto_gamma_candidates(config, gamma: int, own) -> tuple[int, ...]:
    """`auto`'s γ candidates for a lone drafter in one cell: the config's ``auto_gammas``
    (else `AUTO_GAMMAS`), those above the cell's widest γ left out — a γ grid such as
    [1, 4] runs `auto` at γ 1 (drafter choice alone) and at γ 4 (drafter and γ) from one
    list; each drafter's own γ_i is a candidate anyway."""
    widest = widest_gamma(gamma, own)
    given = config.get("auto_gammas") or AUTO_GAMMAS
    return tuple(g for g in given if g <= widest)


def _finalize(config, workdir: Path, results: list[dict]) -> None:
    if config.get("seed_table", False):
        from specjax.runner import seed_table  # pylint: disable=import-outside-toplevel

        seed_table.write(config, Path(workdir), results)
