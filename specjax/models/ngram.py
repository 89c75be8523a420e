"""Prompt-lookup (n-gram) drafting: a "model" that copies its proposals from the context.

`PromptLookupLM` is the drafter kind every peer ships (vLLM's ``ngram`` proposer,
transformers' ``prompt_lookup_num_tokens``, llama.cpp's lookup decoding), behind the
functional LM API (ARCHITECTURE.md), so the engine drafts with it inside its jitted round
like any other drafter: no parameters, no host loop, no retrace per step.

Its cache is the row's token history (`HistoryCache`: ``tokens i32[B, S]`` and ``length``),
with the KV cache's slot semantics (models/cache.py): ``forward`` writes the block at slots
``[length, length + T)`` (writes past capacity are dropped), ``advance`` / ``rollback`` /
``compact`` move ``length`` (and, for ``compact``, the block's slots) exactly as they do
for keys and values.

The prediction after block position ``t`` (context: the committed slots ``< length`` and
block tokens ``0..t``, i.e. a chain) is the token that followed the most recent earlier
occurrence of the longest suffix of the context, trying ``max_ngram`` down to
``min_ngram`` tokens; with no occurrence it repeats the context's last token. Logits are
one-hot: 0 at the prediction and `NEG` elsewhere (finite, so softmax stays NaN-free). Its
sampling law ``q`` is the point mass at the prediction at every temperature and under
top-k / top-p (its kind `LOOKUP`'s `QSupport.POINT_MASS`: the engine takes the logits' argmax as the
draw and its one-hot as ``q``, with no softmax or inverse-CDF pass over the vocabulary):
every verification rule stays exact, as it always tests the q the drafter sampled from.

Cost: per block position, ``max_ngram`` compares against each of the ``S + T`` slots
(O(B·T·(S+T)·max_ngram) elementwise work, no matmul); the logits ``f32[B, T, V]`` are
materialised like any model's.

``block_mask`` and ``positions`` are not read: the block is taken to be a chain (the
engine feeds drafters chains: prefill, catch-up, one token per draft step). A token-tree
block (a verifier's) is outside this model's contract.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import struct

from specjax.models.cache import block_rows
from specjax.models.drafter_kind import DrafterKind, QSupport, register

__all__ = ['HistoryCache', 'PromptLookupLM', 'LOOKUP', 'lookup_predictions', 'NEG']

#: The logit of every token but the prediction (finite: softmax of a row stays NaN-free).
NEG = -1e9


@struct.dataclass
class HistoryCache:
    """tokens: i32[B, S] the row's history (slot ``s`` committed iff ``s < length``);
    length: i32[B]."""

    tokens: jax.Array
    length: jax.Array

    @property
    def max_len(self) -> int:
        """The capacity S (slots per row)."""
        return self.tokens.shape[1]

    capacity = max_len

    @property
    def batch(self) -> int:
        return self.tokens.shape[0]

    @staticmethod
    def logical_axes() -> 'HistoryCache':
        """Logical axis names of each field (`specjax.runtime.sharding.cache_like_shardings`)."""
        return HistoryCache(tokens=('batch', 'cache_length'), length=('batch',))


def lookup_predictions(
    seq: jax.Array, ends: jax.Array, max_ngram: int, min_ngram: int = 1
) -> jax.Array:
    """The n-gram prediction after each query position.

    Args:
      seq: i32[B, L] token sequences (each query reads only positions ``<= ends``).
      ends: i32[B, T] query positions: the context of query ``t`` is ``seq[b, :ends+1]``.
      max_ngram / min_ngram: static; suffix lengths tried, longest first.

    Returns:
      i32[B, T]: ``seq[b, j + 1]`` for the largest ``j < ends`` where the longest matching
      suffix (``n`` tokens ending at ``ends``, ``max_ngram >= n >= min_ngram``) also ends,
      else ``seq[b, ends]`` (the last token repeated).
    """
    b, length = seq.shape
    ends = ends.astype(jnp.int32)
    j = jnp.arange(length, dtype=jnp.int32)[None, None, :]  # candidate ends
    before = j < ends[:, :, None]  # j + 1 <= ends
    eq = None
    best = jnp.full(ends.shape, -1, jnp.int32)  # match end of the longest n so far
    for n in range(1, max_ngram + 1):
        i = n - 1  # compare seq[ends - i] with seq[j - i]
        shifted = jnp.pad(seq, ((0, 0), (i, 0)))[:, :length]  # [B, L]: seq[j - i]
        query = jnp.take_along_axis(seq, jnp.maximum(ends - i, 0), axis=1)  # [B, T]
        e = (query[:, :, None] == shifted[:, None, :]) & (j >= i) & (ends >= i)[:, :, None]
        eq = e if eq is None else eq & e
        if n >= min_ngram:
            recent = jnp.max(jnp.where(eq & before, j, -1), axis=-1)  # [B, T]
            best = jnp.where(recent >= 0, recent, best)  # a longer match overrides
    at = jnp.where(best >= 0, best + 1, ends)
    return jnp.take_along_axis(seq, jnp.clip(at, 0, length - 1), axis=1)


@dataclasses.dataclass(frozen=True)
class PromptLookupLM:
    """Prompt-lookup drafting behind the functional LM API (see the module docstring).

    Attributes:
      vocab_size: V (the verifier's: the drafter proposes the verifier's own ids).
      max_len: the history's default capacity (slots per row).
      max_ngram / min_ngram: suffix lengths matched, longest first (1 <= min <= max).
    """

    vocab_size: int
    max_len: int
    max_ngram: int = 3
    min_ngram: int = 1

    def __post_init__(self):
        for field in ('vocab_size', 'max_len', 'max_ngram', 'min_ngram'):
            v = getattr(self, field)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f'PromptLookupLM.{field}: got {v!r}; allowed: an integer >= 1')
        if self.min_ngram > self.max_ngram:
            raise ValueError(
                f'PromptLookupLM.min_ngram: got {self.min_ngram} > max_ngram='
                f'{self.max_ngram}; allowed: 1 <= min_ngram <= max_ngram'
            )

    # -- state ----------------------------------------------------------------------------
    def init_params(self, rng=None) -> dict:
        """No parameters (an empty pytree)."""
        del rng
        return {}

    def init_cache(self, batch: int, capacity: int | None = None) -> HistoryCache:
        capacity = self.max_len if capacity is None else int(capacity)
        if not 1 <= capacity <= self.max_len:
            raise ValueError(
                f'PromptLookupLM.init_cache: capacity={capacity} (allowed: '
                f'1 <= capacity <= max_len={self.max_len})'
            )
        return HistoryCache(
            tokens=jnp.zeros((batch, capacity), jnp.int32), length=jnp.zeros((batch,), jnp.int32)
        )

    def advance(self, cache: HistoryCache, n) -> HistoryCache:
        """``length += n``, capped at capacity."""
        n = jnp.broadcast_to(jnp.asarray(n, jnp.int32), cache.length.shape)
        return cache.replace(length=jnp.minimum(cache.length + n, cache.max_len))

    def rollback(self, cache: HistoryCache, new_length) -> HistoryCache:
        """``length = new_length``, clamped into ``[0, length]``."""
        new_length = jnp.broadcast_to(jnp.asarray(new_length, jnp.int32), cache.length.shape)
        return cache.replace(length=jnp.clip(new_length, 0, cache.length))

    def compact(self, cache: HistoryCache, src, n) -> HistoryCache:
        """Slot ``length+i`` <- slot ``length+src[b, i]`` (i < K; all read before any
        write), then ``length += n``."""
        src = jnp.asarray(src, jnp.int32)
        if src.ndim != 2 or src.shape[0] != cache.batch:
            raise ValueError(f'compact(src): expected i32[{cache.batch}, K], got shape {src.shape}')
        base = cache.length[:, None]
        rows = jnp.arange(cache.batch)[:, None]
        moved = cache.tokens.at[rows, base + src].get(mode='clip')
        dst = base + jnp.arange(src.shape[1])[None, :]
        return self.advance(
            cache.replace(tokens=cache.tokens.at[rows, dst].set(moved, mode='drop')), n
        )

    # -- compute --------------------------------------------------------------------------
    def forward(self, params, cache: HistoryCache, tokens, positions, block_mask, logits_at=None):
        """Writes the block at ``[length, length+T)`` and predicts after each block token.

        Returns:
          (logits f32[B, T, V]: 0 at each prediction, `NEG` elsewhere; the cache with the
          block written, ``length`` unchanged). The predictions read the block itself, so
          they are exact even where the block overflows the capacity (its writes are
          dropped, as in models/cache.py). ``logits_at`` i32[B, R]: those block positions
          only, f32[B, R, V].
        """
        del params, positions, block_mask  # no weights; the block is a chain
        b, t = tokens.shape
        s = cache.tokens.shape[1]
        rows = jnp.arange(b)[:, None]
        slots = cache.length[:, None] + jnp.arange(t, dtype=jnp.int32)[None, :]  # [B, T]
        # The history extended by T slots: the block always fits (length <= S).
        seq = jnp.concatenate([cache.tokens, jnp.zeros((b, t), jnp.int32)], axis=1)
        seq = seq.at[rows, slots].set(tokens.astype(jnp.int32), mode='drop')
        pred = lookup_predictions(seq, slots, self.max_ngram, self.min_ngram)
        if logits_at is not None:
            pred = block_rows(pred, logits_at)
        ids = jax.lax.broadcasted_iota(jnp.int32, pred.shape + (self.vocab_size,), 2)
        logits = jnp.where(ids == pred[:, :, None], 0.0, NEG).astype(jnp.float32)
        return logits, cache.replace(tokens=seq[:, :s])

    def logits_full(self, params, tokens) -> jax.Array:
        """Logits f32[B, T, V] after each token of whole sequences (as `forward` from an
        empty history): what evaluation code that scores a drafter on text reads."""
        b, t = tokens.shape
        logits, _ = self.forward(
            params,
            self.init_cache(b, t),
            tokens,
            jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t)),
            jnp.ones((b, t, t), bool),
        )
        return logits


def _lookup_example(verifier, lm, kept):
    """Trigrams down to unigrams over the verifier's vocabulary and context (no weights)."""
    del lm, kept
    lookup = PromptLookupLM(
        vocab_size=verifier.vocab_size, max_len=verifier.max_len, max_ngram=3, min_ngram=1
    )
    return lookup, lookup.init_params()


#: Prompt lookup: its law is a point mass at its prediction, it has no weights.
LOOKUP = register(
    DrafterKind(
        name='lookup',
        lm_type=PromptLookupLM,
        q_support=QSupport.POINT_MASS,
        has_weights=False,
        example=_lookup_example,
        summary='prompt lookup: the token that followed the context\'s suffix, one-hot q',
    )
)
