"""Static vs continuous batching on the zoo (or SmolLM2), on a ragged workload.

  python experiments/benchmark_batching.py --out runs/benchmark_batching   # B = 8, N = 48
  python experiments/benchmark_batching.py --batches 8,32 --n_prompts 96 --chunks 8,16,32
  python experiments/benchmark_batching.py --write_docs          # docs/results/batching.md
  python experiments/benchmark_batching.py --verifier smollm2 --drafter eagle --gamma 2 \
      --n_prompts 24 --chunks 8 --out runs/bbatch   # docs/performance.md, run batching_real_xeon

Workload: the shipped plan prompts (`specjax.data.load_prompts`, cycled to `--n_prompts`)
with per-prompt budgets drawn uniformly from [--new_tokens_min, --new_tokens_max] (fixed
seed) and, with --stop, the verifier's newline tokens as stop tokens: prompts end at very
different lengths. For the verifier alone (AR) and for speculative decoding (--drafter,
γ = --gamma, rule --rule), at every batch size B:

  * static: the queue cut into batches of B in order, each one `autoregressive_generate` /
    `speculative_generate` call running to its slowest row (budget: the batch's largest;
    every batch padded to B rows and one set of shapes, so one compiled program);
  * continuous: `specjax.engine.batching.continuous_generate` at each chunk size (rounds
    per chunk; tokens for AR).

Reported: useful tokens (committed within each prompt's budget, stop token included) per
second of compiled execution (compilation and transfers excluded; every program is run
once as a discarded warm-up, since XLA:CPU's first execution is slower) and per second of
wall clock (host work and transfers included), continuous / static, chunks, refills and
the refills' share of the continuous seconds (prefill of the padded prompts: on a CPU a
large part of a short-answer workload), and whether each prompt's tokens equal its static
tokens, with where each differing prompt first differs
(`specjax.measure.evaluation.first_differences`: both tokens' probabilities and places in the
cumulative distribution). ``--static_also=4`` runs the
queue statically at other batch sizes too (untimed), which tells batching from batch
composition. Medians of --repeats; the machine's load average is printed and stored (timings
on a shared machine move by tens of percent). Prints a table and writes
benchmark_batching.json under --out; ``--write_docs`` writes docs/results/batching.md
(``--docs_dir``); `measure` is the programmatic entry. About 5 minutes at the defaults on
2 idle cores.
"""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path

import jax
import numpy as np
from absl import flags

from specjax.data import load_prompts
from specjax.engine.autoregressive import autoregressive_generate
from specjax.engine.batching import continuous_generate
from specjax.engine.deployment import Deployment, from_zoo
from specjax.engine.generate import row_keys_for, speculative_generate
from specjax.engine.spec import EngineConfig
from specjax.measure.evaluation import first_differences
from specjax.models.zoo import load_zoo
from specjax.runner import deployments, provenance
from specjax.runner import script_flags as sf

FLAGS = flags.FLAGS
PAGE = "batching"
_RECORDED_FLAGS = (
    "verifier",
    "dtype",
    "batches",
    "n_prompts",
    "chunks",
    "new_tokens_min",
    "new_tokens_max",
    "stop",
    "modes",
    "drafter",
    "gamma",
    "rule",
    "verifier_temperature",
    "repeats",
    "bucket",
    "seed",
    "static_also",
)


