"""A decode step's cost against the cache's capacity: whole read vs blocked read.

  python experiments/cache_read.py                          # B = 8, 32; capacity 128, 256, 512
  python experiments/cache_read.py --batches 32 --capacities 256,512,1024 --repeats 5

The zoo verifier decodes `--steps` tokens greedily in a jitted `lax.scan` that carries its
KV cache (as the engine's loops do), starting from `--filled` committed slots, so at most
`filled + steps` slots are ever committed whatever the capacity. Each capacity is timed with
the cache read whole (one dot over every slot, `CACHE_MIN_BLOCKS` set past the block count)
and read in blocks (`specjax.models.transformer.cache_attention`: only the blocks of
`CACHE_CHUNK` slots that hold a committed slot; here from two blocks on), alternately in one process (paired; the
minimum over `--repeats` runs), next to the verifier's matmul floor at the same batch
(`specjax.measure.timing.matmul_floor`). Prints a table and writes ``cache_read.json`` under --out;
about 2 minutes at the defaults on 2 cores.
"""

from __future__ import annotations

import time
from pathlib import Path

import jax
import jax.numpy as jnp
from absl import flags

from specjax.engine.deployment import from_zoo
from specjax.measure.timing import matmul_floor
from specjax.models import transformer
from specjax.models.api import causal_block_mask
from specjax.models.zoo import load_zoo
from specjax.runner import provenance
from specjax.runner import script_flags as sf

FLAGS = flags.FLAGS


def define_flags():
    """The script's flags (defined only when it runs as a script)."""
    provenance.define_common_flags(out="runs/cache_read", repeats=5)
    flags.DEFINE_list("batches", ["8", "32"], "batch sizes")
    flags.DEFINE_list("capacities", ["128", "256", "512"], "cache capacities (slots per row)")
    flags.DEFINE_integer("filled", 32, "committed slots per row before the timed steps")
    flags.DEFINE_integer("steps", 64, "decode steps per timed run")
    flags.DEFINE_string("zoo", None, "zoo path (default: the shipped zoo)")


def validate() -> None:
    """Every flag, before anything is printed, loaded or written (`sf.run`): a
    `ConfigError` naming the flag, its value and what is allowed."""
    _, manifest = sf.zoo("--zoo", FLAGS.zoo)
    max_len = int(manifest["models"]["verifier"]["config"]["max_len"])
    sf.integers("--batches", FLAGS.batches, 1, 1024)
    filled = sf.integer("--filled", FLAGS.filled, 0, max_len - 1)
    steps = sf.integer("--steps", FLAGS.steps, 1, max_len)
    sf.integers("--capacities", FLAGS.capacities, filled + steps, max_len)


def _decode_loop(lm, batch: int, steps: int):
    @jax.jit
    def loop(params, cache, tok):
        def body(c, _):
            cache, tok = c
            logits, cache = lm.forward(
                params, cache, tok, cache.length[:, None], causal_block_mask(batch, 1)
            )
            cache = lm.advance(cache, 1)
            return (cache, jnp.argmax(logits[:, 0], -1).astype(jnp.int32)[:, None]), None

        (_, tok), _ = jax.lax.scan(body, (cache, tok), None, length=steps)
        return tok

    return loop


def main(argv):
    del argv
    prov = provenance.provenance()
    full = from_zoo(load_zoo(FLAGS.zoo))
    v, vp = full.verifier, full.v_params
    print(
        f"zoo verifier, {FLAGS.steps} greedy steps from {FLAGS.filled} filled slots; "
        f"blocks of {transformer.CACHE_CHUNK} slots ('blocked' reads every cache of 2 or "
        f"more blocks in blocks; the engine's default does from "
        f"{transformer.CACHE_MIN_BLOCKS} blocks on)"
    )
    print(
        f"{'B':>3} {'capacity':>8} {'whole ms/step':>13} {'blocked ms/step':>15} "
        f"{'whole/blocked':>13} {'floor ms/step':>13}"
    )
    default_min = transformer.CACHE_MIN_BLOCKS
    rows = []
    for batch in (int(b) for b in FLAGS.batches):
        floor = batch / matmul_floor(v, vp, batch)
        for cap in (int(c) for c in FLAGS.capacities):
            cache = v.advance(v.init_cache(batch, cap), jnp.full((batch,), FLAGS.filled, jnp.int32))
            tok = jnp.ones((batch, 1), jnp.int32)
            exes = {}
            for name, min_blocks in (("whole", 10**9), ("blocked", 2)):
                transformer.CACHE_MIN_BLOCKS = min_blocks  # read at trace time
                try:
                    loop = _decode_loop(v, batch, FLAGS.steps)
                    exes[name] = loop.lower(vp, cache, tok).compile()
                finally:
                    transformer.CACHE_MIN_BLOCKS = default_min
            best = {name: float("inf") for name in exes}
            for _ in range(FLAGS.repeats):  # alternately: load drift hits both alike
                for name, exe in exes.items():
                    best[name] = min(best[name], _time_exe(exe, vp, cache, tok))
            w, b = (best[k] / FLAGS.steps * 1e3 for k in ("whole", "blocked"))
            print(
                f"{batch:3d} {cap:8d} {w:13.3f} {b:15.3f} {w / b:13.2f} {floor * 1e3:13.3f}",
                flush=True,
            )
            rows.append(
                dict(
                    batch=batch,
                    capacity=cap,
                    whole_ms_per_step=w,
                    blocked_ms_per_step=b,
                    whole_over_blocked=w / b,
                    floor_ms_per_step=floor * 1e3,
                )
            )
    result = dict(
        rows=rows,
        filled=FLAGS.filled,
        steps=FLAGS.steps,
        repeats=FLAGS.repeats,
        cache_chunk=transformer.CACHE_CHUNK,
        cache_min_blocks=default_min,
    )
    print(f"wrote {provenance.write_json(Path(FLAGS.out) / 'cache_read.json', result, prov)}")


def _time_exe(exe, *args) -> float:
    """Seconds of one run of a compiled program, after one untimed run."""
    jax.block_until_ready(exe(*args))
    t0 = time.perf_counter()
    jax.block_until_ready(exe(*args))
    return time.perf_counter() - t0


if __name__ == "__main__":
    define_flags()
    sf.run(main, validate, "cache_read")
