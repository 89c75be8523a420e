"""The `plans` experiment's setup, shared by the experiment (`runner.experiments`) and its
validation (`runner.plans_validation`), which both build a cell the same way: the deployment
a config names (its kind's, `specjax.runner.deployments`: the zoo resolved, loaded and
verified; synthetic; Hugging Face folders; SmolLM2), the plan prompts and their domains, the
decision boundary's thresholds, and a cell's `PlanConfig` and deployment.
"""

from __future__ import annotations

from specjax.engine.gammas import drafter_gammas
from specjax.policy.boundary import BoundaryThresholds
from specjax.policy.plan_config import PlanConfig
from specjax.runner import deployments
from specjax.runner.deployments.zoo import load_zoo_checked, resolve_zoo_path
from specjax.verify import registry

__all__ = [
    "cell_deployment",
    "load_deployment",
    "load_zoo_checked",
    "plan_config",
    "plan_domains",
    "plan_prompts",
    "plan_thresholds",
    "resolve_zoo_path",
]


def load_deployment(config):
    """The full deployment the config names (`deployments.of(config)`: the zoo's seed
    drafters, synthetic's tables, hf's folders, every drafter of smollm2's
    `SMOLLM2_DRAFTERS`)."""
    return deployments.of(config).load(config)


def plan_prompts(config) -> tuple[list[str], list[str]]:
    """(prompts, ids): `plans_per_domain` prompts of each domain, interleaved (mixed plans);
    the kind's own prompts where it has them (synthetic)."""
    return deployments.of(config).plan_prompts(config)


def plan_domains(config, ids) -> list[str]:
    """Each plan's domain (the oracle router needs it; the policies are not told)."""
    return deployments.of(config).plan_domains(config, ids)


def cell_deployment(config, cell, weights: bool = True):
    """The deployment a cell runs: its pairing's drafters at its temperatures and γ_i.
    ``weights=False`` (validation): the kind's outline of it (smollm2: the verifier's, no
    weights read; zoo and synthetic: built as a cell builds it), or None where the kind has
    none (hf: validation loads no model)."""
    dep = deployments.of(config).load(config, cell.get("pairing") or None, weights)
    if dep is None:
        return None
    t = cell.get("drafter_temperature")
    if t is not None:
        dep = dep.with_temperatures([t] * len(dep.drafters))
    g = cell.get("drafter_gamma")
    if g is not None:
        drafter_gammas(int(cell.get("gamma", 4)), g, dep.names, "grid.drafter_gamma")
        dep = dep.with_gammas(list(g))
    return dep


def plan_thresholds(config) -> BoundaryThresholds:
    """The decision boundary's thresholds, from the config's one `boundary` block."""
    b = config.get("boundary") or {}
    return BoundaryThresholds(
        **{
            k: b[k]
            for k in ("truncation_overhead_ratio", "acceptance_floor", "depth_ceiling")
            if k in b
        }
    )


def plan_config(config, cell) -> PlanConfig:
    rule = cell.get("rule")
    return PlanConfig(
        gamma=int(cell.get("gamma", 4)),
        verifier_temperature=float(cell.get("verifier_temperature", 0.0)),
        plan_steps=config.plan_steps,
        max_step_tokens=config.max_step_tokens,
        consensus=config.get("consensus", "seed"),
        consensus_threshold=config.consensus_threshold,
        thresholds=plan_thresholds(config),
        rule=None if rule in (None, registry.DEFAULT_SPELLING) else rule,
        consensus_cost=config.consensus_cost,
        share_verifier_call=bool(config.get("share_verifier_call", True)),
        seed=int(cell.get("seed", 0)),
        bucket=config.bucket,
    )
