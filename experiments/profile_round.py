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
on 2 cores.
"""

from __future__ import annotations

import collections
import importlib
import os
import statistics
import sys
import time
import types
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from absl import flags

from specjax.errors import ConfigError
from specjax.measure import drafter_entries as entries
from specjax.measure.round_anatomy import (
    Forward,
    catch_up,
    counters_class,
    end_to_end,
    load_package,
    loop_census,
    round_budget_fn,
    thunk_profile,
    variants,
)
from specjax.runner import deployments, provenance
from specjax.runner import script_flags as sf
from specjax.runner.results import atomic_write_text

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
        lambda v: set(v) <= set(_OPTION_SETS),
        f"--compiler_options: allowed names are {', '.join(_OPTION_SETS)}",
    )
    flags.DEFINE_bool(
        "e2e",
        False,
        "also time whole generate calls (speculative and AR, prefill "
        "included, as benchmark.py) per package, interleaved: spec/AR and "
        "measured / hardware-aware",
    )


#: SmolLM2's context as this script loads it (`_load_packages`).
SMOLLM2_MAX_LEN = 1024


def validate() -> None:
    """Every flag, before anything is printed, loaded or written (`sf.run`): a
    `ConfigError` naming the flag, its value and what is allowed."""
    sf.integers("--batches", FLAGS.batches, 1, 1024)
    gammas = sf.integers("--gammas", FLAGS.gammas, 1, 64)
    if deployments.get(FLAGS.verifier, "--verifier").weight_layouts:
        from specjax.models.gguf import parse_layout  # pylint: disable=import-outside-toplevel
        from specjax.runner.deployments.smollm2 import (  # pylint: disable=import-outside-toplevel
            SMOLLM2_DRAFTERS,
            SMOLLM2_EXTRA,
        )

        parse_layout(FLAGS.dtype, "--dtype")
        known, max_len = (*SMOLLM2_DRAFTERS, *SMOLLM2_EXTRA), SMOLLM2_MAX_LEN
    else:
        _, manifest = sf.zoo("--verifier", None)
        known = sf.zoo_drafters(manifest)
        max_len = int(manifest["models"]["verifier"]["config"]["max_len"])
    members = _members()
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
        _set_attr_value(setting)
    if FLAGS.variants:
        sf.check(FLAGS.ablate, "--variants", ",".join(FLAGS.variants), "empty without --ablate")
        sf.names("--variants", FLAGS.variants, list(variants(load_package("specjax"))))


def _set_attr_value(setting: str):
    """(module, attribute, value) of a --set_attr entry ``module.ATTR=value``, the value of
    the attribute's type; a `ConfigError` naming the flag otherwise."""
    allowed = "module.ATTR=value entries, module one of specjax's, ATTR one of its attributes"
    path, eq, value = setting.partition("=")
    mod_name, dot, attr = path.rpartition(".")
    sf.check(eq and dot and mod_name and attr, "--set_attr", setting, allowed)
    try:
        mod = importlib.import_module(f"specjax.{mod_name}")
    except ImportError:
        raise ConfigError.invalid(
            "--set_attr", setting, f"{allowed} (no module specjax.{mod_name})"
        ) from None
    sf.check(
        hasattr(mod, attr), "--set_attr", setting, f"{allowed} (specjax.{mod_name} has no {attr})"
    )
    old = getattr(mod, attr)
    if isinstance(old, bool):
        words = {"true": True, "1": True, "false": False, "0": False}
        sf.check(value.lower() in words, "--set_attr", setting, f"{allowed}, value true or false")
        return mod, attr, words[value.lower()]
    try:
        return mod, attr, type(old)(value)
    except (TypeError, ValueError):
        raise ConfigError.invalid(
            "--set_attr", setting, f"{allowed}, value a {type(old).__name__}"
        ) from None


_OPTION_SETS = {
    "single_thread": {"xla_cpu_multi_thread_eigen": False},
    "no_ynn": {"xla_cpu_experimental_ynn_fusion_type": ""},
    "no_ynn_single_thread": {
        "xla_cpu_experimental_ynn_fusion_type": "",
        "xla_cpu_multi_thread_eigen": False,
    },
    # YNNPACK also for elementwise ops and reductions (fewer, larger thunks), and XNNPACK's
    # greedy subgraph extraction.
    "ynn_all": {
        "xla_cpu_experimental_ynn_fusion_type": ",".join(
            f"LIBRARY_FUSION_TYPE_{t}" for t in ("DOT", "ELTWISE", "REDUCE")
        )
    },
    "xnn_graph": {"xla_cpu_experimental_xnn_graph_fusion_mode": "XNN_GRAPH_FUSION_MODE_GREEDY"},
}


