r"""T_score / T_step against the verifier's size: when can speculation pay on this machine?

  python experiments/score_ratio.py
  python experiments/score_ratio.py --sizes 256:4,1024:8 --blocks 3,5 --out runs/score_ratio

A speculative round costs one (γ+1)-token verifier forward, T_score, against one token per
autoregressive step, T_step. With a drafter of acceptance α and cost ratio c, the expected
speed-up is E(α, γ) / (T_score / T_step + γ·c) (`specjax.metrics.hardware_aware_speedup`,
E = (1 − α^(γ+1)) / (1 − α), `leviathan_expected_tokens`). On an accelerator a few-token
forward of a large model is memory-bound and T_score ≈ T_step; on a CPU the ratio depends
on the size of the weights.

For every `d_model:n_layers` in `--sizes` (random weights, the zoo verifier's proportions:
d_ff = 2.69·d, heads of 64, vocabulary 1,024) this times a one-token forward at batch 1 over
`--context` cached tokens and every block width in `--blocks`, jitted in a `lax.scan`
(`specjax.measure.timing.time_forward`), prints T_step, each T_score / T_step and the speed-up
the zoo's measured α would give at that ratio (`--alpha`, `--c`), and writes
``score_ratio.json`` under --out. About 4 minutes at the defaults on 2 cores (the d 2048
verifier is 1 GiB of weights).
"""

from __future__ import annotations

from pathlib import Path

import jax
from absl import flags

from specjax.errors import ConfigError
from specjax.runner import provenance
from specjax.runner import script_flags as sf

FLAGS = flags.FLAGS


def define_flags():
    """The script's flags (defined only when it runs as a script)."""
    provenance.define_common_flags(out="runs/score_ratio")
    flags.DEFINE_list(
        "sizes",
        ["256:4", "512:8", "1024:8", "2048:6"],
        "d_model:n_layers of the verifiers to time (256:4 is the zoo's)",
    )
    flags.DEFINE_list("blocks", ["3", "5"], "block widths γ + 1 to time against one token")
    flags.DEFINE_integer("context", 100, "cached tokens the forwards attend to")
    flags.DEFINE_integer("capacity", 192, "cache slots per row")
    flags.DEFINE_float(
        "alpha",
        0.63,
        "acceptance of the drafter the prediction assumes "
        "(the zoo's code drafter measures about 0.63)",
    )
    flags.DEFINE_float("c", 0.05, "drafter cost per token relative to T_step")


def verifier_config(d: int, layers: int, capacity: int):
    """The timed verifier of width `d` and `layers` layers: the zoo verifier's proportions
    (d_ff = 2.69·d, heads of 64, vocabulary 1,024)."""
    from specjax.models.transformer import TransformerConfig  # pylint: disable=import-outside-toplevel

    return TransformerConfig(
        vocab_size=1024,
        d_model=d,
        n_layers=layers,
        n_heads=max(4, d // 64),
        n_kv_heads=max(2, d // 256),
        d_ff=int(round(2.6875 * d)),
        max_len=max(512, capacity),
    )


def _sizes() -> list[tuple[int, int]]:
    """--sizes as (d_model, n_layers) pairs (checked by `validate`)."""
    return [tuple(int(v) for v in s.split(":")) for s in FLAGS.sizes]


def validate() -> None:
    """Every flag, before anything is printed, loaded or written (`sf.run`): a
    `ConfigError` naming the flag, its value and what is allowed."""
    allowed = (
        "d_model:n_layers entries, d_model in [64, 4096] (max(4, d_model // 64) heads of "
        "an even width, max(2, d_model // 256) KV heads dividing them), n_layers in [1, 64]"
    )
    text = ",".join(FLAGS.sizes)
    sf.check(FLAGS.sizes, "--sizes", text, allowed)
    for entry in FLAGS.sizes:
        parts = entry.split(":")
        sf.check(len(parts) == 2, "--sizes", text, f"{allowed} ({entry!r} does not parse)")
        try:
            d = sf.integer("--sizes", parts[0], 64, 4096)
            layers = sf.integer("--sizes", parts[1], 1, 64)
            verifier_config(d, layers, 512)
        except ValueError:  # a ConfigError, or the config's own refusal
            raise ConfigError.invalid("--sizes", text, f"{allowed} ({entry!r} is not)") from None
    blocks = sf.integers("--blocks", FLAGS.blocks, 2, 64)
    context = sf.integer("--context", FLAGS.context, 1, 4096)
    sf.integer("--capacity", FLAGS.capacity, context + max(blocks), 8192)
    sf.number("--alpha", FLAGS.alpha, 0.0, 1.0)
    sf.number("--c", FLAGS.c, 0.0, 100.0)


def measure(sizes, blocks, context=100, capacity=192, alpha=0.63, c=0.05) -> list[dict]:
    from specjax.measure.timing import time_forward  # pylint: disable=import-outside-toplevel
    from specjax.metrics import (
        hardware_aware_speedup,  # pylint: disable=import-outside-toplevel
        leviathan_expected_tokens,
    )
    from specjax.models.api import TransformerLM  # pylint: disable=import-outside-toplevel

    rows = []
    for d, layers in sizes:
        lm = TransformerLM(verifier_config(d, layers, capacity))
        params = lm.init_params(0)
        n = sum(int(x.size) for x in jax.tree.leaves(params))
        reps = 64 if n < 50e6 else 16
        t_step = time_forward(lm, params, 1, 1, context, capacity, reps=reps)
        row = dict(
            d_model=d,
            n_layers=layers,
            params=n,
            mib=n * 4 / 2**20,
            t_step=t_step,
            ratio={},
            speedup={},
        )
        for w in blocks:
            r = time_forward(lm, params, 1, w, context, capacity, reps=reps) / t_step
            row["ratio"][w] = r
            e = leviathan_expected_tokens(alpha, w - 1)
            row["speedup"][w] = float(hardware_aware_speedup(e, 1.0, c, r, w - 1))
        rows.append(row)
        print(
            f"d {d:5d} × {layers} layers, {row['mib']:7.1f} MiB f32: T_step "
            f"{1e3 * t_step:8.3f} ms; "
            + "; ".join(
                f"T_score({w}) / T_step {row['ratio'][w]:.2f} → speed-up at α {alpha} "
                f"{row['speedup'][w]:.2f}"
                for w in blocks
            ),
            flush=True,
        )
    return rows


def main(argv):
    del argv
    sizes = _sizes()  # the flags were checked by `validate`
    blocks = [int(b) for b in FLAGS.blocks]
    prov = provenance.provenance()
    rows = measure(sizes, blocks, FLAGS.context, FLAGS.capacity, FLAGS.alpha, FLAGS.c)
    result = dict(
        rows=rows, alpha=FLAGS.alpha, c=FLAGS.c, context=FLAGS.context, capacity=FLAGS.capacity
    )
    print(f"wrote {provenance.write_json(Path(FLAGS.out) / 'score_ratio.json', result, prov)}")


if __name__ == "__main__":
    define_flags()
    sf.run(main, validate, "score_ratio")
