"""The `plans` experiment's setup, shared by the experiment (`runner.experiments`) and its
validation (`runner.plans_validation`), which both build a cell the same way: the deployment
a config names (its kind's, `specjax.runner.deployments`: the zoo resolved, loaded and
verified; synthetic; Hugging Face folders; SmolLM2), the plan prompts and their domains, the
decision boundary's thresholds, and a cell's `PlanConfig` and deployment.
"""

from __future__ import annotations

from specjax.data.shipped import PROMPT_DOMAINS, load_prompts
from specjax.engine.gammas import drafter_gammas
from specjax.errors import ConfigError
from specjax.policy.boundary import BoundaryThresholds
from specjax.policy.plan_config import PlanConfig
from specjax.runner import deployments
from specjax.runner.deployments.kind import DeploymentKind
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
    "prompt_domains",
    "resolve_zoo_path",
]


def load_deployment(config):
    """The full deployment the config names (`deployments.of(config)`: the zoo's seed
    drafters, synthetic's tables, hf's folders, every drafter of smollm2's
    `SMOLLM2_DRAFTERS`)."""
    return deployments.of(config).load(config)


def prompt_domains(config) -> tuple[str, ...] | None:
    """The config's ``prompt_domains`` (the shipped prompt sets its plans mix, each once, of
    `specjax.data.shipped.PROMPT_DOMAINS`, e.g. the three domains and ``edit``), checked;
    None where it is empty or absent: the kind's own prompts (the three domains)."""
    given = config.get("prompt_domains") or ()
    allowed = f"() or a list of distinct prompt sets of {', '.join(PROMPT_DOMAINS)}"
    if isinstance(given, (str, bytes)) or not hasattr(given, "__iter__"):
        raise ConfigError.invalid("prompt_domains", given, allowed)
    domains = tuple(given)
    if not domains:
        return None
    if len(set(domains)) != len(domains) or not set(domains) <= set(PROMPT_DOMAINS):
        raise ConfigError.invalid("prompt_domains", list(domains), allowed)
    kind = deployments.of(config)
    if type(kind).plan_prompts is not DeploymentKind.plan_prompts:
        raise ConfigError.invalid(
            "prompt_domains",
            list(domains),
            f"() with deployment {kind.name!r} (its own prompts); a list with a deployment "
            "that reads the shipped prompts",
        )
    return domains


def plan_prompts(config) -> tuple[list[str], list[str]]:
    """(prompts, ids): `plans_per_domain` prompts of each domain, interleaved (mixed plans);
    the kind's own prompts where it has them (synthetic). With ``prompt_domains``: those
    shipped prompt sets', interleaved the same way (domains in sorted order)."""
    domains = prompt_domains(config)
    if domains is None:
        return deployments.of(config).plan_prompts(config)
    n = int(config.plans_per_domain)
    by_domain: dict[str, list[dict]] = {}
    for p in load_prompts(domains):
        by_domain.setdefault(p["domain"], []).append(p)
    picked = [by_domain[d][i] for i in range(n) for d in sorted(by_domain) if i < len(by_domain[d])]
    return [p["prompt"] for p in picked], [p["id"] for p in picked]


def plan_domains(config, ids) -> list[str]:
    """Each plan's domain (the oracle router needs it; the policies are not told)."""
    domains = prompt_domains(config)
    if domains is None:
        return deployments.of(config).plan_domains(config, ids)
    dom = {p["id"]: p["domain"] for p in load_prompts(domains)}
    return [dom[i] for i in ids]


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
