"""Where a speculative round's time goes: the compiled loop against its model forwards.

  python experiments/profile_round.py                                # B = 1, 8; γ = 2, 4
  python experiments/profile_round.py --batches 1 --gammas 2 --ablate --hlo_dump /tmp/round
  python experiments/profile_round.py --compare_with /tmp/oldtree --e2e   # paired old vs new
  python experiments/profile_round.py --verifier smollm2 --drafter eagle --batches 1 --gammas 3
  python experiments/profile_round.py --verifier smollm2 --drafter lookup+eagle --gammas 3 \
      --verifier_temperature 0 --batches 1          # a token tree: a chain per drafter
  XLA_FLAGS=--xla_cpu_enable_xprof_traceme=true \
      python experiments/profile_round.py --batches 1 --gammas 2 --profile_dir /tmp/prof

For every batch B and γ (zoo verifier, the `--drafter` drafter, rule `--rule`, verifier
τ = `--verifier_temperature`; drafters joined by `+` draft a token tree, one chain of γ
each, scored in one S·γ + 1-token forward, rule `token_tree` unless `--rule` says), after
a prefill and one round (`speculative_generate(..., return_state=True)`), it times the
speculative loop alone: the rounds of a `lax.while_loop` over `speculative_round` until
every row has `--new_tokens` more tokens, ahead-of-time compiled (compilation excluded; a
warm-up run first), and reports

  * ms per round: the loop's seconds / its iterations (minimum and median over
    `--repeats`, and the process CPU time per round);
  * forwards: T_score + γ·ΣT_draft, the round's model forwards alone (the (S·γ+1)-token
    verifier forward and γ one-token forwards of each drafter, each timed in a jitted `lax.scan`
    at the loop's cache capacity, half filled), and the overhead, the difference; the
    forwards are timed in the same repeats as the loops (interleaved: the machine is
    shared, its load is printed);
  * the loop body's HLO: instructions that run (parameters, tuples, get-tuple-elements,
    bitcasts and constants do not) counted once (`thunks`) and times the trip counts of
    nested loops (`run`), fusions, copies and nested while loops. Counts are a census,
    not a cost: on XLA:CPU's thunk runtime a thunk's dispatch is well under a µs; what a
    thunk does is what costs (a rolled PRNG loop, a variadic argmax, a weight copy).

`--profile_dir` traces one run of each program with `jax.profiler` and prints the time per
round of each thunk (with `XLA_FLAGS=--xla_cpu_enable_xprof_traceme=true`), joined with
the HLO's op names and grouped (prng, dot, cache write, sampling, copy). Thunks run
concurrently on the intra-op threads, so durations overlap: read them as a ranking.

`--ablate` also times variants of the round, traced from `specjax.engine.decode` with one
part swapped out (a scratch variant, never the engine's code path): `argmax` (every
sample and key derivation replaced by an argmax), `no_counters` (counters untouched),
`skeleton` (the forwards, greedy drafting and cache bookkeeping only), `verifier_only`
and `verifier_1tok` (the verifier's (γ+1)-token / one-token forward alone in the loop).
Their differences to the full round attribute the overhead (`--variants` picks some).
`--set_attr module.ATTR=value` times the full round traced with a package attribute set
(scratch experiments); `--compiler_options` with per-program XLA:CPU option sets.

`--compare_with DIR`: DIR holds a renamed copy of an older specjax (`DIR/specjax_old`, its
imports rewritten, e.g. `git archive HEAD specjax | tar -x -C DIR; mv DIR/specjax
DIR/specjax_old; sed -i 's/specjax\\./specjax_old./g' ...`); both are timed alternately in
this process (paired). `--e2e` adds benchmark.py's measurement per package, interleaved:
tokens/s of whole speculative and autoregressive generate calls, spec/AR and measured /
hardware-aware. Writes ``profile_round.json`` under --out. About 3 minutes at the defaults
on 2 cores. The measurement is `specjax.measure.round_profile`'s; this script holds the flags,
their checks and the JSON's write.
"""

