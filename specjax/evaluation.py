"""How good the zoo's models are: what experiments/train_zoo.py records in the manifest and
the tests re-measure.

  heldout_loss          next-token loss of a text, nats/token and nats/byte (`train.eval_loss`)
  unigram_counts / unigram_loss   the add-one-smoothed unigram baseline on the same tokens
  acceptance_rates      each drafter's mean α = Σ_x min(p, q) on a text, in verifier space
  decode_tokens_per_s   greedy decoding speed at batch 1

It sits above the models, the rules' distributions and the training loop, which it measures
with (`specjax.models.zoo` only loads).
"""

from __future__ import annotations

import functools
import math
import time

import jax
import jax.numpy as jnp
import numpy as np

from specjax.models.api import advance
from specjax.tokenizers import Tokenizer
from specjax.train import eval_loss
from specjax.verify.distributions import sampling_probs, to_verifier_space

__all__ = [
    'heldout_loss',
    'unigram_counts',
    'unigram_loss',
    'acceptance_rates',
    'decode_tokens_per_s',
]


def heldout_loss(
    lm,
    params,
    tokenizer: Tokenizer,
    text: str,
    seq_len: int | None = None,
    max_tokens: int | None = None,
    batch_size: int = 8,
) -> dict[str, float]:
    """Next-token loss of ``text`` in nats/token and nats/byte.

    Consecutive windows of ``seq_len`` predictions (default: the model's ``max_len``),
    as `specjax.train.eval_loss`; the first token of the text is context only, so bytes
    are counted over the predicted tokens.
    """
    ids = np.asarray(tokenizer.encode(text), np.int32)
    if max_tokens is not None:
        ids = ids[: max_tokens + 1]
    nats_tok = eval_loss(lm, params, ids, seq_len=seq_len, batch_size=batch_size)
    n_pred = len(ids) - 1
    n_bytes = sum(len(tokenizer.token_bytes(int(i))) for i in ids[1:])
    return {
        'nats_per_token': nats_tok,
        'nats_per_byte': nats_tok * n_pred / n_bytes,
        'tokens': int(n_pred),
        'bytes': int(n_bytes),
    }


def unigram_counts(tokenizer: Tokenizer, train_text: str) -> np.ndarray:
    """Token counts of ``train_text`` (int64[V])."""
    ids = np.asarray(tokenizer.encode(train_text), np.int64)
    return np.bincount(ids, minlength=tokenizer.vocab_size)


def unigram_loss(
    tokenizer: Tokenizer, counts: np.ndarray, text: str, max_tokens: int | None = None
) -> dict[str, float]:
    """Loss of an add-one-smoothed unigram model (``counts`` + 1) on ``text``.

    Scored over the same tokens as `heldout_loss` (all but the first).
    """
    logp = np.log((counts + 1.0) / (counts.sum() + len(counts)))
    ids = np.asarray(tokenizer.encode(text), np.int64)
    if max_tokens is not None:
        ids = ids[: max_tokens + 1]
    pred = ids[1:]
    nats = float(-logp[pred].sum())
    n_bytes = sum(len(tokenizer.token_bytes(int(i))) for i in pred)
    return {'nats_per_token': nats / len(pred), 'nats_per_byte': nats / n_bytes}


@functools.partial(jax.jit, static_argnames=('lm', 'temperature'))
def _verifier_probs(lm, params, tokens, temperature):
    return sampling_probs(lm.logits_full(params, tokens), temperature)


@functools.partial(jax.jit, static_argnames=('spec', 'v_vocab'))
def _overlap_sums(spec, data, p, ids, ends, valid, v_vocab):
    """Σ over valid positions of Σ_x min(p, q) for one drafter, and the count."""
    logits = spec.lm.logits_full(data.params, ids)
    at = jnp.take_along_axis(logits, ends[:, :, None], axis=1)
    q = sampling_probs(
        at, spec.temperature, top_k=spec.top_k, top_p=spec.top_p, mask=data.to_verifier >= 0
    )
    q = to_verifier_space(q, data.to_verifier, v_vocab)
    overlap = jnp.minimum(p, q).sum(-1)
    return jnp.where(valid, overlap, 0.0).sum(), valid.sum()


def _windows(
    v_ids: np.ndarray, widths: list[np.ndarray], max_lens: list[int], window: int
) -> list[tuple[int, int]]:
    """[start, end) windows of at most ``window`` verifier tokens whose re-spelling in
    every drafter's ids fits that drafter's context."""
    out, start, used = [], 0, [0] * len(widths)
    for i, tok in enumerate(v_ids):
        w = [int(x[tok]) for x in widths]
        if i - start >= window or any(u + a > m for u, a, m in zip(used, w, max_lens)):
            out.append((start, i))
            start, used = i, [0] * len(widths)
        used = [u + a for u, a in zip(used, w)]
    if len(v_ids) > start:
        out.append((start, len(v_ids)))
    return out


