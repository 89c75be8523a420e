r"""The real verifier's forward in two parameter layouts, timed alternating in one process.

  python experiments/compare_layouts.py                      # separate vs fused, f32
  python experiments/compare_layouts.py --layouts float32,float32:fused,bfloat16:fused \
      --batches 1,8 --ks 1,2,4,6

A layout is ``dtype[:token+token]``; tokens: ``tied`` (keep the file's tied head; default
unties it, as the deployment does), ``fused`` (q/k/v in one product and gate/up in one:
`specjax.models.api.fuse_projections`), ``out_first`` (projection weights stored
``[out, in]``, the head ``[V, D]``: `specjax.models.api.order_weights`) and ``einsum``
(the weight products traced as
before `specjax.models.products.project`: an einsum in the compute dtype, no f32
accumulation in half precision, a one-row product not padded) and ``float_ops`` (a 16-bit
cache written and the embedding rows gathered as float ops, as before
`specjax.models.cache.half_set`: XLA:CPU runs them in f32). Every layout is loaded first; then each round
times every (layout, batch, k) once, in a fixed interleaved order, so load changes hit
every layout alike. Reported: per (layout, batch, k) the median seconds per forward over
the rounds, T_score(k) / T_step, and each layout's time over the first layout's, with
the median of the per-round paired ratios (a layout and the first one timed back to back).
The logits of every layout are checked equal to the first's (max |Δ| printed).

Writes ``layouts.json`` under --out, and with ``--write_docs`` <docs_dir>/<doc_name>.md
(command, commit, date, machine and load on top; ``--docs_dir`` default runs/layouts:
docs/results holds one page per question and this one has none there; the runs it made
are listed in docs/performance.md).
"""

from __future__ import annotations

import contextlib
import statistics
from pathlib import Path

import jax.numpy as jnp
import numpy as np
from absl import flags

from specjax.errors import ConfigError
from specjax.measure.timing import forward_timer
from specjax.models import cache, products
from specjax.models.gguf import parse_layout, smollm2_layout
from specjax.runner import provenance
from specjax.runner import script_flags as sf

FLAGS = flags.FLAGS
#: Tokens of this script beside the loader's (`specjax.models.gguf.LAYOUT_TOKENS`).
EXTRA_TOKENS = ("einsum", "float_ops")


def define_flags():
    flags.DEFINE_list(
        "layouts",
        ["float32", "float32:fused"],
        "dtype[:token+token] each (tokens: module docstring)",
    )
    flags.DEFINE_list("batches", ["1"], "batch sizes")
    flags.DEFINE_list("ks", ["1", "2", "4", "6"], "forward widths (1 = T_step)")
    flags.DEFINE_integer("rounds", 7, "interleaved rounds")
    flags.DEFINE_integer("reps", 32, "forwards per timed loop")
    flags.DEFINE_integer("context", 100, "cached tokens each forward attends over")
    flags.DEFINE_integer("capacity", 0, "cache slots (0: context + 16)")
    provenance.define_common_flags(out="runs/layouts", page="layouts", docs_dir="runs/layouts")
    flags.DEFINE_string(
        "doc_name", "layouts", "name of the page --write_docs writes (<docs_dir>/<doc_name>.md)"
    )


def validate() -> None:
    """Every flag, before anything is printed, loaded or written (`sf.run`): a
    `ConfigError` naming the flag, its value and what is allowed."""
    sf.check(FLAGS.layouts, "--layouts", "", "one or more layouts")
    for s in FLAGS.layouts:
        parse_layout(s, "--layouts", EXTRA_TOKENS)
    sf.integers("--batches", FLAGS.batches, 1, 1024)
    ks = sf.integers("--ks", FLAGS.ks, 1, 256)
    sf.integer("--rounds", FLAGS.rounds, 1, 1000)
    sf.integer("--reps", FLAGS.reps, 1, 100_000)
    sf.integer("--context", FLAGS.context, 1, 4096)
    if FLAGS.capacity and FLAGS.capacity < FLAGS.context + max(ks):
        raise ConfigError.invalid(
            "--capacity",
            FLAGS.capacity,
            f"0 or >= --context + the widest k ({FLAGS.context + max(ks)})",
        )
    sf.integer("--capacity", FLAGS.capacity, 0, 8192)
    sf.check(
        FLAGS.doc_name and "/" not in FLAGS.doc_name and FLAGS.doc_name not in (".", ".."),
        "--doc_name",
        FLAGS.doc_name,
        "a file name (no '/')",
    )


@contextlib.contextmanager
def traced_as(tokens: set):
    """Traces inside with `products.PRODUCTS` off for an ``einsum`` layout and
    `cache.HALF_AS_BITS` off for a ``float_ops`` one."""
    old = products.PRODUCTS, cache.HALF_AS_BITS
    products.PRODUCTS = "flat" if "einsum" not in tokens else "einsum"
    cache.HALF_AS_BITS = False if "float_ops" in tokens else old[1]
    try:
        yield
    finally:
        products.PRODUCTS, cache.HALF_AS_BITS = old


