"""Which verifier states the feature drafters of a call read (`specjax.models.eagle`).

A feature drafter drafts from the verifier's hidden states: the final-normed one (EAGLE-1/2)
or several blocks' residual streams (EAGLE-3, `EagleLM.feature_layers`). One verifier call
serves them all: the engine asks `forward_hidden` for the union of what they read and hands
each drafter its own slices.
"""

from __future__ import annotations

import jax

from specjax.models.drafter_kinds import kind_of

__all__ = ['reads_features', 'feature_layout', 'pick_features']


def reads_features(drafter) -> bool:
    """Whether a drafter (a `DrafterStatic` / `DrafterSpec`) drafts from the verifier's
    hidden states (its kind's `reads_features`: `specjax.models.eagle`)."""
    return kind_of(drafter.lm).reads_features


def feature_layout(verifier, lms):
    """(request, picks) for drafter LMs ``lms`` drafting with ``verifier``.

    ``request``: False where none reads the verifier's features; True where all read its
    final-normed state alone (`forward_hidden` as is); else the tuple of states to ask
    `forward_hidden(layers=...)` for, the union of what they read (their kinds'
    `verifier_layers`, EAGLE-3's `EagleLM.feature_layers`; n_layers stands for the
    final-normed state). ``picks[k]``: None for a drafter that reads none, else the
    D-slices of the returned hidden states it reads (`pick_features`).
    """
    kinds = [kind_of(lm) for lm in lms]
    wants = [
        (tuple(kind.verifier_layers(lm) or ('final',))) if kind.reads_features else None
        for kind, lm in zip(kinds, lms)
    ]
    if all(w is None for w in wants):
        return False, [None] * len(lms)
    if all(w in (None, ('final',)) for w in wants):
        return True, [None if w is None else (0,) for w in wants]
    final = verifier.config.n_layers
    wants = [None if w is None else tuple(final if i == 'final' else i for i in w) for w in wants]
    request = tuple(sorted({i for w in wants if w is not None for i in w}))
    return request, [None if w is None else tuple(request.index(i) for i in w) for w in wants]


def pick_features(hidden, pick, request) -> jax.Array:
    """The D-slices ``pick`` of the verifier's hidden states [..., n·D] (n = the states
    of ``request``, `feature_layout`), concatenated: what that drafter reads."""
    n = 1 if request is True else len(request)
    if pick == tuple(range(n)):
        return hidden
    parts = hidden.reshape(hidden.shape[:-1] + (n, hidden.shape[-1] // n))
    return parts[..., list(pick), :].reshape(hidden.shape[:-1] + (-1,))
