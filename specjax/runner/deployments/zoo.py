"""The zoo (``deployment = 'zoo'``, the default): the shipped tiny models, the seed's deployment
in miniature (SPEC §8), or a zoo folder ``zoo_path`` / ``$SPECJAX_ZOO`` names.

The zoo is resolved by one precedence (`resolve_zoo_path`), loaded and verified once per
process (its manifest, every file's sha256, shapes: `load_zoo_checked`), and a pairing's
deployment is built by `specjax.engine.deployment.from_zoo` (``'lookup'`` adds prompt-lookup
drafting by name).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence
from pathlib import Path

from specjax.engine.deployment import LOOKUP, Deployment, from_zoo
from specjax.errors import ConfigError, env_value, user_path
from specjax.models import zoo as zoo_lib
from specjax.runner.deployments.kind import DeploymentKind, register

__all__ = ["ZooKind", "load_zoo_checked", "resolve_zoo_path"]


@functools.lru_cache(maxsize=4)
def _zoo(path: str):
    """The zoo with every drafter it ships (the seed's, and extras such as `prose512`)."""
    _, manifest = zoo_lib.read_manifest(path)
    extra = [n for n in manifest.get("extra_drafters", []) if n not in manifest["drafter_order"]]
    return zoo_lib.load_zoo(path, names=list(manifest["drafter_order"]) + extra)


@functools.lru_cache(maxsize=16)
def _zoo_deployment(path: str, names: tuple[str, ...]) -> Deployment:
    return from_zoo(_zoo(path), list(names))


def resolve_zoo_path(config) -> tuple[Path, str]:
    """(absolute zoo folder, where it came from), by one precedence (README):

    1. ``config.zoo_path`` when set (``--config.zoo_path=...``; relative to the working
       directory) — ``"zoo_path"``;
    2. else ``$SPECJAX_ZOO`` when set and non-empty — ``"SPECJAX_ZOO"``;
    3. else the zoo shipped inside the package, ``specjax/zoo`` — ``"shipped"``.
    """
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


class ZooKind(DeploymentKind):
    """The zoo: its seed drafters by default, any drafter it ships (and ``'lookup'``) in a
    pairing."""

    name = "zoo"
    # A real config switched to the zoo by an override keeps its fields, ignored.
    refuses_other_fields = False
    summary = "the shipped tiny models (or a zoo folder): the seed's deployment in miniature"

    def validate(self, config) -> tuple[dict | None, set[str]]:
        zoo, inputs = load_zoo_checked(config)
        return inputs, set(zoo.names) | {LOOKUP}  # from_zoo adds prompt lookup by name

    def load(
        self, config, pairing: Sequence[str] | None = None, weights: bool = True
    ) -> Deployment:
        zoo = load_zoo_checked(config)[0]
        names = tuple(pairing) if pairing else tuple(zoo.manifest["drafter_order"])
        return _zoo_deployment(str(resolve_zoo_path(config)[0]), names)

    def describe_verifier(self, config: dict, inputs: dict) -> str:
        g = inputs.get("zoo")
        if g is None:
            return super().describe_verifier(config, inputs)
        return (
            f"the zoo's verifier ({g.get('source')} zoo, manifest sha256 "
            f"{str(g.get('manifest_sha256'))[:12]}…; rows' inputs.zoo)"
        )


register(ZooKind())
