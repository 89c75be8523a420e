"""The typed drafter kind: what a caller may ask of a drafter's model, never its class or name.

A `DrafterKind` is a frozen description of one kind of drafter model (a transformer, prompt
lookup, the FR-Spec subset-vocabulary drafter, the feature drafter): the law its drafts are
drawn from (`QSupport`), whether it reads the verifier's hidden states and which, how it
drafts inside a deployment of the verifier's tokenizer (`Drafting`: the model the engine
runs and the ids its law lives on), how it is checked against a verifier, and how an
example of it is built for a verifier (the TPU planner's abstract drafters). The module
that defines the model registers its kind (`register`, which binds the kind to the model
class as ``drafter_kind``); `specjax.models.drafter_kinds` imports every such module (its
one registration line) and answers the callers (`kind_of(lm)`, `get(name)`, `names()`).

Everything here is host-side: a kind decides which program is traced, never what is in it.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any, Callable

__all__ = ['QSupport', 'Drafting', 'DrafterKind', 'register', 'registered']

#: Every registered kind, by name, in registration order (filled by `register`).
_KINDS: dict[str, 'DrafterKind'] = {}


class QSupport(enum.Enum):
    """Where a drafter's law ``q`` can put mass, known before it drafts."""

    #: A law over its whole vocabulary (the softmax of its logits at its temperature).
    DENSE = 'dense'
    #: One id, its logits' argmax, at every temperature and filter: the engine takes the
    #: argmax as the draw and its one-hot as ``q`` (`specjax.verify.qlaw.point_mass`).
    POINT_MASS = 'point_mass'
    #: The verifier's ids its head keeps (``Drafting.support``): each draft is drawn over
    #: those K probabilities, only ``q`` scattered into the verifier's ids.
    HEAD = 'head'
    #: Its own K + 1 ids, K of them one-to-one into the verifier's and one "other" row that
    #: is never proposed (``Drafting.to_verifier``).
    SUBSET = 'subset'


@dataclasses.dataclass(frozen=True)
class Drafting:
    """How a drafter of the verifier's tokenizer drafts inside the engine (its id maps are
    built from this by `specjax.engine.spec.drafting_maps`).

    Attributes:
        lm: the model the engine runs (a subset-vocabulary drafter: its inner transformer).
        params: that model's parameters.
        support: optional i32[K] distinct verifier ids, the only ones its law can give mass
            to (`QSupport.HEAD`); None: its whole vocabulary.
        to_verifier: optional i32[Vd] (Vd = ``lm.vocab_size``): it drafts in ids of its own,
            id i standing for verifier id ``to_verifier[i]`` (distinct; -1: never proposed,
            `QSupport.SUBSET`); None: it drafts in the verifier's ids.
        from_verifier: with ``to_verifier``, i32[V]: the id of its own each verifier token
            is read as.
    """

    lm: Any
    params: Any
    support: Any = None
    to_verifier: Any = None
    from_verifier: Any = None

    def __post_init__(self):
        if (self.to_verifier is None) != (self.from_verifier is None):
            raise ValueError('Drafting: to_verifier and from_verifier go together')
        if self.support is not None and self.to_verifier is not None:
            raise ValueError('Drafting: a support in verifier ids or ids of its own, not both')


def _as_is(lm, params) -> Drafting:
    """It drafts as it is, in the verifier's ids."""
    return Drafting(lm, params)


def _any_verifier(lm, verifier, name: str) -> None:
    """Every verifier of the LM API will do."""
    del lm, verifier, name


def _final_state(lm):
    """The verifier's final-normed hidden state (a feature drafter's default)."""
    del lm


@dataclasses.dataclass(frozen=True)
class DrafterKind:
    """One kind of drafter model.

    Attributes:
        name: the name the TPU planner's configs and drafter files give it.
        lm_type: its model class (`register` binds the kind to it as ``drafter_kind``; a
            wrapper that forwards its attributes, e.g. `specjax.measure.price_programs.FreeLM`,
            keeps its inner model's kind).
        q_support: where its law can put mass (`QSupport`).
        reads_features: it drafts from the verifier's hidden states: the engine asks the
            verifier's ``forward_hidden`` for them and writes them into its cache
            (`specjax.engine.features`); its model has ``write_features``.
        has_weights: it has trained parameters (prompt lookup has none: no forward to price).
        verifier_layers: ``lm -> None | tuple[int, ...]``, with ``reads_features``: the
            verifier states it reads (`TransformerLM.forward_hidden`'s ``layers``; None: the
            final-normed state).
        drafting: ``(lm, params) -> Drafting``: how it drafts with the verifier's tokenizer.
        check_verifier: ``(lm, verifier, name) -> None``: a one-line `ConfigError` naming
            drafter ``name`` where ``verifier`` cannot serve it (host side, before a call).
        example: optional ``(verifier, lm, kept) -> (lm, params)``: one of this kind for a
            `TransformerLM` ``verifier``, weights abstract (`jax.ShapeDtypeStruct`), id
            maps concrete: ``lm`` a transformer of the drafter's size (its layers, any
            vocabulary), ``kept`` its head's ids where it has one (`specjax.tpu.programs.drafter`).
        summary: one line for tables and error messages.
    """

    name: str
    lm_type: type
    q_support: QSupport = QSupport.DENSE
    reads_features: bool = False
    has_weights: bool = True
    verifier_layers: Callable[[Any], Any] = _final_state
    drafting: Callable[[Any, Any], Drafting] = _as_is
    check_verifier: Callable[[Any, Any, str], None] = _any_verifier
    example: Callable[[Any, Any, int], tuple] | None = None
    summary: str = ''

    @property
    def point_mass(self) -> bool:
        """Its law is a point mass at its logits' argmax (`QSupport.POINT_MASS`)."""
        return self.q_support is QSupport.POINT_MASS


def register(kind: DrafterKind) -> DrafterKind:
    """Adds ``kind`` to the registry (a name or a model class registered twice is an error),
    binds it to its model class (``kind.lm_type.drafter_kind``) and returns it."""
    if not isinstance(kind, DrafterKind):
        raise TypeError(f'register: got {type(kind).__name__}, expected a DrafterKind')
    if kind.name in _KINDS:
        raise ValueError(f'register: a drafter kind named {kind.name!r} is already registered')
    if not isinstance(kind.lm_type, type):
        raise TypeError(f'register: drafter kind {kind.name!r}: lm_type must be a class')
    if kind.lm_type.__dict__.get('drafter_kind') is not None:
        raise ValueError(
            f'register: {kind.lm_type.__name__} already has the drafter kind '
            f'{kind.lm_type.__dict__["drafter_kind"].name!r}'
        )
    if not isinstance(kind.q_support, QSupport):
        raise TypeError(f'register: drafter kind {kind.name!r}: q_support must be a QSupport')
    _KINDS[kind.name] = kind
    kind.lm_type.drafter_kind = kind
    return kind


def registered() -> dict[str, DrafterKind]:
    """Every registered kind by name, in registration order (the registry's view)."""
    return _KINDS
