"""The project's experiments: parallel plans under a policy, measured against baselines.

One experiment, `plans`, serves every shipped config: a grid cell fixes the policy, γ,
the drafters' and the verifier's temperatures, the tokenizer pairing (which drafters take
part), the rule override and the seed; the cell runs the plan prompts under the policy and
returns the SPEC §7 figures, with ratios to the single-drafter baselines (each drafter of
the pairing alone, rule 1, one branch, no consensus) and to the verifier alone. Baselines
are computed once per (pairing, γ, temperatures, seed) and kept in the workdir.
"""
from __future__ import annotations

import functools
import hashlib
import json
import math
import os
from pathlib import Path
from types import SimpleNamespace

from specjax.errors import ConfigError, check
from specjax.policy.plan import PlanConfig, run_plans
from specjax.policy.summary import summarize
from specjax.policy.switches import Policy
from specjax.runner.registry import register_experiment

# c_i of the seed's deployment: drafter parameters / verifier parameters (1.5B, 3B, 7B vs 70B).
SEED_COSTS = {"code": 1.5 / 70, "prose": 3.0 / 70, "reasoning": 7.0 / 70}
SYNTHETIC_PROMPTS = ["ab", "cda", "b", "dd", "acb", "c", "bad", "da"]


@functools.lru_cache(maxsize=4)
def _zoo(path: str):
    from specjax.models.zoo import load_zoo  # pylint: disable=import-outside-toplevel
    return load_zoo(path)


def load_deployment(config):
    """The full deployment the config names ('zoo' or 'synthetic')."""
    if config.deployment == "zoo":
        return _zoo(config.get("zoo_path")).deployment()
    if config.deployment == "synthetic":
        from specjax.models import synthetic_suite  # pylint: disable=import-outside-toplevel
        dep, _ = synthetic_suite.make_deployment("random", seed=0, fourth=True)
        return dep
    raise ConfigError.invalid("deployment", config.deployment, ["zoo", "synthetic"])


def plan_prompts(config) -> tuple[list[str], list[str]]:
    """(prompts, ids): `plans_per_domain` prompts of each domain, interleaved (mixed plans)."""
    n = int(config.plans_per_domain)
    if config.deployment == "synthetic":
        prompts = (SYNTHETIC_PROMPTS * (3 * n // len(SYNTHETIC_PROMPTS) + 1))[:3 * n]
        return prompts, [f"s{i}" for i in range(len(prompts))]
    from specjax.data import load_prompts  # pylint: disable=import-outside-toplevel
    by_domain = {}
    for p in load_prompts():
        by_domain.setdefault(p["domain"], []).append(p)
    picked = []
    for i in range(n):
        for d in sorted(by_domain):
            if i < len(by_domain[d]):
                picked.append(by_domain[d][i])
    return [p["prompt"] for p in picked], [p["id"] for p in picked]


def validate(config) -> None:
    """Checks every field and grid value the experiment reads (before anything is written)."""
    check(config.deployment in ("zoo", "synthetic"), "deployment", config.deployment,
          ["zoo", "synthetic"])
    check(isinstance(config.plans_per_domain, int) and config.plans_per_domain >= 1,
          "plans_per_domain", config.plans_per_domain, "an integer >= 1")
    grid = config.grid
    for g in grid.get("gamma", [4]):
        check(isinstance(g, int) and not isinstance(g, bool) and g >= 1, "grid.gamma", g,
              "integers >= 1")
    for t in list(grid.get("verifier_temperature", [0.0])):
        check(isinstance(t, (int, float)) and math.isfinite(t) and t >= 0,
              "grid.verifier_temperature", t, "finite numbers >= 0")
    for t in list(grid.get("drafter_temperature", [None])):
        check(t is None or (isinstance(t, (int, float)) and math.isfinite(t) and t >= 0),
              "grid.drafter_temperature", t, "None (each drafter's default) or numbers >= 0")
    for p in list(grid.get("policy", ["all_on"])):
        try:
            Policy.from_name(p) if isinstance(p, str) else Policy(**dict(p))
        except (ConfigError, TypeError, ValueError) as e:
            raise ConfigError.invalid("grid.policy", p, "a policy name (naive, all_on, "
                                      "all_on_minus_<switch>, naive_plus_<switch>, p1t0a1k0)"
                                      ) from e
    for r in list(grid.get("rule", [None])):
        check(r in (None, "coupled", "default"), "grid.rule", r, [None, "default", "coupled"])
    known = {"code", "prose", "reasoning"} if config.deployment == "zoo" else {"d0", "d1", "d2", "d3"}
    for pairing in list(grid.get("pairing", [None])):
        if pairing is None:
            continue
        names = list(pairing)
        check(len(names) >= 1 and len(set(names)) == len(names), "grid.pairing", pairing,
              "non-empty lists of distinct drafter names")
        for n in names:
            check(n in known, "grid.pairing", n, sorted(known))
    PlanConfig(plan_steps=config.plan_steps, max_step_tokens=config.max_step_tokens,
               consensus_threshold=config.consensus_threshold)


def _cell_deployment(config, cell):
    dep = load_deployment(config)
    pairing = cell.get("pairing")
    if pairing:
        dep = dep.subset(list(pairing))
    t = cell.get("drafter_temperature")
    if t is not None:
        dep = dep.with_temperatures([t] * len(dep.drafters))
    return dep


def _plan_config(config, cell) -> PlanConfig:
    rule = cell.get("rule")
    return PlanConfig(gamma=int(cell.get("gamma", 4)),
                      verifier_temperature=float(cell.get("verifier_temperature", 0.0)),
                      plan_steps=config.plan_steps, max_step_tokens=config.max_step_tokens,
                      consensus_threshold=config.consensus_threshold,
                      rule=None if rule in (None, "default") else rule,
                      consensus_cost=config.consensus_cost, seed=int(cell.get("seed", 0)),
                      bucket=config.bucket)


def _light(stats) -> dict:
    return {"tokens": stats.tokens, "cost": stats.cost, "seconds": stats.seconds,
            "verifier_calls": stats.verifier_calls,
            "drafter_tokens": [int(x) for x in stats.drafter_tokens]}


def _baselines(config, cell, dep, pcfg, prompts, workdir: Path):
    key = json.dumps({"pairing": list(dep.names), "gamma": pcfg.gamma,
                      "tv": pcfg.verifier_temperature, "rule": pcfg.rule,
                      "td": [d.temperature for d in dep.drafters], "seed": pcfg.seed},
                     sort_keys=True)
    path = workdir / "baselines" / (hashlib.sha256(key.encode()).hexdigest()[:16] + ".json")
    if path.exists():
        data = json.loads(path.read_text())
    else:
        single = {n: _light(run_plans(dep, pcfg, prompts, single=i)[1])
                  for i, n in enumerate(dep.names)}
        ar_texts, ar_stats = run_plans(dep, pcfg, prompts)
        exact_ref = pcfg.verifier_temperature == 0 or pcfg.rule == "coupled"
        data = {"key": json.loads(key), "single": single, "autoregressive": _light(ar_stats),
                "reference_texts": ar_texts if exact_ref else None}
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data))
        os.replace(tmp, path)
    single = {n: SimpleNamespace(**v) for n, v in data["single"].items()}
    return single, SimpleNamespace(**data["autoregressive"]), data