def _compiled(layouts, batches, ks, capacity) -> tuple:
    """Every layout loaded and its forward timers compiled per (B, k): (models, timers)."""
    models, timers = {}, {}
    for spec, _, tokens in layouts:
        m = smollm2_layout(
            spec, max_len=max(512, FLAGS.capacity), field="--layouts", extra=EXTRA_TOKENS
        )
        models[spec] = m
        with traced_as(tokens):
            for b in batches:
                for k in ks:
                    timers[spec, b, k] = forward_timer(
                        m.lm,
                        m.params,
                        b,
                        k,
                        FLAGS.context,
                        capacity,
                        FLAGS.reps,
                    )
        print(f"{spec}: loaded and compiled", flush=True)
    return models, timers


def _logit_diffs(layouts, models, ref: str) -> dict:
    """Each layout's max |Δ| of its logits to the first layout's, on 32 tokens."""
    toks = jnp.asarray(np.arange(1, 33, dtype=np.int32)[None] + 100)
    logits = {}
    for s, _, tokens in layouts:
        with traced_as(tokens):
            logits[s] = models[s].lm.logits_full(models[s].params, toks)
    return {s: float(jnp.abs(logits[s] - logits[ref]).max()) for s in logits}


def _rows(times: dict, layouts, batches, ks, ref: str, diffs: dict) -> list[dict]:
    """Per (layout, B, k): median and min ms, T_score(k) / T_step, the paired ratio to the
    first layout, the logits' Δ."""
    rows = []
    for spec, _, _ in layouts:
        for b in batches:
            step = statistics.median(times[spec, b, 1])
            for k in ks:
                t = times[spec, b, k]
                paired = [x / y for x, y in zip(t, times[ref, b, k])]
                rows.append(
                    {
                        "layout": spec,
                        "batch": b,
                        "k": k,
                        "ms": 1e3 * statistics.median(t),
                        "min_ms": 1e3 * min(t),
                        "score_over_step": statistics.median(t) / step,
                        "over_first": statistics.median(paired),
                        "max_abs_logit_diff": diffs[spec],
                    }
                )
    return rows


def _table(rows: list[dict], ref: str) -> str:
    """The rows as a markdown table."""
    header = (
        "| layout | B | k | ms (median) | ms (min) | T_score(k) / T_step | ÷ "
        f"{ref} (paired median) | max abs logit Δ |\n|---|---|---|---|---|---|---|---|\n"
    )
    return header + "".join(
        f"| {r['layout']} | {r['batch']} | {r['k']} | {r['ms']:.2f} | {r['min_ms']:.2f} | "
        f"{r['score_over_step']:.2f} | {r['over_first']:.3f} | {r['max_abs_logit_diff']:.1e} |\n"
        for r in rows
    )


def main(argv):
    del argv
    # The flags were checked by `validate`.
    layouts = [(s, *parse_layout(s, "--layouts", EXTRA_TOKENS)) for s in FLAGS.layouts]
    batches = [int(b) for b in FLAGS.batches]
    ks = sorted({int(k) for k in FLAGS.ks} | {1})
    capacity = FLAGS.capacity or FLAGS.context + 16
    prov = provenance.provenance()
    models, timers = _compiled(layouts, batches, ks, capacity)
    ref = layouts[0][0]
    diffs = _logit_diffs(layouts, models, ref)
    times = {key: [] for key in timers}
    for r in range(FLAGS.rounds):
        for b in batches:
            for k in ks:
                for spec, _, _ in layouts:
                    times[spec, b, k].append(timers[spec, b, k]())
    rows = _rows(times, layouts, batches, ks, ref, diffs)
    table = _table(rows, ref)
    print(table)
    print(
        f"load average {prov['machine'].get('load_average')} at the start, "
        f"{provenance.load_average()} at the end"
    )
    body = [
        f"Each round times every (layout, B, k) once, interleaved; {FLAGS.rounds} rounds of "
        f"{FLAGS.reps} forwards over {FLAGS.context} cached tokens in a cache of "
        f"{FLAGS.capacity or FLAGS.context + 16} slots "
        "(`experiments/compare_layouts.py`'s docstring).",
        "",
        table,
    ]
    provenance.write_outputs(
        Path(FLAGS.out) / "layouts.json",
        {"rows": rows},
        prov,
        page=FLAGS.doc_name if FLAGS.write_docs else None,
        title="The real verifier's forward by parameter layout",
        body=lambda _: body,
        docs_dir=FLAGS.docs_dir,
    )


if __name__ == "__main__":
    define_flags()
    sf.run(main, validate, "compare_layouts")