from __future__ import annotations

import sys
from pathlib import Path

from absl import flags

from specjax.errors import ConfigError
from specjax.measure import drafter_entries as entries
from specjax.measure import round_profile
from specjax.measure.round_anatomy import load_package, variants
from specjax.measure.round_profile import OPTION_SETS, SMOLLM2_MAX_LEN, set_attr_value
from specjax.models.gguf import parse_layout
from specjax.runner import deployments, provenance
from specjax.runner import script_flags as sf
from specjax.runner.deployments.smollm2 import SMOLLM2_DRAFTERS, SMOLLM2_EXTRA

FLAGS = flags.FLAGS


def define_flags():
    """The script's flags (defined only when it runs as a script)."""
    provenance.define_common_flags(out="runs/profile_round", repeats=5)
    flags.DEFINE_list("batches", ["1", "8"], "batch sizes")
    flags.DEFINE_list("gammas", ["2", "4"], "γ values")
    flags.DEFINE_enum("verifier", "zoo", ["zoo", "smollm2"], "the zoo's or SmolLM2 (its wheel)")
    flags.DEFINE_string("dtype", "bfloat16:out_first", "SmolLM2's layout (--verifier=smollm2)")
    flags.DEFINE_string(
        "drafter",
        "code",
        "drafter (a zoo name; with smollm2 one of its own); drafters joined by '+' "
        "(lookup+eagle) draft one token tree per row, a chain each; NAME*COUNT names a "
        "drafter COUNT times (twins, eagle*3)",
    )
    flags.register_validator(
        "drafter", entries.entry_ok, "NAME or NAME*COUNT (COUNT >= 1), joined by '+'"
    )
    flags.DEFINE_string("rule", None, "verification rule (default: rejection; a tree: token_tree)")
    flags.DEFINE_string(
        "compare_rule",
        None,
        "the --compare_with package's rule instead of --rule (two rules paired in one process)",
    )
    flags.DEFINE_enum(
        "q_layout",
        "dense",
        ["dense", "sparse"],
        "EngineConfig.q_layout of this tree's package (a --compare_with package keeps dense)",
    )
    flags.DEFINE_float("verifier_temperature", 1.0, "τ of the verifier")
    flags.DEFINE_integer("new_tokens", 64, "tokens per row in the timed loop")
    flags.DEFINE_integer("bucket", 64, "prompt widths are padded to a multiple of this")
    flags.DEFINE_bool("ablate", False, "also time ablated variants of the round")
    flags.DEFINE_bool("hlo", True, "count the HLO instructions of the loop body")
    flags.DEFINE_string("hlo_dump", None, "write each compiled program's HLO text here")
    flags.DEFINE_string("compare_with", None, "a directory holding specjax_old (paired timing)")
    flags.DEFINE_string("profile_dir", None, "write a jax.profiler trace of one loop run here")
    flags.DEFINE_list(
        "set_attr",
        [],
        "also time the full round traced with a module attribute "
        "of the package set, e.g. models.products.HALF_MIN_ROWS=4 (scratch "
        "experiments)",
    )
    flags.DEFINE_list("variants", [], "with --ablate: only these variants (and 'full')")
    flags.DEFINE_list(
        "compiler_options",
        [],
        "also time the full round compiled with these "
        "XLA:CPU option sets (per program, `Lowered.compile(options)`): "
        "single_thread (no intra-op threads for dots), no_ynn (dots off YNNPACK), "
        "no_ynn_single_thread, ynn_all (YNNPACK also for elementwise ops and "
        "reductions), xnn_graph (XNNPACK's greedy subgraph fusion)",
    )
    flags.register_validator(
        "compiler_options",
        lambda v: set(v) <= set(OPTION_SETS),
        f"--compiler_options: allowed names are {', '.join(OPTION_SETS)}",
    )
    flags.DEFINE_bool(
        "e2e",
        False,
        "also time whole generate calls (speculative and AR, prefill "
        "included, as benchmark.py) per package, interleaved: spec/AR and "
        "measured / hardware-aware",
    )


