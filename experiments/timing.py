"""Timed building blocks of the benchmarks (jitted `lax.scan` loops, AOT-compiled; the
compilation and a first warm-up run are excluded)."""
from __future__ import annotations

import time

import jax
import jax.numpy as jnp

from specjax.models.api import causal_block_mask

__all__ = ["time_forward", "time_prefill", "matmul_floor"]


def _time(fn, *args, repeats: int = 5) -> float:
    """Seconds of one run of an ahead-of-time compiled `fn(*args)` (min over repeats)."""
    exe = fn.lower(*args).compile()
    jax.block_until_ready(exe(*args))
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(exe(*args))
        best = min(best, time.perf_counter() - t0)
    return best


def time_forward(lm, params, batch: int, width: int, context: int, capacity: int,
                 reps: int = 64) -> float:
    """Seconds per `width`-token forward at batch `batch` over `context` cached tokens in a
    cache of `capacity` slots (the state is not advanced: every rep reads the same cache)."""
    @jax.jit
    def loop(params, cache, tokens):
        pos = cache.length[:, None] + jnp.arange(width)[None, :]

        def body(acc, i):
            logits, _ = lm.forward(params, cache, (tokens + i) % lm.vocab_size, pos,
                                   causal_block_mask(batch, width))
            return acc + logits[:, -1, 0], None
        return jax.lax.scan(body, jnp.zeros((batch,)), jnp.arange(reps))[0]

    cache = lm.init_cache(batch, capacity)
    cache = lm.advance(cache, jnp.full((batch,), context, jnp.int32))
    return _time(loop, params, cache, jnp.ones((batch, width), jnp.int32)) / reps


def time_prefill(lm, params, prompts, capacity: int, bucket: int = 1,
                 repeats: int = 5) -> float:
    """Seconds of the engine's own prefill of these prompts (`engine.prefill.prefill`,
    every token but each prompt's last cached, into a cache of `capacity` slots): what an
    `autoregressive_generate` call of them pays before its first decode step — ragged
    (`prefill_groups`) where the call's is. Minimum over `repeats` runs after a warm-up."""
    from specjax.engine.prefill import prefill  # pylint: disable=import-outside-toplevel
    cached = [len(p) - 1 for p in prompts]
    best = float("inf")
    for i in range(repeats + 1):
        _, _, seconds = prefill(lm, params, prompts, capacity=capacity, cached=cached,
                                bucket=bucket)
        if i:
            best = min(best, seconds)
    return best


def _rms(x, scale):
    return x * jax.lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + 1e-6) * scale


def matmul_floor(lm, params, batch: int, steps: int = 64) -> float:
    """Tokens/s of the verifier's own weight matmuls alone at batch `batch`: greedy decoding
    through embedding, q/k/v/o and SwiGLU projections and the head (attention replaced by
    the sum of q, k and v, no cache, no sampling), in a jitted `lax.scan`."""
    cfg = lm.config
    g = cfg.n_heads // cfg.n_kv_heads

    @jax.jit
    def loop(params, tok):
        head = params["embed"].T if cfg.tie_embeddings else params["lm_head"]

        def step(tok, _):
            x = params["embed"][tok]                                   # [B, D]
            for i in range(cfg.n_layers):
                p = params[f"layer_{i}"]
                h = _rms(x, p["attn_norm"]["scale"])
                q = jnp.einsum("bd,dnh->bnh", h, p["attn"]["wq"])
                k = jnp.einsum("bd,dnh->bnh", h, p["attn"]["wk"])
                v = jnp.einsum("bd,dnh->bnh", h, p["attn"]["wv"])
                o = q + jnp.repeat(k + v, g, axis=1)
                x = x + jnp.einsum("bnh,nhd->bd", o, p["attn"]["wo"])
                h = _rms(x, p["mlp_norm"]["scale"])
                x = x + (jax.nn.silu(h @ p["mlp"]["w_gate"]) * (h @ p["mlp"]["w_up"])
                         ) @ p["mlp"]["w_down"]
            logits = _rms(x, params["final_norm"]["scale"]) @ head
            return jnp.argmax(logits, -1).astype(jnp.int32), None
        return jax.lax.scan(step, tok, None, length=steps)[0]

    return batch * steps / _time(loop, params, jnp.zeros((batch,), jnp.int32))