# ----------------------------------------------------------------------------------------
# The timed loop
# ----------------------------------------------------------------------------------------


def _loop_fn(mods, round_fn, cfg, verifier, drafters):
    decode = mods["decode"]

    def loop(v_params, d_data, slots, stop_table, v_temperature, max_new, carry, row_keys):
        b = carry.tokens.shape[0]
        gamma = max(cfg.gamma if d.gamma is None else d.gamma for d in drafters)
        state = decode.DecodeState(
            tokens=carry.tokens,
            length=carry.length,
            start=carry.length,
            done=jnp.zeros((b,), bool),
            row_keys=row_keys,
            vcache=carry.vcache,
            dcaches=carry.dcaches,
            dsynced=carry.dsynced,
            dlogits=carry.dlogits,
            counters=counters_class(mods).zeros(b, len(drafters), gamma),
        )
        state = state.replace(done=round_budget_fn(decode)(cfg, state, max_new, gamma) <= 0)

        def body(c):
            s, i = c
            return round_fn(
                cfg,
                verifier,
                drafters,
                v_params,
                d_data,
                slots,
                stop_table,
                s,
                v_temperature=v_temperature,
                max_new=max_new,
            ), i + 1

        state, iters = jax.lax.while_loop(
            lambda c: ~jnp.all(c[0].done), body, (state, jnp.int32(0))
        )
        return state.tokens, state.length, state.counters.rounds, iters

    return jax.jit(loop)


class Case:
    """One (package, B, γ) setup: the prefilled state and the loop's arguments."""

    def __init__(self, mods, full, texts, batch, gamma):
        self.mods = mods
        gen = mods["gen"]
        dep = full.subset(_members())
        self.dep = dep
        v_prompts = [full.encode(t) for t in texts]
        d_prompts = [[enc(t) for t in texts] for enc in dep.drafter_encode]
        keys = gen.row_keys_for(0, batch)
        self.cfg = _engine_config(mods, gamma, max_new_tokens=1)
        first = gen.speculative_generate(
            self.cfg,
            dep.verifier,
            dep.v_params,
            dep.drafters,
            dep.d_data,
            v_prompts,
            d_prompts,
            keys,
            bucket=FLAGS.bucket,
            reserve=FLAGS.new_tokens,
            return_state=True,
        )
        carry = first.state
        d_data = tuple(
            d.replace(temperature=jnp.float32(s.temperature))
            for d, s in zip(dep.d_data, dep.drafters)
        )
        # The drafters catch up as `_spec_from_state` does, outside the timed loop.
        for k, d in enumerate(dep.drafters):
            catch = jax.jit(
                lambda c, data, k=k, spec=d.static: catch_up(mods, self.cfg, spec, data, c, k)
            )
            carry = catch(carry, d_data[k])
        self.carry = carry
        b = batch
        slots = np.tile(np.arange(len(dep.drafters), dtype=np.int32), (b, 1))
        self.args = (
            dep.v_params,
            d_data,
            jnp.asarray(slots),
            jnp.asarray(dep.stop_table * False),
            jnp.float32(FLAGS.verifier_temperature),
            jnp.int32(FLAGS.new_tokens),
            carry,
            jnp.asarray(keys),
        )
        self.drafters = tuple(d.static for d in dep.drafters)
        share = getattr(mods["spec"], "share_drafting", None)  # a drafter named twice
        if share is not None:
            self.drafters = share(self.drafters, dep.d_data)
        self.capacity = carry.vcache.max_len
        self.d_capacity = [c.max_len for c in carry.dcaches]
        self.context = int(np.mean(np.asarray(carry.length))) + FLAGS.new_tokens // 2
        self.batch, self.gamma = batch, gamma
        self.exes = {}

    def compile(self, name, round_fn, options=None):
        fn = _loop_fn(self.mods, round_fn, self.cfg, self.dep.verifier, self.drafters)
        t0 = time.perf_counter()
        exe = fn.lower(*self.args).compile(options) if options else fn.lower(*self.args).compile()
        out = jax.block_until_ready(exe(*self.args))  # warm-up
        self.exes[name] = (exe, int(out[3]), time.perf_counter() - t0)
        return exe

    def run(self, name):
        """(wall seconds, process CPU seconds) per round of one run of the loop."""
        exe, iters, _ = self.exes[name]
        t0, c0 = time.perf_counter(), time.process_time()
        out = jax.block_until_ready(exe(*self.args))
        dt, dc = time.perf_counter() - t0, time.process_time() - c0
        assert int(out[3]) == iters
        return dt / iters, dc / iters