def acceptance_rates(
    dep,
    text: str,
    window: int = 128,
    verifier_temperature: float = 1.0,
    batch_size: int = 8,
    max_tokens: int | None = None,
) -> np.ndarray:
    """Each drafter's mean acceptance α = Σ_x min(p(x), q(x)) on ``text``, in verifier space.

    The text is spelt with the verifier's tokenizer and cut into windows of at most
    ``window`` verifier tokens; within a window every position counts (the context is the
    window so far). ``p`` is the verifier's sampling distribution at
    ``verifier_temperature``; ``q`` is what the drafter samples from at its temperature
    after the token-level-intersection mask, read at verifier-token boundaries with the
    prefix re-spelt through the drafter's re-tokenisation table — the same quantity as
    `specjax.engine.deployment.prefix_distributions`, computed with the re-spelt prefix
    packed (no per-token padding to the table's width), so long windows fit the context.

    Returns:
      f32[K], in ``dep.drafters`` order.
    """
    v_ids = np.asarray(dep.encode(text), np.int32)
    if max_tokens is not None:
        v_ids = v_ids[:max_tokens]
    if len(v_ids) < 1:
        raise ValueError('acceptance_rates: empty text')
    retok = [np.asarray(d.retok) for d in dep.d_data]
    lens = [np.asarray(d.retok_len) for d in dep.d_data]
    wins = _windows(v_ids, lens, [s.lm.max_len for s in dep.drafters], window)
    W = max(e - s for s, e in wins)
    n_pad = math.ceil(len(wins) / batch_size) * batch_size
    v_tok = np.zeros((n_pad, W), np.int32)
    valid = np.zeros((n_pad, W), bool)
    for r, (s, e) in enumerate(wins):
        v_tok[r, : e - s] = v_ids[s:e]
        valid[r, : e - s] = True
    # Drafter streams: concatenated re-spellings; ends[r, t] = index of token t's last piece.
    streams = []
    for k, spec in enumerate(dep.drafters):
        flats = [np.concatenate([retok[k][t, : lens[k][t]] for t in v_ids[s:e]]) for s, e in wins]
        # Pad to the longest stream (rounded up to 64, so shapes repeat across texts).
        L = min(spec.lm.max_len, -(-max(len(f) for f in flats) // 64) * 64)
        ids = np.zeros((n_pad, L), np.int32)
        ends = np.zeros((n_pad, W), np.int32)
        for r, ((s, e), flat) in enumerate(zip(wins, flats)):
            ids[r, : len(flat)] = flat
            ends[r, : e - s] = np.cumsum(lens[k][v_ids[s:e]]) - 1
        streams.append((ids, ends))
    tot = np.zeros(len(dep.drafters))
    cnt = 0.0
    for b in range(0, n_pad, batch_size):
        sl = slice(b, b + batch_size)
        p = _verifier_probs(
            dep.verifier, dep.v_params, jnp.asarray(v_tok[sl]), float(verifier_temperature)
        )
        for k, (spec, data) in enumerate(zip(dep.drafters, dep.d_data)):
            ids, ends = streams[k]
            s, c = _overlap_sums(
                spec,
                data,
                p,
                jnp.asarray(ids[sl]),
                jnp.asarray(ends[sl]),
                jnp.asarray(valid[sl]),
                dep.verifier.vocab_size,
            )
            tot[k] += float(s)
        cnt += float(valid[sl].sum())
    return (tot / cnt).astype(np.float32)


def decode_tokens_per_s(lm, params, n_tokens: int = 256, repeats: int = 3) -> float:
    """Greedy decoding speed at batch 1: one-token ``forward`` steps inside a jitted
    ``lax.scan`` (compiled once, then the best of ``repeats`` timed runs)."""
    n_tokens = min(n_tokens, lm.max_len)

    @jax.jit
    def run(params, first):
        def step(carry, i):
            cache, tok = carry
            logits, cache = lm.forward(
                params,
                cache,
                tok[:, None],
                jnp.full((1, 1), i, jnp.int32),
                jnp.ones((1, 1, 1), bool),
            )
            cache = advance(cache, jnp.ones((1,), jnp.int32))
            nxt = jnp.argmax(logits[:, -1], axis=-1).astype(jnp.int32)
            return (cache, nxt), nxt

        _, toks = jax.lax.scan(step, (lm.init_cache(1), first), jnp.arange(n_tokens))
        return toks

    first = jnp.zeros((1,), jnp.int32)
    run(params, first).block_until_ready()
    best = float('inf')
    for _ in range(repeats):
        t0 = time.perf_counter()
        run(params, first).block_until_ready()
        best = min(best, time.perf_counter() - t0)
    return n_tokens / best