@register_experiment("plans", validate=validate,
                     finalize=lambda c, w, r: _finalize(c, w, r))
def plans(config, cell: dict, workdir: Path) -> dict:
    """One cell: the plan prompts under the cell's policy, with baselines and SPEC §7 figures."""
    dep = _cell_deployment(config, cell)
    pcfg = _plan_config(config, cell)
    prompts, _ = plan_prompts(config)
    pol = cell.get("policy", "all_on")
    policy = Policy.from_name(pol) if isinstance(pol, str) else Policy(**dict(pol))
    single, ar, base = _baselines(config, cell, dep, pcfg, prompts, Path(workdir))
    texts, stats = run_plans(dep, pcfg, prompts, policy=policy)
    row = summarize(stats, dep.names, single=single, autoregressive=ar)
    ref = base.get("reference_texts")
    if ref is not None:
        # τ = 0: the target is a point mass (the greedy plan), so the exact TV distance is
        # the fraction of plans off it. Coupled rule: the reference is the verifier's own
        # sample with the same noise, and by the coupling inequality the fraction of plans
        # that differ from it bounds TV from above (0 means the policy reproduced the
        # target's sampler plan for plan).
        row["tv_distance"] = sum(a != b for a, b in zip(texts, ref)) / len(ref)
        row["tv_distance_kind"] = "exact" if pcfg.verifier_temperature == 0 else "coupling_bound"
    else:
        row["tv_distance"] = None  # not computable exactly for a neural verifier at τ > 0
        row["tv_distance_kind"] = None
    row["policy"] = policy.name
    row["pairing"] = list(dep.names)
    row["baselines"] = {"single": base["single"], "autoregressive": base["autoregressive"]}
    row["drafter_costs"] = {d.name: d.cost for d in dep.drafters}
    row["drafter_temperatures"] = {d.name: d.temperature for d in dep.drafters}
    return row


def _finalize(config, workdir: Path, results: list[dict]) -> None:
    if config.get("seed_table", False):
        from specjax.runner import seed_table  # pylint: disable=import-outside-toplevel
        seed_table.write(config, Path(workdir), results)


def plans_defaults():
    """The fields every `plans` config shares (each config sets its own grid)."""
    import ml_collections  # pylint: disable=import-outside-toplevel
    c = ml_collections.ConfigDict()
    c.experiment = "plans"            # the registered experiment (specjax/runner/experiments.py)
    c.deployment = "zoo"              # 'zoo' (shipped tiny models) or 'synthetic' (exact tables)
    c.zoo_path = None                 # zoo folder; None: $SPECJAX_ZOO, else the shipped specjax/zoo
    c.plans_per_domain = 24           # plan prompts per domain (code, prose, reasoning), mixed
    c.plan_steps = 4                  # steps per plan
    c.max_step_tokens = 32            # token budget of one step
    c.consensus_threshold = 0.5       # support needed to commit without fallback
    c.consensus_cost = 1.0            # modelled cost of a consensus round (verifier calls)
    c.bucket = 64                     # prompt widths rounded up to a multiple (no retrace)
    c.report = True                   # write report.md and plots/ after the cells
    c.seed_table = False              # also write the seed's table (seed_reproduction only)
    c.grid = ml_collections.ConfigDict()
    c.grid.gamma = [4]                # γ, drafts per chain per round
    c.grid.verifier_temperature = [1.0]  # τ of the verifier (0 = greedy)
    c.grid.rule = ["coupled"]         # 'coupled': branches share Gumbel noise, so they agree
    #                                   and the committed step is the verifier's own sample;
    #                                   'default': independent noise, switch 2 picks the rule
    c.grid.drafter_temperature = [None]  # None = each drafter's default (code 1.0, prose 1.0, reasoning 1.3)
    c.grid.pairing = [("code", "prose", "reasoning")]  # which drafters take part
    c.grid.seed = [0]                 # PRNG seed
    return c