def _members() -> list[str]:
    """The chains' drafters of --drafter ('lookup+eagle*2' -> [lookup, eagle, eagle])."""
    return entries.members(FLAGS.drafter)


def _engine_config(mods, gamma: int, max_new_tokens: int):
    """The engine config of --drafter at γ: one chain per drafter (a tree when several)."""
    s = len(_members())
    rule = FLAGS.rule or ("rejection" if s == 1 else "token_tree")
    if FLAGS.compare_rule and mods["pkg"] != "specjax":  # the --compare_with package
        rule = FLAGS.compare_rule
    layout = {}
    if FLAGS.q_layout != "dense" and mods["pkg"] == "specjax":  # not the --compare_with one
        layout = dict(q_layout=FLAGS.q_layout)
    return mods["spec"].EngineConfig(
        gamma=gamma,
        rule=rule,
        verifier_temperature=FLAGS.verifier_temperature,
        max_new_tokens=max_new_tokens,
        n_slots=s,
        **layout,
    )


# ----------------------------------------------------------------------------------------
# Forwards alone
# ----------------------------------------------------------------------------------------


# ----------------------------------------------------------------------------------------
# Main
# ----------------------------------------------------------------------------------------


def _from_smollm2(pkg: str, mods: dict):
    """`from_smollm2` of package ``pkg``: its smollm2 deployment kind's (a tree from before
    the kind held it: its engine's)."""
    try:
        return importlib.import_module(f"{pkg}.runner.deployments.smollm2").from_smollm2
    except ModuleNotFoundError:
        return mods["dep"].from_smollm2


def _load_packages(pkgs: list[str]) -> dict:
    """Per package: its modules, the full deployment (the zoo's, or SmolLM2 in the --dtype
    layout with the --drafter), and the plan prompts' texts."""
    loaded = {}
    for pkg in pkgs:
        mods = load_package(pkg)
        if deployments.get(FLAGS.verifier, "--verifier").weight_layouts:
            gguf = importlib.import_module(f"{pkg}.models.gguf")
            model = gguf.smollm2_layout(FLAGS.dtype, max_len=1024, field="--dtype")
            dt = FLAGS.dtype.partition(":")[0]
            full = _from_smollm2(pkg, mods)(
                list(dict.fromkeys(_members())), dtype=dt, verifier=model
            )
        else:
            full = mods["dep"].from_zoo(mods["zoo"].load_zoo())
        texts_all = [p["prompt"] for p in mods["data"].load_prompts()]
        loaded[pkg] = (mods, full, texts_all)
    return loaded


def _compile_scratch(case: Case, pkg: str, fn) -> None:
    """The full round again under each --compiler_options set and each --set_attr setting."""
    for oname, opts in _OPTION_SETS.items():
        if oname in FLAGS.compiler_options:
            case.compile(f"full+{oname}", fn, opts)
    for setting in FLAGS.set_attr:  # e.g. models.transformer.X=3 (checked by `validate`)
        mod_name = setting.partition("=")[0].rpartition(".")[0]
        _, attr, value = _set_attr_value(setting)
        mod = importlib.import_module(f"{pkg}.{mod_name}")
        old = getattr(mod, attr)
        setattr(mod, attr, value)
        try:
            case.compile(f"full[{attr}={value}]", fn)
        finally:
            setattr(mod, attr, old)


