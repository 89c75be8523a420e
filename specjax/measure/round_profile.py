"""Where a speculative round's time goes: the measurement of experiments/profile_round.py
(which holds its flags, their checks and the JSON's write; its docstring says what is
measured and printed).

`profile(settings, pkgs)` times, for every batch and γ, the compiled speculative loop of
each package in ``pkgs`` (``specjax``, and a renamed older copy ``specjax_old`` for paired
timing) against its model forwards, interleaved, and returns the rows. The package's
modules by role, the HLO census, the thunk profile, the ablated rounds and the end-to-end
timing are `specjax.measure.round_anatomy`'s.
"""

from __future__ import annotations

import collections
import dataclasses
import importlib
import os
import statistics
import time
import types
from collections.abc import Mapping
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from specjax.atomic import atomic_write_text
from specjax.errors import ConfigError, check
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

__all__ = ["OPTION_SETS", "SMOLLM2_MAX_LEN", "Case", "Settings", "profile", "set_attr_value"]

#: SmolLM2's context as the profile loads it (`load_packages`).
SMOLLM2_MAX_LEN = 1024

#: XLA:CPU option sets the full round may also be compiled with (`--compiler_options`).
OPTION_SETS = {
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


@dataclasses.dataclass(frozen=True, kw_only=True)
class Settings:
    """What one profile measures (experiments/profile_round.py's flags, checked);
    ``weight_layouts``: the --verifier kind loads a GGUF file in a layout (SmolLM2)."""

    batches: tuple[str, ...]
    gammas: tuple[str, ...]
    weight_layouts: bool
    dtype: str
    drafter: str
    rule: str | None
    compare_rule: str | None
    q_layout: str
    verifier_temperature: float
    new_tokens: int
    bucket: int
    ablate: bool
    hlo: bool
    hlo_dump: str | None
    profile_dir: str | None
    set_attr: tuple[str, ...]
    variants: tuple[str, ...]
    compiler_options: tuple[str, ...]
    e2e: bool
    repeats: int

    @classmethod
    def from_values(cls, values: Mapping, **given) -> Settings:
        """The settings among ``values`` (e.g. `absl.flags.FLAGS.flag_values_dict()`) and
        ``given``."""
        seq = {f.name for f in dataclasses.fields(cls) if f.type.startswith("tuple")}
        picked = {}
        for f in dataclasses.fields(cls):
            if f.name not in given:
                picked[f.name] = tuple(values[f.name]) if f.name in seq else values[f.name]
        return cls(**picked, **given)

    def members(self) -> list[str]:
        """The chains' drafters of --drafter ('lookup+eagle*2' -> [lookup, eagle, eagle])."""
        return entries.members(self.drafter)

    def engine_config(self, mods, gamma: int, max_new_tokens: int):
        """The engine config of --drafter at γ: one chain per drafter (a tree when several)."""
        s = len(self.members())
        rule = self.rule or ("rejection" if s == 1 else "token_tree")
        if self.compare_rule and mods["pkg"] != "specjax":  # the --compare_with package
            rule = self.compare_rule
        layout = {}
        if self.q_layout != "dense" and mods["pkg"] == "specjax":  # not the --compare_with one
            layout = dict(q_layout=self.q_layout)
        return mods["spec"].EngineConfig(
            gamma=gamma,
            rule=rule,
            verifier_temperature=self.verifier_temperature,
            max_new_tokens=max_new_tokens,
            n_slots=s,
            **layout,
        )


def set_attr_value(setting: str):
    """(module, attribute, value) of a --set_attr entry ``module.ATTR=value``, the value of
    the attribute's type; a `ConfigError` naming the flag otherwise."""
    allowed = "module.ATTR=value entries, module one of specjax's, ATTR one of its attributes"
    path, eq, value = setting.partition("=")
    mod_name, dot, attr = path.rpartition(".")
    check(eq and dot and mod_name and attr, "--set_attr", setting, allowed)
    try:
        mod = importlib.import_module(f"specjax.{mod_name}")
    except ImportError:
        raise ConfigError.invalid(
            "--set_attr", setting, f"{allowed} (no module specjax.{mod_name})"
        ) from None
    check(
        hasattr(mod, attr), "--set_attr", setting, f"{allowed} (specjax.{mod_name} has no {attr})"
    )
    old = getattr(mod, attr)
    if isinstance(old, bool):
        words = {"true": True, "1": True, "false": False, "0": False}
        check(value.lower() in words, "--set_attr", setting, f"{allowed}, value true or false")
        return mod, attr, words[value.lower()]
    try:
        return mod, attr, type(old)(value)
    except (TypeError, ValueError):
        raise ConfigError.invalid(
            "--set_attr", setting, f"{allowed}, value a {type(old).__name__}"
        ) from None


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

    def __init__(self, s: Settings, mods, full, texts, batch, gamma):
        self.mods = mods
        gen = mods["gen"]
        dep = full.subset(s.members())
        self.dep = dep
        v_prompts = [full.encode(t) for t in texts]
        d_prompts = [[enc(t) for t in texts] for enc in dep.drafter_encode]
        keys = gen.row_keys_for(0, batch)
        self.cfg = s.engine_config(mods, gamma, max_new_tokens=1)
        first = gen.speculative_generate(
            self.cfg,
            dep.verifier,
            dep.v_params,
            dep.drafters,
            dep.d_data,
            v_prompts,
            d_prompts,
            keys,
            bucket=s.bucket,
            reserve=s.new_tokens,
            return_state=True,
        )
        carry = first.state
        d_data = tuple(
            d.replace(temperature=jnp.float32(spec.temperature))
            for d, spec in zip(dep.d_data, dep.drafters)
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
            jnp.float32(s.verifier_temperature),
            jnp.int32(s.new_tokens),
            carry,
            jnp.asarray(keys),
        )
        self.drafters = tuple(d.static for d in dep.drafters)
        share = getattr(mods["spec"], "share_drafting", None)  # a drafter named twice
        if share is not None:
            self.drafters = share(self.drafters, dep.d_data)
        self.capacity = carry.vcache.max_len
        self.d_capacity = [c.max_len for c in carry.dcaches]
        self.context = int(np.mean(np.asarray(carry.length))) + s.new_tokens // 2
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


# ----------------------------------------------------------------------------------------
# The packages, their programs and the paired timing
# ----------------------------------------------------------------------------------------


def _from_smollm2(pkg: str, mods: dict):
    """`from_smollm2` of package ``pkg``: its smollm2 deployment kind's (a tree from before
    the kind held it: its engine's)."""
    try:
        return importlib.import_module(f"{pkg}.runner.deployments.smollm2").from_smollm2
    except ModuleNotFoundError:
        return mods["dep"].from_smollm2


def load_packages(s: Settings, pkgs: list[str]) -> dict:
    """Per package: its modules, the full deployment (the zoo's, or SmolLM2 in the --dtype
    layout with the --drafter), and the plan prompts' texts."""
    loaded = {}
    for pkg in pkgs:
        mods = load_package(pkg)
        if s.weight_layouts:
            gguf = importlib.import_module(f"{pkg}.models.gguf")
            model = gguf.smollm2_layout(s.dtype, max_len=SMOLLM2_MAX_LEN, field="--dtype")
            dt = s.dtype.partition(":")[0]
            full = _from_smollm2(pkg, mods)(
                list(dict.fromkeys(s.members())), dtype=dt, verifier=model
            )
        else:
            full = mods["dep"].from_zoo(mods["zoo"].load_zoo())
        texts_all = [p["prompt"] for p in mods["data"].load_prompts()]
        loaded[pkg] = (mods, full, texts_all)
    return loaded


def _compile_scratch(s: Settings, case: Case, pkg: str, fn) -> None:
    """The full round again under each --compiler_options set and each --set_attr setting."""
    for oname, opts in OPTION_SETS.items():
        if oname in s.compiler_options:
            case.compile(f"full+{oname}", fn, opts)
    for setting in s.set_attr:  # e.g. models.transformer.X=3 (checked by the script)
        mod_name = setting.partition("=")[0].rpartition(".")[0]
        _, attr, value = set_attr_value(setting)
        mod = importlib.import_module(f"{pkg}.{mod_name}")
        old = getattr(mod, attr)
        setattr(mod, attr, value)
        try:
            case.compile(f"full[{attr}={value}]", fn)
        finally:
            setattr(mod, attr, old)


def _compile_cases(s: Settings, loaded: dict, pkgs: list[str], batch: int, gamma: int) -> dict:
    """Per package, its Case at (B, γ) with every loop variant compiled (HLO dumped if asked)."""
    cases = {}
    for pkg in pkgs:
        mods, full, texts_all = loaded[pkg]
        texts = (texts_all * (batch // len(texts_all) + 1))[:batch]
        case = Case(s, mods, full, texts, batch, gamma)
        vs = (
            variants(mods)
            if (s.ablate and pkg == "specjax")
            else {"full": mods["decode"].speculative_round}
        )
        if s.variants:
            vs = {k: v for k, v in vs.items() if k == "full" or k in s.variants}
        for name, fn in vs.items():
            exe = case.compile(name, fn)
            if name == "full" and pkg == "specjax":
                _compile_scratch(s, case, pkg, fn)
            if s.hlo_dump:
                Path(s.hlo_dump).mkdir(parents=True, exist_ok=True)
                atomic_write_text(
                    Path(s.hlo_dump) / f"{pkg}_B{batch}_g{gamma}_{name}.hlo.txt", exe.as_text()
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


def _paired_times(s: Settings, fwd: dict, cases: dict) -> tuple:
    """Every program once per repeat, in turn: (wall, CPU) per round by program, and the load
    at each repeat's start."""
    times = collections.defaultdict(list)
    loads = []
    for _ in range(s.repeats):
        loads.append(os.getloadavg()[0])
        for name, f in fwd.items():
            times[("fwd", name)].append(f.run())
        for pkg, c in cases.items():
            for name in c.exes:
                times[(pkg, name)].append(c.run(name))
    return times, loads


def _profile_thunks(s: Settings, case: Case, batch: int, gamma: int) -> None:
    """One traced run of each of the case's programs under --profile_dir; prints its thunks."""
    for name in case.exes:
        pdir = f"{s.profile_dir}/B{batch}_g{gamma}_{name}"
        with jax.profiler.trace(pdir):
            case.run(name)
        exe, iters, _ = case.exes[name]
        print(f"  thunk profile of {name}:")
        thunk_profile(pdir, exe.as_text(), iters)


# ----------------------------------------------------------------------------------------
# The rows
# ----------------------------------------------------------------------------------------


def _loop_row(
    s: Settings, case: Case, pkg: str, name: str, stats: tuple, fwd_s: dict, load: float
) -> dict:
    """One program's row: ms per round (best, median, CPU), the forwards, the overhead, its
    HLO census; printed."""
    exe, iters, comp_s = case.exes[name]
    b_, m_, c_ = stats
    t_step, t_score, t_draft = fwd_s["t_step"], fwd_s["t_score"], fwd_s["t_draft"]
    forwards, fmed = fwd_s["forwards"], fwd_s["forwards_median"]
    hlo = loop_census(exe.as_text()) if s.hlo else {}
    row = dict(
        package=pkg,
        variant=name,
        drafters=s.members(),
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


def _loop_rows(s: Settings, times: dict, loads: list, cases: dict, batch: int, gamma: int) -> tuple:
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
        rows.append(_loop_row(s, cases[pkg], pkg, name, stats, fwd_s, float(np.mean(loads))))
    return rows, (t_step, t_score, t_draft)


def _print_paired(times: dict) -> None:
    """The new package's full round over the old one's, paired by repeat."""
    a = np.array([w for w, _ in times[("specjax_old", "full")]])
    b_ = np.array([w for w, _ in times[("specjax", "full")]])
    print(
        f"  paired new/old: median ratio {np.median(b_ / a):.3f}, min/min {b_.min() / a.min():.3f}",
        flush=True,
    )


def _profile_case(s: Settings, loaded: dict, pkgs: list[str], batch: int, gamma: int) -> list:
    """The rows at (B, γ): every package's loops against the forwards, paired; end to end
    with --e2e."""
    cases = _compile_cases(s, loaded, pkgs, batch, gamma)
    fwd = _forwards(loaded, cases["specjax"], batch, gamma)
    # Paired timing: every program once per repeat, in turn (min and median).
    times, loads = _paired_times(s, fwd, cases)
    if s.profile_dir:
        _profile_thunks(s, cases["specjax"], batch, gamma)
    rows, (t_step, t_score, t_draft) = _loop_rows(s, times, loads, cases, batch, gamma)
    if s.e2e:
        run = types.SimpleNamespace(
            members=s.members(),
            engine_config=s.engine_config,
            new_tokens=s.new_tokens,
            temperature=s.verifier_temperature,
            bucket=s.bucket,
            repeats=s.repeats,
        )
        rows.extend(end_to_end(loaded, pkgs, run, batch, gamma, t_step, t_score, t_draft))
    if len(pkgs) == 2:
        _print_paired(times)
    return rows


def profile(s: Settings, pkgs: list[str]) -> list[dict]:
    """Every (B, γ)'s rows, printed as they come; ``pkgs``: ``["specjax"]``, or
    ``["specjax_old", "specjax"]`` with the older copy importable (paired)."""
    loaded = load_packages(s, pkgs)
    print(f"jax {jax.__version__} devices {jax.devices()} load {os.getloadavg()}", flush=True)
    results = []
    for batch in [int(b) for b in s.batches]:
        for gamma in [int(g) for g in s.gammas]:
            results.extend(_profile_case(s, loaded, pkgs, batch, gamma))
    return results