def define_flags():
    """The script's flags (defined only when it runs as a script)."""
    provenance.define_common_flags(out="runs/benchmark_batching", repeats=3, page=PAGE)
    flags.DEFINE_list("batches", ["8"], "batch sizes B (rows)")
    flags.DEFINE_enum(
        "verifier", "zoo", ["zoo", "smollm2"], "the zoo's or SmolLM2 (its wheel, chat template)"
    )
    flags.DEFINE_string("dtype", "bfloat16:out_first", "SmolLM2's layout (--verifier=smollm2)")
    flags.DEFINE_string(
        "doc_name", PAGE, "name of the results page --write_docs writes (<docs_dir>/<doc_name>.md)"
    )
    flags.DEFINE_integer("n_prompts", 48, "prompts in the queue (the shipped ones, cycled)")
    flags.DEFINE_list(
        "chunks",
        ["4", "8", "16"],
        "continuous batching chunk sizes (rounds per chunk: tokens for AR)",
    )
    flags.DEFINE_integer("new_tokens_min", 16, "smallest per-prompt budget")
    flags.DEFINE_integer("new_tokens_max", 64, "largest per-prompt budget")
    flags.DEFINE_bool("stop", True, "stop prompts at the verifier's newline tokens")
    flags.DEFINE_list("modes", ["ar", "spec"], "ar: the verifier alone; spec: speculative")
    flags.DEFINE_string("drafter", "code", "the speculative mode's drafter")
    flags.DEFINE_integer("gamma", 4, "γ of the speculative mode")
    flags.DEFINE_string("rule", "rejection", "verification rule (EngineConfig's default)")
    flags.DEFINE_float("verifier_temperature", 1.0, "τ of the verifier")
    flags.DEFINE_integer(
        "bucket",
        8,
        "prompt widths are padded to a multiple of this (both "
        "methods pad to the queue's widest prompt, one set of shapes; attention "
        "reads every cache slot, so a wide bucket slows prefill and decoding)",
    )
    flags.DEFINE_integer("seed", 0, "budgets and row keys")
    flags.DEFINE_list(
        "static_also",
        [],
        "more batch sizes run statically (untimed): their tokens against static's at each "
        "--batches size, and where each prompt's first differs (batch composition vs batching)",
    )
    flags.DEFINE_string(
        "zoo", None, "zoo path (default: $SPECJAX_ZOO, else the shipped specjax/zoo)"
    )


MODES = ("ar", "spec")
#: SmolLM2's context as this script loads it (`main`).
SMOLLM2_MAX_LEN = 1024


