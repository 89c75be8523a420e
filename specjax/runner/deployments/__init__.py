"""The deployment kinds by name: what every caller asks instead of comparing
``config.deployment`` (SPEC §12).

The modules imported below register their kind (`kind.register`) when they are imported;
this import is the one line a new kind's module adds itself to. A caller asks `get(name)`
(or `of(config)`) for the typed `DeploymentKind` (its fields, checks, loading, prompts),
`known()` for the names.
"""

from __future__ import annotations

from specjax.errors import ConfigError
from specjax.runner.deployments import gemma3, hf, smollm2, synthetic, zoo  # noqa: F401  (each registers its kind)
from specjax.runner.deployments.kind import (
    DeploymentKind,
    check_pairings,
    register,
    registered,
    unregister,
)

__all__ = [
    "DeploymentKind",
    "all_fields",
    "all_kinds",
    "check_pairings",
    "get",
    "known",
    "of",
    "register",
    "unregister",
]


def known() -> tuple[str, ...]:
    """Every registered kind's name, in registration order."""
    return tuple(registered())


def all_kinds() -> tuple[DeploymentKind, ...]:
    """Every registered kind, in registration order."""
    return tuple(registered().values())


def all_fields() -> tuple[str, ...]:
    """The config fields some registered kind reads beyond the `plans` defaults."""
    return tuple(dict.fromkeys(f for k in all_kinds() for f in k.fields))


def get(name, field: str = "deployment") -> DeploymentKind:
    """The kind named `name`.

    Raises:
        ConfigError (a ValueError): naming `field`, the value and the registered kinds.
    """
    kind = registered().get(name) if isinstance(name, str) else None
    if kind is None:
        raise ConfigError.invalid(field, name, list(known()))
    return kind


def of(config) -> DeploymentKind:
    """The kind a `plans` config names (``config.deployment``)."""
    return get(config.get("deployment"))
