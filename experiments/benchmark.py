"""Speculative vs autoregressive decoding on the zoo, against Leviathan's bound.

  python experiments/benchmark.py --out runs/benchmark            # all drafters, γ = 1..8
  python experiments/benchmark.py --drafters code --gammas 1,2,4 --batches 1

For each drafter (alone, rule 1) × γ × batch size, measured in one run, interleaved with the
autoregressive baseline, medians of repeats:
  * verifier-only and speculative tokens/s (compilation excluded);
  * measured α (each chain tested alone against p, per position) and tokens per round;
  * c = T_draft / T_step, both measured (one-token steps inside a jitted lax.scan);
  * T_score, the verifier's (γ+1)-token scoring pass, measured the same way;
  * Leviathan's predicted speedup (1 − α^{γ+1}) / ((1 − α)(γc + 1));
  * the hardware-aware prediction E · T_step / (γ · T_draft + T_score), E = measured tokens
    per round, and measured speedup / hardware-aware prediction (what the engine loses to
    its own overheads: sampling, rollback, cache bookkeeping).
Prints a table and writes benchmark.json.
"""
from __future__ import annotations

import functools
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from absl import app, flags  # noqa: E402

from specjax import metrics  # noqa: E402
from specjax.data import load_prompts  # noqa: E402
from specjax.engine.decode import _causal  # noqa: E402
from specjax.engine.generate import (autoregressive_generate, row_keys_for,  # noqa: E402
                                     speculative_generate)
from specjax.engine.spec import EngineConfig  # noqa: E402
from specjax.models.zoo import load_zoo  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_string("out", "runs/benchmark", "output directory (benchmark.json)")
flags.DEFINE_list("drafters", ["code"], "drafters to benchmark (code shares the verifier's tokenizer)")
flags.DEFINE_list("gammas", [str(g) for g in range(1, 9)], "γ values")
flags.DEFINE_list("batches", ["1", "8"], "batch sizes")
flags.DEFINE_integer("new_tokens", 64, "tokens generated per row")
flags.DEFINE_integer("repeats", 3, "repeats per measurement (median)")
flags.DEFINE_float("verifier_temperature", 1.0, "τ of the verifier")
flags.DEFINE_string("zoo", None, "zoo path (default: $SPECJAX_ZOO, else the shipped specjax/zoo)")


@functools.partial(jax.jit, static_argnames=("lm", "width", "reps"))
def _forward_loop(lm, params, cache, tokens, width, reps):
    """`reps` forwards of a `width`-token block on the same cache (state is not advanced)."""
    b = tokens.shape[0]
    pos = cache.length[:, None] + jnp.arange(width)[None, :]

    def body(acc, i):
        logits, _ = lm.forward(params, cache, (tokens + i) % lm.vocab_size, pos, _causal(b, width))
        return acc + logits[:, -1, 0], None
    return jax.lax.scan(body, jnp.zeros((b,)), jnp.arange(reps))[0]


def time_forward(lm, params, batch: int, width: int, context: int, reps: int = 64,
                 repeats: int = 5) -> float:
    """Seconds per `width`-token forward at batch `batch` over a cache of `context` tokens."""
    cache = lm.init_cache(batch)
    cache = lm.advance(cache, jnp.full((batch,), context, jnp.int32))
    tokens = jnp.ones((batch, width), jnp.int32)
    jax.block_until_ready(_forward_loop(lm, params, cache, tokens, width, reps))
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(_forward_loop(lm, params, cache, tokens, width, reps))
        times.append((time.perf_counter() - t0) / reps)
    return statistics.median(times)