def validate() -> None:
    """Every flag, before anything is printed, loaded or written (`sf.run`): a
    `ConfigError` naming the flag, its value and what is allowed."""
    sf.integers("--batches", FLAGS.batches, 1, 1024)
    gammas = sf.integers("--gammas", FLAGS.gammas, 1, 64)
    if deployments.get(FLAGS.verifier, "--verifier").weight_layouts:
        parse_layout(FLAGS.dtype, "--dtype")
        known, max_len = (*SMOLLM2_DRAFTERS, *SMOLLM2_EXTRA), SMOLLM2_MAX_LEN
    else:
        _, manifest = sf.zoo("--verifier", None)
        known = sf.zoo_drafters(manifest)
        max_len = int(manifest["models"]["verifier"]["config"]["max_len"])
    members = entries.members(FLAGS.drafter)
    bad = [n for n in members if n not in known]
    sf.check(
        not bad,
        "--drafter",
        FLAGS.drafter,
        f"NAME or NAME*COUNT joined by '+', NAME one of {', '.join(known)} "
        f"({bad[0] if bad else ''!r} is not)",
    )
    for field in ("--rule", "--compare_rule"):
        if FLAGS[field[2:]].value is not None:
            sf.rule(field, FLAGS[field[2:]].value, len(members))
    sf.number("--verifier_temperature", FLAGS.verifier_temperature, 0.0, 100.0)
    new_tokens = sf.integer("--new_tokens", FLAGS.new_tokens, 1, max_len // 2)
    sf.integer("--bucket", FLAGS.bucket, 1, max_len // 2)
    widest = len(members) * max(gammas) + 1
    sf.check(
        new_tokens + widest < max_len,
        "--drafter / --gammas / --new_tokens",
        f"{FLAGS.drafter} / {','.join(FLAGS.gammas)} / {new_tokens}",
        f"a loop within the verifier's context, {max_len} positions (chains × γ + 1 = "
        f"{widest} and {new_tokens} new tokens, besides the prompt)",
    )
    for field in ("--hlo_dump", "--profile_dir"):
        if FLAGS[field[2:]].value:
            sf.out_dir(field, FLAGS[field[2:]].value)
    if FLAGS.compare_with:
        folder = sf.in_dir("--compare_with", FLAGS.compare_with, "a folder holding specjax_old/")
        sf.check(
            (folder / "specjax_old" / "__init__.py").is_file(),
            "--compare_with",
            FLAGS.compare_with,
            "a folder holding specjax_old/ (a renamed copy of an older specjax: the module "
            "docstring)",
        )
    elif FLAGS.compare_rule:
        raise ConfigError.invalid(
            "--compare_rule", FLAGS.compare_rule, "unset without --compare_with"
        )
    for setting in FLAGS.set_attr:
        set_attr_value(setting)
    if FLAGS.variants:
        sf.check(FLAGS.ablate, "--variants", ",".join(FLAGS.variants), "empty without --ablate")
        sf.names("--variants", FLAGS.variants, list(variants(load_package("specjax"))))


def main(argv):
    del argv
    prov = provenance.provenance()
    pkgs = ["specjax"]
    if FLAGS.compare_with:
        sys.path.insert(0, FLAGS.compare_with)
        pkgs = ["specjax_old", "specjax"]
    settings = round_profile.Settings.from_values(
        FLAGS.flag_values_dict(),
        weight_layouts=deployments.get(FLAGS.verifier, "--verifier").weight_layouts,
    )
    results = round_profile.profile(settings, pkgs)
    path = provenance.write_json(Path(FLAGS.out) / "profile_round.json", dict(rows=results), prov)
    print(f"wrote {path}")


if __name__ == "__main__":
    define_flags()
    sf.run(main, validate, "profile_round")
