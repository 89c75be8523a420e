"""What the hardware allows a forward: this machine's stream bandwidth, the bytes of weights
a forward reads, and a roofline projection of the same forward on accelerators.

The benchmarks print measured times beside these floors (`experiments/benchmark_real.py`):
a decode step bound by reading its weights sits near ``weight_bytes / stream_bandwidth``,
and on an accelerator serving a large verifier the (γ+1)-token score costs about one step
while ``bytes / bandwidth`` exceeds ``FLOPs / peak``.
"""

from __future__ import annotations

import os
import time

import jax
import jax.numpy as jnp

from specjax.measure.timing import forward_timer

__all__ = [
    "ACCELERATORS",
    "kv_bytes",
    "ratio_tables",
    "roofline",
    "roofline_seconds",
    "score_ratios",
    "step_floor",
    "stream_bandwidth",
    "weight_bytes",
]

#: Roofline figures (vendor data sheets): HBM bandwidth (bytes/s) and dense bf16 FLOP/s.
ACCELERATORS = {"TPU v5e (1 chip)": (819e9, 197e12), "H100 SXM": (3.35e12, 989e12)}


def stream_bandwidth(gib: float = 1.0, repeats: int = 5) -> float:
    """Bytes/s of a jitted f32 sum over a ``gib`` GiB array (a read-only stream), best of
    ``repeats`` after a warm-up."""
    x = jnp.ones((int(gib * 2**30) // 4,), jnp.float32)
    f = jax.jit(jnp.sum)
    f(x).block_until_ready()
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        f(x).block_until_ready()
        best = min(best, time.perf_counter() - t)
    return x.nbytes / best


def weight_bytes(params, tied: bool = True) -> int:
    """Bytes of weights one forward reads: every array, less the input embedding table
    when the head is its own array (``tied=False``: a forward gathers a few of the table's
    rows, it does not stream it)."""
    total = int(sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(params)))
    if not tied and "embed" in params:
        total -= int(params["embed"].size * params["embed"].dtype.itemsize)
    return total


def kv_bytes(cfg, batch: int, context: int) -> int:
    """Bytes of keys and values a one-token forward must read with ``context`` cached
    positions per row: every layer's over the positions it attends (a sliding-window
    layer's at most its window), at the cache's dtype (the compute dtype). A floor: the
    engine's attention may read more of the cache's slots than these."""
    per_position = 2 * cfg.n_kv_heads * cfg.head_dim * jnp.dtype(cfg.dtype).itemsize
    positions = sum(min(context, cfg.layer_window(i) or context) for i in range(cfg.n_layers))
    return int(batch * per_position * positions)


def step_floor(lm, params, batch: int, context: int, bandwidth: float) -> dict:
    """The bandwidth floor of one decode step of ``batch`` rows over ``context`` cached
    positions: the bytes it must read (the weights as stored, `weight_bytes`, and the KV
    cache, `kv_bytes`) ÷ ``bandwidth`` (bytes/s, `stream_bandwidth`)."""
    w = weight_bytes(params, tied=lm.config.tie_embeddings)
    kv = kv_bytes(lm.config, batch, context)
    return {"weight_bytes": w, "kv_bytes": kv, "floor_s": (w + kv) / bandwidth}


def roofline_seconds(
    cfg, n_params: int, k: int, batch: int, context: int, bandwidth: float, peak: float
) -> float:
    """Seconds of a k-token forward (``batch`` rows, ``context`` cached tokens) on one
    device of ``bandwidth`` bytes/s and ``peak`` FLOP/s: max(bytes / bandwidth, FLOPs /
    peak), bf16 weights and KV cache. ``cfg`` is a `TransformerConfig` (layers, KV heads,
    head and model widths)."""
    kv = 2 * cfg.n_layers * cfg.n_kv_heads * cfg.head_dim * 2 * batch * (context + k)
    byts = 2 * n_params + kv
    flops = 2 * n_params * batch * k + 4 * cfg.n_layers * cfg.d_model * batch * k * context
    return max(byts / bandwidth, flops / peak)


def roofline(cfg, n_params: int, k: int, batch: int, context: int) -> dict[str, float]:
    """`roofline_seconds` on each of `ACCELERATORS` (the model's own count; the TPU
    planner, `specjax.tpu.plan`, sets it beside the compiler's figures)."""
    return {
        name: roofline_seconds(cfg, n_params, k, batch, context, bw, peak)
        for name, (bw, peak) in ACCELERATORS.items()
    }


def score_ratios(label: str, lm, params, batches, ks, bw: float, context: int = 100) -> list[dict]:
    """T_step and T_score(k) of ``lm`` per batch size, beside its floors: one row per batch.

    The one-token and k-token forwards over ``context`` cached tokens are each jitted in a
    `lax.scan` (`specjax.measure.timing.forward_timer`), timed interleaved three times, min kept.
    A row holds the weight bytes a forward reads, the bandwidth floor (those bytes ÷ ``bw``),
    the times, T_score(k) / T_step, and the `roofline` projection of the same forwards.
    """

    n = sum(int(x.size) for x in jax.tree.leaves(params))
    wbytes = weight_bytes(params, tied=lm.config.tie_embeddings)
    ks = sorted({1} | {int(k) for k in ks})
    rows = []
    for batch in [int(b) for b in batches]:
        runs = {k: forward_timer(lm, params, batch, k, context, context + 92, 16) for k in ks}
        times = {k: [] for k in runs}
        for _ in range(3):
            for k, run in runs.items():
                times[k].append(run())
        t1 = min(times[1])
        roof = {k: roofline(lm.config, n, k, batch, context) for k in runs}
        rows.append(
            {
                "dtype": label,
                "batch": batch,
                "weight_bytes": wbytes,
                "floor_s": wbytes / bw,
                "t_step": t1,
                "t_score": {k: min(v) for k, v in times.items()},
                "ratio": {k: min(v) / t1 for k, v in times.items()},
                "roofline_ratio": {
                    name: {k: roof[k][name] / roof[1][name] for k in runs} for name in ACCELERATORS
                },
                "roofline_t_step": {name: roof[1][name] for name in ACCELERATORS},
                "load_average": list(os.getloadavg()),
            }
        )
    return rows


def ratio_tables(rows: list[dict], context: int = 100) -> list[str]:
    """Markdown of `score_ratios` rows (any number of layouts): the measured table, then
    the roofline projection per accelerator and batch size."""
    ks = sorted(rows[0]["ratio"], key=int)
    cols = " | ".join(f"k={k}" for k in ks)
    lines = [
        f"## T_score(k) / T_step (verifier forwards over {context} cached tokens)",
        "",
        f"| layout | B | T_step ms | floor ms | T_step / floor | {cols} |",
        "|---|---|---|---|---|" + "---|" * len(ks),
    ]
    for row in rows:
        lines.append(
            f"| {row['dtype']} | {row['batch']} | {1e3 * row['t_step']:.2f} | "
            f"{1e3 * row['floor_s']:.2f} | {row['t_step'] / row['floor_s']:.2f} | "
            + " | ".join(f"{row['ratio'][k]:.2f}" for k in ks)
            + " |"
        )
    lines += [
        "",
        "Roofline projection of the same forwards (bf16 weights and cache; "
        "bytes and FLOPs counted from the model), T_score(k) / T_step:",
        "",
        f"| accelerator | B | T_step µs | {cols} |",
        "|---|---|---|" + "---|" * len(ks),
    ]
    seen = set()
    for row in rows:
        for name, rr in row["roofline_ratio"].items():
            if (name, row["batch"]) in seen:
                continue
            seen.add((name, row["batch"]))
            lines.append(
                f"| {name} | {row['batch']} | {1e6 * row['roofline_t_step'][name]:.1f} | "
                + " | ".join(f"{rr[k]:.2f}" for k in ks)
                + " |"
            )
    return lines + [""]
