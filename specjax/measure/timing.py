"""Timed building blocks of the benchmarks (jitted `lax.scan` loops, AOT-compiled; the
compilation and a first warm-up run are excluded)."""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp

from specjax.models.api import causal_block_mask
from specjax.models.cache import half_take

__all__ = ["compiled_timer", "forward_timer", "time_forward", "time_prefill", "matmul_floor"]


def compiled_timer(fn, args: tuple, per: int = 1):
    """`fn(*args)` compiled ahead of time and run once (a warm-up); calling the returned
    function runs it again and returns its seconds divided by `per`. The executable and
    its arguments are attributes (`executable`, `args`)."""
    exe = fn.lower(*args).compile()
    jax.block_until_ready(exe(*args))

    def run() -> float:
        t0 = time.perf_counter()
        jax.block_until_ready(exe(*args))
        return (time.perf_counter() - t0) / per

    run.executable, run.args = exe, args
    return run


def _time(fn, *args, repeats: int = 5) -> float:
    """Seconds of one run of an ahead-of-time compiled `fn(*args)` (min over repeats)."""
    run = compiled_timer(fn, args)
    return min(run() for _ in range(repeats))


def forward_timer(lm, params, batch: int, width: int, context: int, capacity: int, reps: int = 64):
    """A compiled (and once run) loop of `reps` `width`-token forwards at batch `batch` over
    `context` cached tokens in a cache of `capacity` slots (`compiled_timer`): calling the
    returned function runs it once and returns the seconds per forward.

    The cache is carried through the loop, as the engine carries it, so every rep writes
    its block in place at the same slots and its committed length is not advanced (every
    rep attends over the same `context` slots). A loop that closed over the cache instead
    would copy the whole cache on every rep (XLA cannot write in place into a buffer the
    next rep reads again): 0.85 ms of a 4.75 ms step at batch 32, capacity 192."""

    @jax.jit
    def loop(params, cache, tokens):
        pos = cache.length[:, None] + jnp.arange(width)[None, :]

        def body(carry, i):
            acc, cache = carry
            logits, cache = lm.forward(
                params, cache, (tokens + i) % lm.vocab_size, pos, causal_block_mask(batch, width)
            )
            return (acc + logits[:, -1, 0], cache), None

        return jax.lax.scan(body, (jnp.zeros((batch,)), cache), jnp.arange(reps))[0][0]

    cache = lm.init_cache(batch, capacity)
    cache = lm.advance(cache, jnp.full((batch,), context, jnp.int32))
    return compiled_timer(loop, (params, cache, jnp.ones((batch, width), jnp.int32)), reps)


def time_forward(
    lm,
    params,
    batch: int,
    width: int,
    context: int,
    capacity: int,
    reps: int = 64,
    repeats: int = 5,
) -> float:
    """Seconds per forward of `forward_timer`'s loop (the minimum over `repeats` runs)."""
    run = forward_timer(lm, params, batch, width, context, capacity, reps)
    return min(run() for _ in range(repeats))


def time_prefill(lm, params, prompts, capacity: int, bucket: int = 1, repeats: int = 5) -> float:
    """Seconds of the engine's own prefill of these prompts (`engine.prefill.prefill`,
    every token but each prompt's last cached, into a cache of `capacity` slots): what an
    `autoregressive_generate` call of them pays before its first decode step — ragged
    (`prefill_groups`) where the call's is. Minimum over `repeats` runs after a warm-up."""
    from specjax.engine.prefill import prefill  # pylint: disable=import-outside-toplevel

    cached = [len(p) - 1 for p in prompts]
    best = float("inf")
    for i in range(repeats + 1):
        _, _, seconds = prefill(
            lm, params, prompts, capacity=capacity, cached=cached, bucket=bucket
        )
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
    if cfg.fused_projections or cfg.out_first:
        raise ValueError(
            "matmul_floor: the default layout's parameters (allowed: fused_projections "
            f"and out_first False; got {cfg.fused_projections}, {cfg.out_first})"
        )

    @jax.jit
    def loop(params, tok):
        head = params["embed"].T if cfg.tie_embeddings else params["lm_head"]

        def step(tok, _):
            x = half_take(params["embed"], tok, dtype=cfg.param_dtype)  # [B, D]
            for i in range(cfg.n_layers):
                p = params[f"layer_{i}"]
                h = _rms(x, p["attn_norm"]["scale"])
                a = p["attn"]
                # Two-dimensional products of the weights as stored (reshapes are free):
                # an einsum over [D, H, hd] / [H, hd, D] let XLA:CPU pick slower layouts,
                # and the floor ran slower than the engine's own decode step at batch 1.
                q = h @ a["wq"].reshape(a["wq"].shape[0], -1)  # [B, H·hd]
                k = h @ a["wk"].reshape(a["wk"].shape[0], -1)  # [B, KV·hd]
                v = h @ a["wv"].reshape(a["wv"].shape[0], -1)
                kv = (k + v).reshape(k.shape[0], -1, a["wk"].shape[-1])
                o = q + jnp.repeat(kv, g, axis=1).reshape(q.shape)
                x = x + o @ a["wo"].reshape(-1, a["wo"].shape[-1])
                h = _rms(x, p["mlp_norm"]["scale"])
                x = (
                    x
                    + (jax.nn.silu(h @ p["mlp"]["w_gate"]) * (h @ p["mlp"]["w_up"]))
                    @ p["mlp"]["w_down"]
                )
            logits = _rms(x, params["final_norm"]["scale"]) @ head
            return jnp.argmax(logits, -1).astype(jnp.int32), None

        return jax.lax.scan(step, tok, None, length=steps)[0]

    return batch * steps / _time(loop, params, jnp.zeros((batch,), jnp.int32))