def validate() -> None:
    """Every flag, before anything is printed, loaded or written (`sf.run`): a
    `ConfigError` naming the flag, its value and what is allowed."""
    modes = sf.names("--modes", FLAGS.modes, MODES)
    if deployments.get(FLAGS.verifier, "--verifier").weight_layouts:
        from specjax.models.gguf import parse_layout  # pylint: disable=import-outside-toplevel
        from specjax.runner.deployments.smollm2 import (  # pylint: disable=import-outside-toplevel
            SMOLLM2_DRAFTERS,
            SMOLLM2_EXTRA,
        )

        parse_layout(FLAGS.dtype, "--dtype")
        drafters, max_len = (*SMOLLM2_DRAFTERS, *SMOLLM2_EXTRA), SMOLLM2_MAX_LEN
    else:
        _, manifest = sf.zoo("--zoo", FLAGS.zoo)
        drafters = sf.zoo_drafters(manifest)
        max_len = int(manifest["models"]["verifier"]["config"]["max_len"])
    if "spec" in modes:
        sf.check(FLAGS.drafter in drafters, "--drafter", FLAGS.drafter, list(drafters))
        sf.rule("--rule", FLAGS.rule)
        sf.integer("--gamma", FLAGS.gamma, 1, 64)
    sf.doc_name("--doc_name", FLAGS.doc_name)
    sf.integers("--batches", FLAGS.batches, 1, 1024)
    sf.integer("--n_prompts", FLAGS.n_prompts, 1, 100_000)
    sf.integers("--chunks", FLAGS.chunks, 1, max_len)
    lo = sf.integer("--new_tokens_min", FLAGS.new_tokens_min, 1, max_len // 2)
    sf.integer("--new_tokens_max", FLAGS.new_tokens_max, lo, max_len // 2)
    sf.number("--verifier_temperature", FLAGS.verifier_temperature, 0.0, 100.0)
    sf.integer("--bucket", FLAGS.bucket, 1, max_len // 2)
    sf.integer("--seed", FLAGS.seed, 0)
    sf.integers("--static_also", FLAGS.static_also, 1, 1024, empty=True)


def workload(n_prompts: int, new_tokens, seed: int = 0) -> tuple[list[str], np.ndarray]:
    """The queue: shipped prompts cycled to `n_prompts`, and their budgets (an int, or a
    (lo, hi) range drawn from uniformly with `seed`)."""
    texts = [p["prompt"] for p in load_prompts()]
    texts = [texts[i % len(texts)] for i in range(n_prompts)]
    if isinstance(new_tokens, int):
        return texts, np.full((n_prompts,), new_tokens, np.int64)
    lo, hi = new_tokens
    return texts, np.random.default_rng(seed).integers(lo, hi + 1, n_prompts)


def _static(dep, cfg, spec: bool, v, d, budgets, keys, batch: int, bucket: int, stop):
    """The queue in static batches of `batch` rows: (per-prompt tokens within budget,
    seconds of compiled execution, wall seconds)."""
    n = len(v)
    width = max(map(len, v))
    d_width = [max(map(len, dk)) for dk in d]
    top = int(budgets.max())
    out, seconds = [None] * n, 0.0
    t0 = time.perf_counter()
    for lo in range(0, n, batch):
        rows = [min(i, n - 1) for i in range(lo, lo + batch)]  # the last batch padded
        b = int(budgets[rows].max())
        kw = dict(stop_table=stop, bucket=bucket, min_width=width, reserve=top - b)
        if spec:
            res = speculative_generate(
                EngineConfig(
                    gamma=cfg.gamma,
                    rule=cfg.rule,
                    max_new_tokens=b,
                    verifier_temperature=cfg.verifier_temperature,
                ),
                dep.verifier,
                dep.v_params,
                dep.drafters,
                dep.d_data,
                [v[i] for i in rows],
                [[dk[i] for i in rows] for dk in d],
                keys[rows],
                drafter_min_width=d_width,
                **kw,
            )
        else:
            res = autoregressive_generate(
                dep.verifier,
                dep.v_params,
                [v[i] for i in rows],
                keys[rows],
                temperature=cfg.verifier_temperature,
                max_new_tokens=b,
                **kw,
            )
        seconds += res.seconds
        for j, i in enumerate(rows[: n - lo]):
            out[i] = res.new_tokens(j)[: int(budgets[i])]
    return out, seconds, time.perf_counter() - t0


def _timed(run, repeats: int) -> list:
    """`run`'s results over `repeats` runs (at least one), after a discarded warm-up."""
    run()  # warm-up (and compilation)
    return [run() for _ in range(max(1, repeats))]


def _static_entry(s_runs, n_prompts: int, batch: int) -> tuple[dict, list]:
    """Static batching's entry (medians of the runs) and its tokens per prompt."""
    s_tokens = s_runs[0][0]
    s_sec = statistics.median(r[1] for r in s_runs)
    s_wall = statistics.median(r[2] for r in s_runs)
    useful = int(sum(len(t) for t in s_tokens))
    static = dict(
        useful_tokens=useful,
        seconds=s_sec,
        wall_seconds=s_wall,
        tokens_per_s=useful / s_sec,
        wall_tokens_per_s=useful / s_wall,
        batches=-(-n_prompts // batch),
    )
    return static, s_tokens


def _continuous_entry(c: int, runs, static: dict, s_tokens, spec: bool) -> dict:
    """Continuous batching's entry at chunk size `c` (medians of the runs), against static."""
    res = runs[0]
    sec = statistics.median(r.seconds for r in runs)
    refill = statistics.median(r.refill_seconds for r in runs)
    wall = statistics.median(r.wall_seconds for r in runs)
    got = int(res.committed.sum())
    entry = dict(
        chunk=c,
        useful_tokens=got,
        seconds=sec,
        wall_seconds=wall,
        refill_seconds=refill,
        refill_share=refill / sec,
        tokens_per_s=got / sec,
        wall_tokens_per_s=got / wall,
        speedup=(got / sec) / static["tokens_per_s"],
        wall_speedup=(got / wall) / static["wall_tokens_per_s"],
        chunks=res.chunks,
        refills=res.refills,
        programs=res.programs,
        same_tokens=int(sum(a == b for a, b in zip(res.tokens, s_tokens))),
    )
    if spec:
        entry.update(
            acceptance=float(res.accepted.sum() / max(res.proposed.sum(), 1)),
            tokens_per_round=float(res.committed.sum() / max(res.rounds.sum(), 1)),
        )
    return entry


def measure(
    zoo,
    *,
    batch: int,
    n_prompts: int,
    chunk=(4, 8, 16),
    new_tokens=(16, 64),
    gamma: int = 4,
    drafter: str | None = "code",
    rule: str = "rejection",
    stop: bool = True,
    verifier_temperature: float = 1.0,
    repeats: int = 3,
    bucket: int = 8,
    seed: int = 0,
    static_also=(),
) -> dict:
    """Static vs continuous batching of one ragged queue at batch size `batch`.

    Args:
      zoo: a loaded `specjax.models.zoo.Zoo`, or a `Deployment` holding `drafter` (e.g.
        `from_smollm2([drafter], ...)`).
      batch: B, rows. n_prompts: queue length.
      chunk: continuous batching chunk size(s), in rounds (verifier calls) per chunk.
      new_tokens: per-prompt budget, an int or a (lo, hi) range (drawn with `seed`).
      gamma / drafter / rule: the speculative mode; `drafter=None`: the verifier alone.
      stop: stop at the verifier's newline tokens.
      repeats: timed runs per measurement (median), after one discarded warm-up.
      static_also: more batch sizes run statically once (untimed), to tell batching from
        batch composition: their tokens against static's at `batch`.

    Returns:
      dict with the workload, `static` and `continuous` (one entry per chunk): useful
      tokens, seconds (compiled execution) and wall seconds, tokens/s of each, the ratio
      to static, chunks / refills, `same_tokens` (prompts whose tokens equal static's) and
      `differences` (`first_differences`); `static_also`: per extra batch size, the same two.
    """
    chunks = [int(chunk)] if isinstance(chunk, (int, np.integer)) else [int(c) for c in chunk]
    spec = drafter is not None
    if isinstance(zoo, Deployment):
        dep = zoo.subset([drafter]) if spec else zoo
    else:
        dep = from_zoo(zoo, names=[drafter] if spec else zoo.names[:1])
    texts, budgets = workload(n_prompts, new_tokens, seed)
    v = [dep.encode(t) for t in texts]
    d = [[enc(t) for t in texts] for enc in dep.drafter_encode] if spec else []
    keys = row_keys_for(seed, n_prompts, stream="batching")
    stop_table = dep.stop_table if stop else None
    cfg = EngineConfig(
        gamma=gamma,
        rule=rule,
        verifier_temperature=verifier_temperature,
        max_new_tokens=int(budgets.max()),
    )

    s_runs = _timed(
        lambda: _static(dep, cfg, spec, v, d, budgets, keys, batch, bucket, stop_table), repeats
    )
    static, s_tokens = _static_entry(s_runs, n_prompts, batch)
    run = (dep, cfg, spec, v, d, budgets, keys, bucket, stop_table)
    conts = [_continuous(run, c, batch, repeats, static, s_tokens) for c in chunks]
    also = [_static_other(run, int(b2), s_tokens) for b2 in static_also]
    return dict(
        mode="spec" if spec else "ar",
        drafter=drafter,
        gamma=gamma if spec else None,
        rule=rule if spec else None,
        batch=batch,
        n_prompts=n_prompts,
        new_tokens=list(new_tokens) if not isinstance(new_tokens, int) else new_tokens,
        stop=stop,
        budgets_total=int(budgets.sum()),
        mean_prompt_tokens=float(np.mean([len(x) for x in v])),
        static=static,
        continuous=conts,
        static_also=also,
        load_average=provenance.load_average(),
    )


def _continuous(run: tuple, c: int, batch: int, repeats: int, static: dict, s_tokens) -> dict:
    """Continuous batching at chunk ``c`` (``run``: what `measure` set up), timed, against
    static's tokens."""
    dep, cfg, spec, v, d, budgets, keys, bucket, stop_table = run
    kw = dict(batch=batch, chunk=c, max_new_tokens=budgets, stop_table=stop_table, bucket=bucket)
    if spec:
        kw.update(drafters=dep.drafters, d_data=dep.d_data, drafter_prompts=d)
    runs = _timed(
        lambda kw=kw: continuous_generate(cfg, dep.verifier, dep.v_params, v, keys, **kw),
        repeats,
    )
    entry = _continuous_entry(c, runs, static, s_tokens, spec)
    entry["differences"] = first_differences(
        dep.verifier, dep.v_params, v, s_tokens, runs[0].tokens, cfg.verifier_temperature
    )
    return entry


def _static_other(run: tuple, b2: int, s_tokens) -> dict:
    """Static batching at another batch size ``b2``, once, untimed: its tokens against
    static's at the measured batch size."""
    dep, cfg, spec, v, d, budgets, keys, bucket, stop_table = run
    t2 = _static(dep, cfg, spec, v, d, budgets, keys, b2, bucket, stop_table)[0]
    diffs = first_differences(dep.verifier, dep.v_params, v, s_tokens, t2, cfg.verifier_temperature)
    return dict(batch=b2, same_tokens=len(v) - len(diffs), differences=diffs)


def print_table(results: list[dict]) -> None:
    print(
        f"\n{'mode':4} {'B':>3} {'method':>10} {'useful':>7} {'tok/s':>8} {'wall tok/s':>10} "
        f"{'x static':>8} {'x wall':>6} {'chunks':>6} {'refills':>7} {'refill %':>8} {'same':>5}"
    )
    for r in results:
        s = r["static"]
        print(
            f"{r['mode']:4} {r['batch']:3d} {'static':>10} {s['useful_tokens']:7d} "
            f"{s['tokens_per_s']:8.1f} {s['wall_tokens_per_s']:10.1f} {1:8.2f} {1:6.2f} "
            f"{s['batches']:6d} {'':>7} {'':>8} {'':>5}"
        )
        for c in r["continuous"]:
            print(
                f"{r['mode']:4} {r['batch']:3d} {'chunk ' + str(c['chunk']):>10} "
                f"{c['useful_tokens']:7d} {c['tokens_per_s']:8.1f} "
                f"{c['wall_tokens_per_s']:10.1f} {c['speedup']:8.2f} "
                f"{c['wall_speedup']:6.2f} {c['chunks']:6d} {c['refills']:7d} "
                f"{100 * c['refill_share']:8.0f} {c['same_tokens']:2d}/{r['n_prompts']}"
            )
    for r in results:
        runs = [(f"chunk {c['chunk']}", c) for c in r["continuous"]]
        runs += [(f"static B={a['batch']}", a) for a in r.get("static_also", [])]
        for name, c in runs:
            if name.startswith("static"):
                print(f"{r['mode']} B={r['batch']}, {name}: same tokens {c['same_tokens']}")
            for dif in c.get("differences", []):
                print(f"{r['mode']} B={r['batch']}, {name}: {_difference_text(dif)}")


def _difference_text(d: dict) -> str:
    """One `first_differences` entry as a line."""
    head = f"prompt {d['prompt']} first differs at token {d['position']}"
    if "tokens" not in d:
        return f"{head} (one ends there; lengths {d['lengths']})"
    (a, b), (pa, pb), (ca, cb) = d["tokens"], d["p"], d["cdf"]
    return f"{head}: {a} (p {pa:.2g}, cdf {ca:.6f}) vs {b} (p {pb:.2g}, cdf {cb:.6f})"


def render_page(result: dict) -> list[str]:
    """docs/results/batching.md's body (below the provenance header), every figure the
    run's own: one table per batch size, a row per mode."""
    f = result["flags"]
    label = {"ar": "AR", "spec": "speculative"}
    verifier = f.get("verifier", "zoo")
    lines = [
        (
            "SmolLM2-135M-Instruct (" + f.get("dtype", "") + ", chat template); "
            if deployments.get(verifier, "verifier").weight_layouts
            else ""
        )
        + f"N = {f['n_prompts']} prompts, budgets {f['new_tokens_min']}–{f['new_tokens_max']}"
        + (" and newline stops" if f["stop"] else "")
        + f", drafter {f['drafter']}, "
        f"γ = {f['gamma']}, rule {f['rule']}, τ = {f['verifier_temperature']:g}, medians "
        f"of {f['repeats']}; tokens/s of compiled execution (× static), then of wall "
        "clock.",
        "",
    ]
    for batch in dict.fromkeys(r["batch"] for r in result["results"]):
        rows = [r for r in result["results"] if r["batch"] == batch]
        chunks = [c["chunk"] for c in rows[0]["continuous"]]
        lines += [
            f"B = {batch}:",
            "",
            "| | static | " + " | ".join(f"chunk {c}" for c in chunks) + " |",
            "| --- | --- |" + " --- |" * len(chunks),
        ]
        for r in rows:
            s, cs = r["static"], r["continuous"]
            name = label.get(r["mode"], r["mode"])
            lines += [
                f"| {name} tok/s (× static) | {s['tokens_per_s']:,.0f} | "
                + " | ".join(f"{c['tokens_per_s']:,.0f} ({c['speedup']:.2f})" for c in cs)
                + " |",
                f"| {name} wall tok/s (× static) | {s['wall_tokens_per_s']:,.0f} | "
                + " | ".join(f"{c['wall_tokens_per_s']:,.0f} ({c['wall_speedup']:.2f})" for c in cs)
                + " |",
                f"| {name} decode calls (batches / chunks), refills | {s['batches']} | "
                + " | ".join(f"{c['chunks']}, {c['refills']}" for c in cs)
                + " |",
                f"| {name} refills' share of the seconds | — | "
                + " | ".join(f"{100 * c['refill_share']:.0f} %" for c in cs)
                + " |",
                f"| {name} prompts with static's tokens | {r['n_prompts']} | "
                + " | ".join(f"{c['same_tokens']}" for c in cs)
                + " |",
            ]
        lines.append("")
    return lines


def main(argv):
    del argv
    prov = provenance.provenance()
    if deployments.get(FLAGS.verifier, "--verifier").weight_layouts:
        from specjax.models import gguf  # pylint: disable=import-outside-toplevel
        from specjax.runner.deployments.smollm2 import from_smollm2  # pylint: disable=import-outside-toplevel

        model = gguf.smollm2_layout(FLAGS.dtype, max_len=1024, field="--dtype")
        dt = FLAGS.dtype.partition(":")[0]
        zoo = from_smollm2([FLAGS.drafter], dtype=dt, verifier=model)
    else:
        zoo = load_zoo(FLAGS.zoo)
    print(f"devices: {jax.devices()}  load average: {os.getloadavg()}", flush=True)
    results = []
    for mode in FLAGS.modes:
        for b in (int(x) for x in FLAGS.batches):
            r = measure(
                zoo,
                batch=b,
                n_prompts=FLAGS.n_prompts,
                chunk=[int(c) for c in FLAGS.chunks],
                new_tokens=(FLAGS.new_tokens_min, FLAGS.new_tokens_max),
                gamma=FLAGS.gamma,
                drafter=FLAGS.drafter if mode == "spec" else None,
                rule=FLAGS.rule,
                stop=FLAGS.stop,
                verifier_temperature=FLAGS.verifier_temperature,
                repeats=FLAGS.repeats,
                bucket=FLAGS.bucket,
                seed=FLAGS.seed,
                static_also=[int(x) for x in FLAGS.static_also],
            )
            results.append(r)
            print(f"{mode} B={b}: done (load average {os.getloadavg()})", flush=True)
    print_table(results)
    result = {
        "results": results,
        "devices": [str(dv) for dv in jax.devices()],
        "flags": {k: FLAGS[k].value for k in _RECORDED_FLAGS},
    }
    path = provenance.write_json(Path(FLAGS.out) / "benchmark_batching.json", result, prov)
    print(f"wrote {path}")
    if FLAGS.write_docs:
        page = provenance.write_page(
            FLAGS.doc_name,
            "Continuous batching (experiments/benchmark_batching.py)",
            render_page(result),
            prov,
            FLAGS.docs_dir,
        )
        print(f"wrote {page}")


if __name__ == "__main__":
    define_flags()
    sf.run(main, validate, "benchmark_batching")