def _compile_cases(loaded: dict, pkgs: list[str], batch: int, gamma: int) -> dict:
    """Per package, its Case at (B, γ) with every loop variant compiled (HLO dumped if asked)."""
    cases = {}
    for pkg in pkgs:
        mods, full, texts_all = loaded[pkg]
        texts = (texts_all * (batch // len(texts_all) + 1))[:batch]
        case = Case(mods, full, texts, batch, gamma)
        vs = (
            variants(mods)
            if (FLAGS.ablate and pkg == "specjax")
            else {"full": mods["decode"].speculative_round}
        )
        if FLAGS.variants:
            vs = {k: v for k, v in vs.items() if k == "full" or k in FLAGS.variants}
        for name, fn in vs.items():
            exe = case.compile(name, fn)
            if name == "full" and pkg == "specjax":
                _compile_scratch(case, pkg, fn)
            if FLAGS.hlo_dump:
                Path(FLAGS.hlo_dump).mkdir(parents=True, exist_ok=True)
                atomic_write_text(
                    Path(FLAGS.hlo_dump) / f"{pkg}_B{batch}_g{gamma}_{name}.hlo.txt", exe.as_text()
                )
        cases[pkg] = case
    return cases


def _forwards(loaded: dict, case: Case, batch: int, gamma: int) -> dict:
    """T_step, T_score (S·γ + 1 tokens: a chain of γ per drafter and the root) and each
    drafter's T_draft timers at the case's shapes (the current package's models; identical
    in both)."""
    _, full, _ = loaded["specjax"]
    k = len(case.dep.drafters) * gamma + 1
    timers = {
        "T_step": Forward(full.verifier, full.v_params, batch, 1, case.context, case.capacity),
        "T_score": Forward(full.verifier, full.v_params, batch, k, case.context, case.capacity),
    }
    for d, data, cap in zip(case.dep.drafters, case.dep.d_data, case.d_capacity):
        timers[f"T_draft:{d.name}"] = Forward(d.lm, data.params, batch, 1, case.context, cap)
    return timers


def _paired_times(fwd: dict, cases: dict) -> tuple:
    """Every program once per repeat, in turn: (wall, CPU) per round by program, and the load
    at each repeat's start."""
    times = collections.defaultdict(list)
    loads = []
    for _ in range(FLAGS.repeats):
        loads.append(os.getloadavg()[0])
        for name, f in fwd.items():
            times[("fwd", name)].append(f.run())
        for pkg, c in cases.items():
            for name in c.exes:
                times[(pkg, name)].append(c.run(name))
    return times, loads


def _profile_thunks(case: Case, batch: int, gamma: int) -> None:
    """One traced run of each of the case's programs under --profile_dir; prints its thunks."""
    for name in case.exes:
        pdir = f"{FLAGS.profile_dir}/B{batch}_g{gamma}_{name}"
        with jax.profiler.trace(pdir):
            case.run(name)
        exe, iters, _ = case.exes[name]
        print(f"  thunk profile of {name}:")
        thunk_profile(pdir, exe.as_text(), iters)


def _loop_row(case: Case, pkg: str, name: str, stats: tuple, fwd_s: dict, load: float) -> dict:
    """One program's row: ms per round (best, median, CPU), the forwards, the overhead, its
    HLO census; printed."""
    exe, iters, comp_s = case.exes[name]
    b_, m_, c_ = stats
    t_step, t_score, t_draft = fwd_s["t_step"], fwd_s["t_score"], fwd_s["t_draft"]
    forwards, fmed = fwd_s["forwards"], fwd_s["forwards_median"]
    hlo = loop_census(exe.as_text()) if FLAGS.hlo else {}
    row = dict(
        package=pkg,
        variant=name,
        drafters=_members(),
        rule=case.cfg.rule,
        q_layout=getattr(case.cfg, "q_layout", "dense"),
        batch=case.batch,
        gamma=case.gamma,
        score_width=len(case.dep.drafters) * case.gamma + 1,
        iterations=iters,
        ms_per_round=1e3 * b_,
        ms_per_round_median=1e3 * m_,
        cpu_ms_per_round=1e3 * c_,
        t_step_ms=1e3 * t_step,
        t_score_ms=1e3 * t_score,
        t_draft_ms=1e3 * t_draft,
        forwards_ms=1e3 * forwards,
        forwards_median_ms=1e3 * fmed,
        overhead_ms=1e3 * (b_ - forwards),
        overhead_median_ms=1e3 * (m_ - fmed),
        load=load,
        compile_s=comp_s,
        hlo=hlo,
    )
    print(
        f"  {pkg:11} {name:18} {iters:3d} rounds  {1e3 * b_:7.3f} ms/round "
        f"(median {1e3 * m_:7.3f}, cpu {1e3 * c_:7.3f})  overhead "
        f"{1e3 * (b_ - forwards):7.3f} (median {1e3 * (m_ - fmed):7.3f})"
        f"  thunks {hlo.get('thunks', '-')} (+{hlo.get('nested_thunks', '-')} "
        f"in {hlo.get('while', '-')} loops; {hlo.get('executed', '-')} run) "
        f"fusions {hlo.get('fusion', '-')} copies {hlo.get('copy', '-')}",
        flush=True,
    )
    if hlo and name == "full":
        print(f"  {'':11} top ops: {hlo['top_ops']}", flush=True)
    return row


def _loop_rows(times: dict, loads: list, cases: dict, batch: int, gamma: int) -> tuple:
    """The rows of every timed loop at (B, γ), after printing the forwards; also returns
    (T_step, T_score, T_draft), the best of the forwards."""
    best = {k: min(w for w, _ in v) for k, v in times.items()}
    med = {k: statistics.median(w for w, _ in v) for k, v in times.items()}
    cpu = {k: min(c for _, c in v) for k, v in times.items()}
    # A tree's drafters draft one after another: γ · ΣT_draft, then one score.
    drafts = [k for k in times if k[0] == "fwd" and k[1].startswith("T_draft")]
    t_step, t_score = best[("fwd", "T_step")], best[("fwd", "T_score")]
    t_draft = sum(best[k] for k in drafts)
    forwards = t_score + gamma * t_draft
    fmed = med[("fwd", "T_score")] + gamma * sum(med[k] for k in drafts)
    print(
        f"\nB={batch} γ={gamma}: T_step {1e3 * t_step:.3f} ms, T_score "
        f"{1e3 * t_score:.3f} ms ({t_score / t_step:.2f}x), T_draft "
        f"{1e3 * t_draft:.4f} ms; forwards/round {1e3 * forwards:.3f} ms "
        f"(medians: T_step {1e3 * med[('fwd', 'T_step')]:.3f}, forwards "
        f"{1e3 * fmed:.3f}); load {np.mean(loads):.2f} "
        f"[{min(loads):.2f}, {max(loads):.2f}]",
        flush=True,
    )
    fwd_s = dict(
        t_step=t_step, t_score=t_score, t_draft=t_draft, forwards=forwards, forwards_median=fmed
    )
    rows = []
    for pkg, name in times:
        if pkg == "fwd":
            continue
        stats = (best[(pkg, name)], med[(pkg, name)], cpu[(pkg, name)])
        rows.append(_loop_row(cases[pkg], pkg, name, stats, fwd_s, float(np.mean(loads))))
    return rows, (t_step, t_score, t_draft)


def main(argv):
    del argv
    prov = provenance.provenance()
    pkgs = ["specjax"]
    if FLAGS.compare_with:
        sys.path.insert(0, FLAGS.compare_with)
        pkgs = ["specjax_old", "specjax"]
    loaded = _load_packages(pkgs)
    print(f"jax {jax.__version__} devices {jax.devices()} load {os.getloadavg()}", flush=True)
    results = []
    for batch in [int(b) for b in FLAGS.batches]:
        for gamma in [int(g) for g in FLAGS.gammas]:
            cases = _compile_cases(loaded, pkgs, batch, gamma)
            fwd = _forwards(loaded, cases["specjax"], batch, gamma)
            # Paired timing: every program once per repeat, in turn (min and median).
            times, loads = _paired_times(fwd, cases)
            if FLAGS.profile_dir:
                _profile_thunks(cases["specjax"], batch, gamma)
            rows, (t_step, t_score, t_draft) = _loop_rows(times, loads, cases, batch, gamma)
            results.extend(rows)
            if FLAGS.e2e:
                run = types.SimpleNamespace(
                    members=_members(),
                    engine_config=_engine_config,
                    new_tokens=FLAGS.new_tokens,
                    temperature=FLAGS.verifier_temperature,
                    bucket=FLAGS.bucket,
                    repeats=FLAGS.repeats,
                )
                results.extend(
                    end_to_end(loaded, pkgs, run, batch, gamma, t_step, t_score, t_draft)
                )
            if len(pkgs) == 2:
                a = np.array([w for w, _ in times[("specjax_old", "full")]])
                b_ = np.array([w for w, _ in times[("specjax", "full")]])
                print(
                    f"  paired new/old: median ratio {np.median(b_ / a):.3f}, "
                    f"min/min {b_.min() / a.min():.3f}",
                    flush=True,
                )
    path = provenance.write_json(Path(FLAGS.out) / "profile_round.json", dict(rows=results), prov)
    print(f"wrote {path}")


if __name__ == "__main__":
    define_flags()
    sf.run(main, validate, "profile_round")
