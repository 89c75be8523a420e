"""Sampling distributions: the exact `p`/`q` a model samples from, and moves between vocabularies.

Every verification rule compares probability vectors, so the one place where logits become
probabilities is here. `q` must be the distribution the drafter *actually* sampled from —
after temperature, top-k/top-p and the vocabulary-intersection mask — or losslessness is
lost (a peer library's bug); `sampling_probs` is therefore used both to sample and to verify.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from specjax.runtime import debug
from specjax.verify.streams import argmax_first, categorical_data, key_data

_NEG_INF = -jnp.inf


def sampling_probs(
    logits: jax.Array,
    temperature,
    *,
    top_k: int = 0,
    top_p: float = 1.0,
    mask: jax.Array | None = None,
) -> jax.Array:
    """The exact distribution sampled from at `temperature` (0 = greedy one-hot).

    Args:
        logits: f32[..., V].
        temperature: scalar (python or traced) ≥ 0; 0 means argmax (ties → lowest id).
        top_k: static; keep the k most likely tokens (0 = off).
        top_p: static; nucleus filtering (1.0 = off).
        mask: optional bool[V] (or broadcastable); False tokens get probability 0 before
            temperature and filtering (the token-level intersection of rule 3).

    Returns:
        f32[..., V], rows summing to 1.
    """
    logits = logits.astype(jnp.float32)
    if mask is not None:
        logits = jnp.where(mask, logits, _NEG_INF)
    temperature = jnp.asarray(temperature, jnp.float32)

    def greedy(logits):
        # one_hot(argmax) (ties → lowest id), with the cheaper exact argmax of streams.
        iota = jax.lax.broadcasted_iota(jnp.int32, logits.shape, logits.ndim - 1)
        return (iota == argmax_first(logits)[..., None]).astype(jnp.float32)

    def tempered(logits):
        scaled = logits / jnp.maximum(temperature, 1e-6)
        if top_k and top_k < logits.shape[-1]:
            kth = jax.lax.top_k(scaled, top_k)[0][..., -1:]
            scaled = jnp.where(scaled >= kth, scaled, _NEG_INF)
        probs = jax.nn.softmax(scaled, axis=-1)
        if top_p < 1.0:
            order = jnp.argsort(-probs, axis=-1)
            sorted_p = jnp.take_along_axis(probs, order, axis=-1)
            # Keep the smallest prefix whose mass reaches top_p (the token crossing it included).
            keep_sorted = (jnp.cumsum(sorted_p, axis=-1) - sorted_p) < top_p
            keep = jnp.take_along_axis(keep_sorted, jnp.argsort(order, axis=-1), axis=-1)
            probs = jnp.where(keep, probs, 0.0)
            probs = probs / jnp.sum(probs, axis=-1, keepdims=True)
        return probs

    if temperature.ndim == 0:
        # One temperature for every row (a verifier's, a drafter's): only the branch that
        # is used runs. Both over the verifier's [B, γ+1, V] rows cost 0.5 ms (τ 0) to 3 ms
        # (τ 1) of a ~36 ms SmolLM2 round on XLA:CPU (docs/performance.md). Under a vmap
        # over a batched temperature this becomes the select below.
        out = jax.lax.cond(temperature > 0, tempered, greedy, logits)
    else:
        out = jnp.where(temperature > 0, tempered(logits), greedy(logits))
    # E.g. a mask that excludes every token, or non-finite logits (SPEC §9; tests only).
    debug.check_distribution(out, 'sampling_probs')
    return out


def sample(key: jax.Array, probs: jax.Array) -> jax.Array:
    """One token from each row of `probs` f32[..., V] → i32[...] (zero-probability ids never).

    `jax.random.categorical(key, log probs)` bit for bit, through the unrolled
    threefry (`specjax.verify.streams`): no PRNG loop on XLA:CPU."""
    return categorical_data(key_data(key), jnp.log(probs))


def residual(p: jax.Array, q: jax.Array) -> jax.Array:
    """`norm(max(0, p − q))`; falls back to `p` where the residual has no mass (p == q).

    The fallback is only reachable when a rejection had probability 0, so it never changes
    the output distribution; it keeps the arithmetic finite.
    """
    r = jnp.maximum(p - q, 0.0)
    z = jnp.sum(r, axis=-1, keepdims=True)
    out = jnp.where(z > 0, r / jnp.where(z > 0, z, 1.0), p)
    debug.check_distribution(out, 'residual')
    return out


def accept_test(u: jax.Array, p_x: jax.Array, q_x: jax.Array) -> jax.Array:
    """Accept with probability `min(1, p(x)/q(x))` given `u ~ U[0, 1)`: `u·q(x) < p(x)`.

    Written without a division so that `q(x) = 0` (a token the drafter could not have
    proposed) and `p(x) = q(x)` are exact.
    """
    return u * q_x < p_x


def to_verifier_space(
    q_drafter: jax.Array, drafter_to_verifier: jax.Array, verifier_vocab: int
) -> jax.Array:
    """Scatter a drafter distribution f32[..., Vd] onto verifier ids (rule 3, TLI).

    `drafter_to_verifier`: i32[Vd], the verifier id with identical bytes or -1. Mass on
    unmapped ids must already be 0 (sample with the intersection mask); it is dropped.
    """
    idx = jnp.where(drafter_to_verifier >= 0, drafter_to_verifier, verifier_vocab)
    out = jnp.zeros(q_drafter.shape[:-1] + (verifier_vocab + 1,), q_drafter.dtype)
    out = out.at[..., idx].add(q_drafter)
    return out[..., :verifier_vocab]


def gumbel_argmax(probs: jax.Array, gumbel: jax.Array) -> jax.Array:
    """Gumbel-max sample `argmax(log probs + g)` (rule 4, coupled); exact sample of `probs`."""
    return argmax_first(jnp.log(probs) + gumbel)