def main(argv):
    del argv
    zoo = load_zoo(FLAGS.zoo)
    full = zoo.deployment()
    prompts_text = [p["prompt"] for p in load_prompts()]
    out = Path(FLAGS.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    v = full.verifier
    context = 64
    t_step = {}
    for batch in map(int, FLAGS.batches):
        t_step[batch] = time_forward(v, full.v_params, batch, 1, context)
    header = (f"{'drafter':9} {'γ':>2} {'B':>2} {'AR tok/s':>9} {'spec tok/s':>10} {'α':>5} "
              f"{'tok/rnd':>7} {'c':>5} {'Tscore/Tstep':>12} {'Leviathan':>9} {'hw-aware':>8} "
              f"{'measured':>8} {'meas/hw':>7}")
    print(header)
    for name in FLAGS.drafters:
        dep = full.subset([name])
        spec_d, data = dep.drafters[0], dep.d_data[0]
        for batch in map(int, FLAGS.batches):
            t_draft = time_forward(spec_d.lm, data.params, batch, 1, context)
            texts = (prompts_text * (batch // len(prompts_text) + 1))[:batch]
            v_prompts = [dep.encode(t) for t in texts]
            d_prompts = [[dep.drafter_encode[0](t) for t in texts]]
            keys = row_keys_for(0, batch)
            for gamma in map(int, FLAGS.gammas):
                t_score = time_forward(v, full.v_params, batch, gamma + 1, context)
                cfg = EngineConfig(gamma=gamma, rule="rejection",
                                   verifier_temperature=FLAGS.verifier_temperature,
                                   max_new_tokens=FLAGS.new_tokens)
                ar_s, sp_s, counters = [], [], None
                for _ in range(FLAGS.repeats):  # interleaved
                    ar = autoregressive_generate(v, full.v_params, v_prompts, keys,
                                                 temperature=FLAGS.verifier_temperature,
                                                 max_new_tokens=FLAGS.new_tokens, bucket=64)
                    ar_s.append(float((ar.length - ar.start).sum()) / ar.seconds)
                    sp = speculative_generate(cfg, v, full.v_params, dep.drafters, dep.d_data,
                                              v_prompts, d_prompts, keys, bucket=64)
                    sp_s.append(float((sp.length - sp.start).sum()) / sp.seconds)
                    counters = sp.counters
                c = counters
                alpha = float(c.own_accepted_at.sum() / max(c.own_reached_at.sum(), 1))
                per_round = float(c.committed.sum() / max(c.rounds.sum(), 1))
                cc = t_draft / t_step[batch]
                lev = float(metrics.leviathan_speedup(alpha, gamma, cc))
                hw = float(metrics.hardware_aware_speedup(per_round, t_step[batch], t_draft,
                                                          t_score, gamma))
                measured = statistics.median(sp_s) / statistics.median(ar_s)
                row = dict(drafter=name, gamma=gamma, batch=batch,
                           ar_tokens_per_s=statistics.median(ar_s),
                           spec_tokens_per_s=statistics.median(sp_s), alpha=alpha,
                           tokens_per_round=per_round, c=cc, t_step=t_step[batch],
                           t_draft=t_draft, t_score=t_score,
                           leviathan_expected_tokens=float(
                               metrics.leviathan_expected_tokens(alpha, gamma)),
                           leviathan_speedup=lev, hardware_aware_speedup=hw,
                           measured_speedup=measured, measured_over_hardware_aware=measured / hw)
                rows.append(row)
                print(f"{name:9} {gamma:2d} {batch:2d} {row['ar_tokens_per_s']:9.1f} "
                      f"{row['spec_tokens_per_s']:10.1f} {alpha:5.2f} {per_round:7.2f} {cc:5.2f} "
                      f"{t_score / t_step[batch]:12.2f} {lev:9.2f} {hw:8.2f} {measured:8.2f} "
                      f"{measured / hw:7.2f}", flush=True)
    result = {"rows": rows, "verifier_temperature": FLAGS.verifier_temperature,
              "new_tokens": FLAGS.new_tokens, "repeats": FLAGS.repeats,
              "devices": [str(d) for d in jax.devices()], "jax": jax.__version__}
    tmp = out / "benchmark.json.tmp"
    tmp.write_text(json.dumps(result, indent=1))
    os.replace(tmp, out / "benchmark.json")
    best = max(rows, key=lambda r: r["measured_speedup"])
    print(f"\nbest: {best['drafter']} γ={best['gamma']} B={best['batch']}: measured "
          f"{best['measured_speedup']:.2f}× vs hardware-aware {best['hardware_aware_speedup']:.2f}× "
          f"(ratio {best['measured_over_hardware_aware']:.2f}); Leviathan "
          f"{best['leviathan_speedup']:.2f}×")


if __name__ == "__main__":
    app.run(main)
