"""The `plans` experiment's setup, shared by the experiment (`runner.experiments`) and its
validation (`runner.plans_validation`), which both build a cell the same way: the deployment
a config names (the zoo resolved, loaded and verified; synthetic; Hugging Face folders;
SmolLM2), the plan prompts and their domains, the decision boundary's thresholds, and a
cell's `PlanConfig` and deployment.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

from specjax.engine.gammas import drafter_gammas
from specjax.errors import ConfigError, env_value, user_path
from specjax.policy.boundary import BoundaryThresholds
from specjax.policy.plan_config import PlanConfig
from specjax.verify import registry

SYNTHETIC_PROMPTS = ["ab", "cda", "b", "dd", "acb", "c", "bad", "da"]
#: The deployments a `plans` config may name (`load_deployment`).
DEPLOYMENTS = ("zoo", "synthetic", "hf", "smollm2")


@functools.lru_cache(maxsize=4)
def _zoo(path: str):
    """The zoo with every drafter it ships (the seed's, and extras such as `prose512`)."""
    from specjax.models.zoo import load_zoo, read_manifest  # pylint: disable=import-outside-toplevel

    _, manifest = read_manifest(path)
    extra = [n for n in manifest.get("extra_drafters", []) if n not in manifest["drafter_order"]]
    return load_zoo(path, names=list(manifest["drafter_order"]) + extra)


@functools.lru_cache(maxsize=16)
def _zoo_deployment(path: str, names: tuple[str, ...]):
    from specjax.engine.deployment import from_zoo  # pylint: disable=import-outside-toplevel

    return from_zoo(_zoo(path), list(names))


def resolve_zoo_path(config) -> tuple[Path, str]:
    """(absolute zoo folder, where it came from), by one precedence (README):

    1. ``config.zoo_path`` when set (``--config.zoo_path=...``; relative to the working
       directory) — ``"zoo_path"``;
    2. else ``$SPECJAX_ZOO`` when set and non-empty — ``"SPECJAX_ZOO"``;
    3. else the zoo shipped inside the package, ``specjax/zoo`` — ``"shipped"``.
    """
    from specjax.models import zoo as zoo_lib  # pylint: disable=import-outside-toplevel

    explicit = config.get("zoo_path")
    if explicit is not None:
        return user_path(str(explicit), "zoo_path", "a zoo folder").absolute(), "zoo_path"
    env = env_value("SPECJAX_ZOO")  # a file, ~nosuchuser: named as the variable's error
    if env is not None:
        return env.absolute(), "SPECJAX_ZOO"
    return zoo_lib.SHIPPED_ZOO, "shipped"


def load_zoo_checked(config):
    """The zoo the config resolves to, loaded and verified; (zoo, its `inputs` record).

    Raises:
      ConfigError: one line naming the field or variable that chose the folder, the
        folder, and what is wrong with it (missing, manifest, sha256, shapes, ...).
    """
    from specjax.models import zoo as zoo_lib  # pylint: disable=import-outside-toplevel

    path, source = resolve_zoo_path(config)
    given = {"zoo_path": config.get("zoo_path"), "SPECJAX_ZOO": os.environ.get("SPECJAX_ZOO")}.get(
        source, str(path)
    )
    try:
        zoo = _zoo(str(path))
        manifest_sha = zoo_lib.file_sha256(path / zoo_lib.MANIFEST)
    except ConfigError as e:
        raise ConfigError(
            f"{source}: got {str(given)!r} (zoo folder {path}), allowed: a zoo "
            f"folder that loads and verifies; {e}",
            field=source,
            value=given,
            allowed="a zoo folder",
        ) from None
    except OSError as e:
        raise ConfigError(
            f"{source}: got {str(given)!r} (zoo folder {path}), allowed: a "
            f"readable zoo folder; {e.strerror or e}",
            field=source,
            value=given,
            allowed="a zoo folder",
        ) from None
    except (ValueError, TypeError, KeyError, IndexError, AttributeError) as e:
        # Whatever else a damaged zoo trips in the loaders: still one line naming it.
        raise ConfigError(
            f"{source}: got {str(given)!r} (zoo folder {path}), allowed: a zoo "
            f"folder that loads and verifies; {type(e).__name__}: "
            f"{' '.join(str(e).split())[:300]}",
            field=source,
            value=given,
            allowed="a zoo folder",
        ) from None
    return zoo, {"zoo": {"path": str(path), "source": source, "manifest_sha256": manifest_sha}}


def load_deployment(config):
    """The full deployment the config names: 'zoo' (its seed drafters), 'synthetic', 'hf'
    or 'smollm2' (every drafter of `SMOLLM2_DRAFTERS`)."""
    if config.deployment == "zoo":
        zoo = load_zoo_checked(config)[0]
        return _zoo_deployment(
            str(resolve_zoo_path(config)[0]), tuple(zoo.manifest["drafter_order"])
        )
    if config.deployment == "synthetic":
        from specjax import testing  # pylint: disable=import-outside-toplevel

        dep, _ = testing.make_deployment("random", seed=0, fourth=True)
        return dep
    if config.deployment == "hf":  # Hugging Face folders by local path (configs/real_models.py)
        from specjax.runner import hf_deployment  # pylint: disable=import-outside-toplevel

        return hf_deployment.load_hf_deployment(config)
    if config.deployment == "smollm2":  # the real verifier (configs/seed_reproduction_real.py)
        from specjax.runner import smollm2_deployment  # pylint: disable=import-outside-toplevel

        return smollm2_deployment.load_smollm2_deployment(config)
    raise ConfigError.invalid("deployment", config.deployment, DEPLOYMENTS)


def plan_prompts(config) -> tuple[list[str], list[str]]:
    """(prompts, ids): `plans_per_domain` prompts of each domain, interleaved (mixed plans)."""
    n = int(config.plans_per_domain)
    if config.deployment == "synthetic":
        prompts = (SYNTHETIC_PROMPTS * (3 * n // len(SYNTHETIC_PROMPTS) + 1))[: 3 * n]
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


def plan_domains(config, ids) -> list[str]:
    """Each plan's domain (the oracle router needs it; the policies are not told)."""
    if config.deployment == "synthetic":
        return ["d0"] * len(ids)
    from specjax.data import load_prompts  # pylint: disable=import-outside-toplevel

    dom = {p["id"]: p["domain"] for p in load_prompts()}
    return [dom[i] for i in ids]


def cell_deployment(config, cell, weights: bool = True):
    """The deployment a cell runs: its pairing's drafters at its temperatures and γ_i.
    ``weights=False`` (validation): the smollm2 verifier's outline, no weights read (the
    other deployments are built as a cell builds them)."""
    pairing = cell.get("pairing")
    if pairing and config.deployment == "zoo":
        load_zoo_checked(config)
        dep = _zoo_deployment(str(resolve_zoo_path(config)[0]), tuple(pairing))
    elif config.deployment == "smollm2":
        from specjax.runner import smollm2_deployment  # pylint: disable=import-outside-toplevel

        dep = smollm2_deployment.load_smollm2_deployment(config, pairing or None, weights)
    else:
        dep = load_deployment(config)
        if pairing:
            dep = dep.subset(list(pairing))
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
