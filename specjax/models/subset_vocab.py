"""Drafters over a frequency-ranked subset of the verifier's vocabulary (FR-Spec).

A real verifier's vocabulary is large (SmolLM2: 49,152 ids): a small drafter's input
embedding and output head over all of it cost more than its layers. FR-Spec (Zhao et al.,
2025) restricts the draft head to the most frequent tokens. `SubsetVocabLM` does that with
the verifier's own token ids on both sides, so it plugs into a deployment as a drafter of
the verifier's tokenizer (identity maps, no cross-vocabulary path)::

    keep = most_frequent_ids(counts, 8192)                 # verifier ids, int32[K]
    lm = SubsetVocabLM(TransformerConfig(vocab_size=len(keep) + 1, ...), verifier_vocab=V)
    params = lm.init_params(0, keep)                      # {'inner', 'to_inner', 'keep'}

Inside, a `TransformerLM` runs over ``K + 1`` ids: the ``K`` kept tokens and one row
``K`` that every other verifier id reads as input ("other"). Its logits are scattered
back into the verifier's ``V`` ids with a large negative value (probability 0) for every
id outside ``keep`` and for the "other" row, which is never proposed. Every rule stays
lossless: they use the ``q`` the drafter actually sampled from, and a token with ``q = 0``
is simply never drafted.

Parameters: ``inner`` (the transformer's), ``to_inner`` i32[V] (verifier id -> inner id)
and ``keep`` i32[K] (inner id -> verifier id). The maps travel as arrays, so one compiled
program serves every subset of the same size.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from specjax.models.api import TransformerLM
from specjax.models.drafter_kind import DrafterKind, Drafting, QSupport, register
from specjax.models.transformer import TransformerConfig

__all__ = ['SubsetVocabLM', 'SUBSET', 'most_frequent_ids', 'NEG_LOGIT']

#: The logit of a token outside the subset: exp(-1e9 - max) is exactly 0 in f32, and
#: unlike -inf it keeps softmax and log-softmax free of NaN.
NEG_LOGIT = -1e9


def most_frequent_ids(counts: np.ndarray, k: int, always: tuple[int, ...] = ()) -> np.ndarray:
    """The ``k`` verifier ids with the largest counts (ties by id), ``always`` included,
    in ascending id order (int32[k])."""
    counts = np.asarray(counts, np.float64).copy()
    if not 1 <= k <= len(counts):
        raise ValueError(f'most_frequent_ids: k={k} (allowed: 1 <= k <= {len(counts)})')
    counts[list(always)] = np.inf
    order = np.lexsort((np.arange(len(counts)), -counts))
    return np.sort(order[:k]).astype(np.int32)


@dataclasses.dataclass(frozen=True)
class SubsetVocabLM:
    """A transformer drafter whose vocabulary is a subset of the verifier's (FR-Spec).

    Attributes:
      config: the inner transformer's config; ``config.vocab_size`` = K + 1.
      verifier_vocab: V, the verifier's vocabulary (this LM's ``vocab_size``).
    """

    config: TransformerConfig
    verifier_vocab: int
    inner: TransformerLM = dataclasses.field(init=False, compare=False, hash=False, repr=False)

    def __post_init__(self):
        if self.config.vocab_size < 2:
            raise ValueError(
                f'SubsetVocabLM.config.vocab_size={self.config.vocab_size}: '
                f'must be K + 1 >= 2 (K kept tokens and the "other" row)'
            )
        if not self.config.vocab_size - 1 <= self.verifier_vocab:
            raise ValueError(
                f'SubsetVocabLM: K={self.config.vocab_size - 1} kept tokens exceed '
                f'the verifier vocabulary {self.verifier_vocab}'
            )
        object.__setattr__(self, 'inner', TransformerLM(self.config))

    @property
    def n_kept(self) -> int:
        return self.config.vocab_size - 1

    @property
    def vocab_size(self) -> int:
        return self.verifier_vocab

    @property
    def max_len(self) -> int:
        return self.config.max_len

    # -- parameters -----------------------------------------------------------------------
    def maps(self, keep) -> dict:
        """``to_inner`` / ``keep`` arrays for the kept verifier ids ``keep`` (int[K])."""
        keep = np.asarray(keep, np.int64)
        if keep.shape != (self.n_kept,) or len(np.unique(keep)) != self.n_kept:
            raise ValueError(
                f'SubsetVocabLM.maps: keep must hold {self.n_kept} distinct ids '
                f'(got shape {keep.shape})'
            )
        if keep.min() < 0 or keep.max() >= self.verifier_vocab:
            raise ValueError(f'SubsetVocabLM.maps: keep ids must lie in [0, {self.verifier_vocab})')
        to_inner = np.full((self.verifier_vocab,), self.n_kept, np.int32)
        to_inner[keep] = np.arange(self.n_kept, dtype=np.int32)
        return {'to_inner': jnp.asarray(to_inner), 'keep': jnp.asarray(keep, jnp.int32)}

    def init_params(self, rng, keep) -> dict:
        return {'inner': self.inner.init_params(rng), **self.maps(keep)}

    def abstract_params(self) -> dict:
        return {
            'inner': self.inner.abstract_params(),
            'to_inner': jax.ShapeDtypeStruct((self.verifier_vocab,), jnp.int32),
            'keep': jax.ShapeDtypeStruct((self.n_kept,), jnp.int32),
        }

    def param_logical_axes(self) -> dict:
        return {'inner': self.inner.param_logical_axes(), 'to_inner': (None,), 'keep': (None,)}

    # -- cache ----------------------------------------------------------------------------
    def init_cache(self, batch: int, capacity: int | None = None):
        return self.inner.init_cache(batch, capacity)

    def advance(self, cache, n):
        return self.inner.advance(cache, n)

    def rollback(self, cache, new_length):
        return self.inner.rollback(cache, new_length)

    def compact(self, cache, src, n):
        return self.inner.compact(cache, src, n)

    # -- compute --------------------------------------------------------------------------
    def scatter(self, params, inner_logits) -> jax.Array:
        """Inner logits f32[..., K + 1] -> verifier-space logits f32[..., V]."""
        lead = inner_logits.shape[:-1]
        out = jnp.full(lead + (self.verifier_vocab,), NEG_LOGIT, jnp.float32)
        return out.at[..., params['keep']].set(inner_logits[..., : self.n_kept].astype(jnp.float32))

    def forward(
        self, params, cache, tokens, positions, block_mask, logits_at=None
    ) -> tuple[jax.Array, Any]:
        inner_tokens = params['to_inner'][tokens]
        logits, cache = self.inner.forward(
            params['inner'], cache, inner_tokens, positions, block_mask, logits_at=logits_at
        )
        return self.scatter(params, logits), cache

    def inner_logits_full(self, params, tokens) -> jax.Array:
        """Causal inner logits f32[B, T, K + 1] of verifier-id sequences (training)."""
        return self.inner.logits_full(params['inner'], params['to_inner'][tokens])

    def logits_full(self, params, tokens) -> jax.Array:
        return self.scatter(params, self.inner_logits_full(params, tokens))


def _subset_drafting(lm: SubsetVocabLM, params) -> Drafting:
    """Its inner transformer drafts in its own ``K + 1`` ids: inner id i < K is the kept
    verifier id ``keep[i]``, the "other" row K is never proposed, and every verifier token
    is read as its inner id or "other" (``to_inner``). The law of every draft and ``q`` are
    those of the `SubsetVocabLM` itself, drawn over ``K + 1`` ids instead of the verifier's
    whole vocabulary (49,152 ids for SmolLM2 against K = 4,096)."""
    keep = jnp.asarray(np.asarray(params['keep']), jnp.int32)
    return Drafting(
        lm.inner,
        params['inner'],
        to_verifier=jnp.concatenate([keep, jnp.full((1,), -1, jnp.int32)]),
        from_verifier=jnp.asarray(params['to_inner'], jnp.int32),
    )


def _subset_example(verifier, lm, kept: int):
    """``lm``'s layers over the verifier's first ``kept`` ids and "other"."""
    v = verifier.vocab_size
    sub = SubsetVocabLM(dataclasses.replace(lm.config, vocab_size=kept + 1), v)
    params = {
        'inner': sub.inner.abstract_params(),
        'keep': np.arange(kept, dtype=np.int32),
        'to_inner': np.minimum(np.arange(v), kept).astype(np.int32),
    }
    return sub, params


#: The FR-Spec drafter: a transformer over K of the verifier's ids and "other".
SUBSET = register(
    DrafterKind(
        name='subset',
        lm_type=SubsetVocabLM,
        q_support=QSupport.SUBSET,
        drafting=_subset_drafting,
        example=_subset_example,
        summary="FR-Spec: a transformer over the verifier's K most frequent ids",
    )
)
