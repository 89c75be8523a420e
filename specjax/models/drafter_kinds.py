"""The drafter kinds: what the engine, the TPU planner and the runner ask instead of
inspecting a drafter's model or comparing its kind's name (SPEC §12).

The modules imported below register their kinds (`specjax.models.drafter_kind.register`)
when they are imported; this import is the one line a new kind's module adds itself to. A
caller asks `kind_of(lm)` for a model's `DrafterKind` (its q support, whether it reads the
verifier's features and which, how it drafts and is checked), `get(name)` for a kind a
config names and `names()` for the list.
"""

from __future__ import annotations

from specjax.errors import ConfigError
from specjax.models import api, eagle, ngram, subset_vocab  # noqa: F401  (each registers its kind)
from specjax.models.drafter_kind import DrafterKind, registered

__all__ = ['DEFAULT', 'kind_of', 'get', 'find', 'names', 'all_kinds']

#: The kind of a model of the LM API whose class registers none (the synthetic table LMs):
#: it drafts as a transformer does, a dense law over its own vocabulary.
DEFAULT = api.TRANSFORMER


def kind_of(lm) -> DrafterKind:
    """The kind of drafter model ``lm`` is (the one its class is bound to; `DEFAULT` for a
    model whose class registers none)."""
    kind = getattr(lm, 'drafter_kind', None)
    return DEFAULT if kind is None else kind


def names() -> tuple[str, ...]:
    """Every registered kind's name, in registration order."""
    return tuple(registered())


def all_kinds() -> tuple[DrafterKind, ...]:
    """Every registered kind, in registration order."""
    return tuple(registered().values())


def find(name) -> DrafterKind | None:
    """The kind named ``name``, or None (a drafter file that names no kind, or another)."""
    return registered().get(name) if isinstance(name, str) else None


def get(name: str) -> DrafterKind:
    """The kind named ``name``.

    Raises:
        ConfigError (a ValueError): naming the value and the registered kinds.
    """
    kind = find(name)
    if kind is None:
        raise ConfigError(f"drafter kind: got {name!r}; allowed: one of {', '.join(names())}")
    return kind
