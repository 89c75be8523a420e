"""The TPU deployment planner: what fits and what a round costs on named slices.

    python -m specjax.tpu.plan --config=configs/plan_tpu.py:smollm2 --workdir=runs/plan_tpu
    python -m specjax.tpu.plan --config=configs/plan_tpu.py:field_report --workdir=runs/plan_tpu
    python -m specjax.tpu.plan --config=configs/plan_tpu.py:smollm2 \
        --config=configs/plan_tpu.py:field_report --workdir=runs/plan_tpu --norun \
        --page=docs/results/tpu_plan.md

Each task compiles one program for one slice with XLA:TPU's compile-only devices
(`specjax.tpu.targets`) and appends what the compiler said to ``<workdir>/plan.jsonl``, one
line per task written whole (a killed run loses at most the task in flight; a rerun skips
what the journal holds). The page is rendered from the journal alone.

What it can know: whether each program compiles, its per-chip memory (temporaries
included) against the chip's HBM, its FLOPs and bytes, the compiler's own time estimate,
the collectives and relayout copies in its optimized HLO. What it cannot: a measured time.
A time is the compiler's estimate (``optimal_seconds``) where it gives a positive one, else
a roofline from the compiled FLOPs and the bytes the program must move at least once (its
arguments and its outputs not aliased to a donated argument) at the chip's published peaks
— the page says which. Projections use Leviathan et al.'s hardware-aware speed-up with α
measured by the project's own runs (α is the drafter's and the text's, not the hardware's;
each config names the run it came from).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import json
import math
import os
import sys
import time
from pathlib import Path

import jax
from absl import app, flags

from specjax.errors import ConfigError
from specjax.tpu import programs as P
from specjax.tpu.aot import compile_for
from specjax.tpu.shapes import abstract_model
from specjax.tpu.targets import CHIPS, SLICES, get_slice, slice_mesh

__all__ = ['Task', 'estimate_seconds', 'hw_aware_speedup', 'main', 'render', 'run_tasks']


@dataclasses.dataclass(frozen=True)
class Task:
    """One program on one slice: what the journal keys a line by."""

    deployment: str
    slice: str
    rules: str
    program: str  # 'forward' | 'drafter_forward' | 'generate' | 'ar' | a state program
    batch: int
    k: int = 1  # forward: tokens scored
    capacity: int = 0  # forward: the KV cache's slots
    rule: str = ''  # generate: the verification rule
    drafters: str = ''  # generate: drafter names joined by '+'
    gamma: int = 0
    model_axis: int = 0  # chips on 'model' (the rest on 'data')
    layouts: str = ''  # forward: 'auto' (the compiler lays the weights out) or '' (default)

    @property
    def key(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)


#: Cached tokens a step's roofline counts as read (the forwards' own context: a step reads
#: the cache blocks that hold a committed slot, not its capacity).
CONTEXT = 128


def estimate_seconds(
    rec: dict, chip, unread: float = 0.0, compiler: bool = True
) -> tuple[float, str]:
    """(seconds, how): the compiler's estimate where positive (and ``compiler``), else the
    roofline: the compiled FLOPs at the chip's peak, or the bytes the program moves at
    least once (its arguments and its outputs not aliased to a donated argument, less
    ``unread``: cache slots past the context) at its HBM bandwidth, whichever is longer."""
    opt = rec.get('optimal_seconds')
    if compiler and opt is not None and math.isfinite(opt) and opt > 0:
        return opt, 'compiler'
    moved = rec['argument_bytes'] + rec['output_bytes'] - rec['alias_bytes'] - unread
    return max(rec['flops'] / chip.peak_flops, moved / chip.hbm_bandwidth), 'roofline'


@functools.cache
def _served(verifier: str, max_len: int, dtype: str, chips: int):
    """A deployment's served verifier (a 70B's abstract model takes ~10 s to build: once
    per page and slice)."""
    lm, params = abstract_model(verifier, max_len=max_len, dtype=dtype)
    return P.serve_form(lm, params, chips)


@functools.cache
def _estimate_bytes(config, batch: int, chips: int, rules: str) -> dict:
    from specjax.models.hf import estimate_bytes  # pylint: disable=import-outside-toplevel

    return estimate_bytes(config, batch, {'data': 1, 'model': chips}, rules)


def _unread_cache(cfg, sl: str):
    """batch -> the per-chip bytes of a forward's KV cache past `CONTEXT` slots."""
    chips = SLICES[sl].chips
    lm, _ = _served(cfg.verifier, cfg.capacity, cfg.dtype, chips)

    def unread(batch: int, k: int = 1) -> float:
        kv = _estimate_bytes(lm.config, batch, chips, cfg.recommend)['kv_cache']
        return kv * max(0.0, 1 - (CONTEXT + k) / cfg.capacity)

    return unread


def hw_aware_speedup(alpha: float, gamma: int, c: float, score_ratio: float) -> float:
    """Leviathan et al.'s expected speed-up of one chain of γ: E[tokens per round] ·
    T_step / (γ · T_draft + T_score(γ + 1)), with ``c`` = T_draft / T_step and
    ``score_ratio`` = T_score(γ + 1) / T_step."""
    e = gamma + 1 if alpha >= 1 else (1 - alpha ** (gamma + 1)) / (1 - alpha)
    return e / (gamma * c + score_ratio)


# ----------------------------------------------------------------------------------------
# Deployments
# ----------------------------------------------------------------------------------------


def _deployment(cfg, model_shards: int):
    """(verifier lm, params, {name: Drafter}) in the served form for ``model_shards``."""
    lm, params = abstract_model(cfg.verifier, max_len=cfg.max_len, dtype=cfg.dtype)
    lm, params = P.serve_form(lm, params, model_shards)
    drafters = {}
    for name, spec in cfg.drafters.items():
        d_lm = None
        if spec.get('model'):
            d_lm, _ = abstract_model(spec['model'], max_len=cfg.max_len, dtype=cfg.dtype)
            d_lm, _ = P.serve_form(d_lm, d_lm.abstract_params(), 1)
        drafters[name] = P.drafter(spec['kind'], lm, name=name, lm=d_lm)
    return lm, params, drafters


def model_axis(rules: str, chips: int) -> int:
    """Chips on 'model' for a rule set's mesh: all of them for tensor parallelism, none for
    fsdp (every chip on 'data', over which it splits the weights), about √chips for
    fsdp_tp (a square-ish data × model mesh)."""
    if rules == 'fsdp':
        return 1
    if rules == 'fsdp_tp':
        m = 1
        while m * m < chips and chips % (2 * m) == 0:
            m *= 2
        return m
    return chips


def _tasks(cfg) -> list[Task]:
    out = []
    for sl in cfg.slices:
        chips = get_slice(sl).chips
        for rules in cfg.rule_sets:
            batches = cfg.batches if rules == cfg.recommend else cfg.other_batches
            for b in batches:
                ks = cfg.ks if b == min(cfg.batches) and rules == cfg.recommend else cfg.ks_other
                for k in ks:
                    out.append(
                        Task(
                            cfg.name,
                            sl,
                            rules,
                            'forward',
                            b,
                            k,
                            cfg.capacity,
                            model_axis=model_axis(rules, chips),
                            layouts='auto',
                        )
                    )
        for b in cfg.drafter_batches:
            for name in cfg.drafters:
                if cfg.drafters[name]['kind'] in ('transformer', 'cross', 'subset'):
                    out.append(
                        Task(
                            cfg.name,
                            sl,
                            cfg.recommend,
                            'drafter_forward',
                            b,
                            1,
                            cfg.capacity,
                            drafters=name,
                            model_axis=chips,
                            layouts='auto',
                        )
                    )
        for rule, names in cfg.generates:
            out.append(
                Task(
                    cfg.name,
                    sl,
                    cfg.recommend,
                    'generate',
                    cfg.generate_batch,
                    rule=rule,
                    drafters=names,
                    gamma=cfg.gamma,
                    model_axis=chips,
                )
            )
        if cfg.state_programs:
            out.append(
                Task(cfg.name, sl, cfg.recommend, 'ar', cfg.generate_batch, model_axis=chips)
            )
            for prog in ('plan_first', 'plan_continue', 'plan_fallback', 'state_rows'):
                out.append(
                    Task(
                        cfg.name,
                        sl,
                        cfg.recommend,
                        prog,
                        cfg.generate_batch,
                        rule=cfg.state_rule,
                        drafters=cfg.state_drafters,
                        gamma=cfg.gamma,
                        model_axis=chips,
                    )
                )
    return out


def _program(cfg, task: Task, cache: dict):
    """(fn, statics, args, mesh) of a task."""
    mesh = slice_mesh(task.slice, get_slice(task.slice).chips // task.model_axis, task.model_axis)
    key = (task.slice, task.model_axis)
    if key not in cache:
        cache.clear()
        cache[key] = _deployment(cfg, task.model_axis)
    lm, params, drafters = cache[key]
    if task.program == 'forward':
        fn, args = P.forward_program(
            lm,
            params,
            mesh,
            task.rules,
            task.batch,
            task.k,
            task.capacity,
            param_layouts=task.layouts or None,
        )
        return fn, {}, args, mesh
    if task.program == 'drafter_forward':
        d = drafters[task.drafters]
        inner = getattr(d.spec.lm, 'inner', d.spec.lm)
        fn, args = P.forward_program(
            inner,
            inner.abstract_params(),
            mesh,
            task.rules,
            task.batch,
            1,
            task.capacity,
            param_layouts=task.layouts or None,
        )
        return fn, {}, args, mesh
    ds = [drafters[n] for n in task.drafters.split('+') if n]
    common = dict(batch=task.batch, prompt_len=cfg.prompt_len, new_tokens=cfg.new_tokens)
    if task.program == 'generate':
        fn, st, args = P.generate_program(
            lm, params, ds, mesh, task.rules, rule=task.rule, gamma=task.gamma, **common
        )
    elif task.program == 'ar':
        fn, st, args = P.ar_program(lm, params, mesh, task.rules, **common)
    else:
        progs = P.state_programs(
            lm, params, ds, mesh, task.rules, rule=task.rule, gamma=task.gamma, **common
        )
        fn, st, args = progs[task.program]
    return fn, st, args, mesh


def _read_journal(path: Path) -> dict[str, dict]:
    out = {}
    if not path.exists():
        return out
    for line in path.read_text(encoding='utf-8').splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:  # a torn last line: that task runs again
            continue
        # A line written before a Task field existed holds that field's default: keyed
        # anew, a later line for the same task supersedes it.
        fields = {f.name: rec.get(f.name, f.default) for f in dataclasses.fields(Task)}
        rec = dict(rec, **fields, key=Task(**fields).key)
        out[rec['key']] = rec
    return out


def _append(path: Path, rec: dict) -> None:
    line = json.dumps(rec, sort_keys=True) + '\n'
    with open(path, 'a', encoding='utf-8') as f:
        f.write(line)
        f.flush()
        os.fsync(f.fileno())


def run_tasks(cfg, workdir: Path, log=print) -> Path:
    """Compiles every task of ``cfg`` not yet in ``workdir/plan.jsonl``; returns its path."""
    workdir.mkdir(parents=True, exist_ok=True)
    journal = workdir / 'plan.jsonl'
    done = _read_journal(journal)
    cache: dict = {}
    todo = [t for t in _tasks(cfg) if t.key not in done]
    log(f'{len(todo)} programs to compile ({len(done)} in the journal)')
    for i, task in enumerate(todo):
        fn, st, args, mesh = _program(cfg, task, cache)
        with jax.set_mesh(mesh):
            c = compile_for(fn, args, st, name=task.program, target=task.slice)
        rec = dict(
            dataclasses.asdict(task),
            key=task.key,
            ok=c.ok,
            error=c.error,
            compile_s=c.seconds_to_compile,
            argument_bytes=c.argument_bytes,
            output_bytes=c.output_bytes,
            alias_bytes=c.alias_bytes,
            temp_bytes=c.temp_bytes,
            peak_bytes=c.peak_bytes,
            flops=c.flops,
            bytes_accessed=c.bytes_accessed,
            optimal_seconds=c.optimal_seconds,
            collectives={k: list(v) for k, v in c.collectives().items()},
            collectives_in_loop={k: list(v) for k, v in c.collectives(True).items()},
            largest_gather=_op(c.largest('all-gather')),
            copies=[_op(o) for o in c.copies()][:8],
            n_copies=len(c.copies()),
            date=time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime()),
        )
        _append(journal, rec)
        status = 'ok' if c.ok else f'FAILED {c.error}'
        log(
            f'[{i + 1}/{len(todo)}] {task.slice} {task.rules} {task.program} B{task.batch} '
            f'k{task.k} {task.rule} {task.drafters}: {status}, peak '
            f'{c.peak_bytes / 2**30:.2f} GiB, {c.seconds_to_compile:.0f} s'
        )
    return journal


def _op(o):
    return None if o is None else {'bytes': o.bytes, 'shape': o.shape[:120], 'in_loop': o.in_loop}


# ----------------------------------------------------------------------------------------
# The page
# ----------------------------------------------------------------------------------------


def _gib(b) -> str:
    return f'{b / 2**30:.2f}'


def _coll(c: dict) -> str:
    if not c:
        return 'none'
    return ', '.join(f'{k} ×{n} ({b / 2**20:.1f} MiB)' for k, (n, b) in sorted(c.items()))


def _fit_table(recs, chip) -> list[str]:
    lines = [
        '| rules | mesh data × model | B | k | compiled | peak GiB / chip | of HBM | '
        'all-gathers per step | other collectives | relayout copies ≥ 1 MiB |',
        '|---|---|---|---|---|---|---|---|---|---|',
    ]
    for r in recs:
        coll = dict(r['collectives'])
        gathers = coll.pop('all-gather', None)
        g = 'none' if not gathers else f'×{gathers[0]} ({gathers[1] / 2**30:.2f} GiB)'
        state = 'yes' if r['ok'] else f"no: {r['error'][:120]}"
        frac = f"{r['peak_bytes'] / chip.hbm_bytes:.0%}" if r['ok'] else '–'
        mesh = f"{SLICES[r['slice']].chips // r['model_axis']} × {r['model_axis']}"
        lines.append(
            f"| {r['rules']} | {mesh} | {r['batch']} | {r['k']} | {state} | "
            f"{_gib(r['peak_bytes']) if r['ok'] else '–'} | {frac} | {g} | {_coll(coll)} | "
            f"{r['n_copies'] if r['ok'] else '–'} |"
        )
    return lines


def _ratio_table(recs, chip, unread, compiler=True) -> tuple[list[str], dict]:
    by_b: dict[int, dict[int, tuple[float, str]]] = {}
    for r in recs:
        if r['ok']:
            t = estimate_seconds(r, chip, unread(r['batch'], r['k']), compiler)
            by_b.setdefault(r['batch'], {})[r['k']] = t
    ks = sorted({k for v in by_b.values() for k in v})
    lines = [
        f"| B | T_step (µs) | how | {' | '.join(f'k={k}' for k in ks)} |",
        '|---|---|---|' + '---|' * len(ks),
    ]
    ratios = {}
    for b in sorted(by_b):
        row = by_b[b]
        if 1 not in row:
            continue
        t1, how = row[1]
        ratios[b] = {k: row[k][0] / t1 for k in row}
        cells = ' | '.join(f'{ratios[b][k]:.2f}' if k in row else '–' for k in ks)
        lines.append(f'| {b} | {1e6 * t1:.1f} | {how} | {cells} |')
    return lines, {b: (by_b[b][1][0], ratios[b]) for b in ratios}


def _streamed_bytes(lm) -> int:
    """Bytes of weights a one-token forward of a feature drafter streams: every parameter
    array but its copy of the verifier's input table (read by row)."""
    params = dict(lm.abstract_params())
    params.pop('embed', None)
    return int(sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(params)))


def _drafter_costs(cfg, here, b, t_step, chip, model_axis) -> dict[str, tuple[float, str]]:
    """{drafter: (c = T_draft / T_step, how)} at TPU prices: a compiled forward where the
    page has one, a feature drafter's streamed bytes ÷ the chip's bandwidth, 0 for lookup."""
    out = {}
    for r in here:
        if r['program'] == 'drafter_forward' and r['ok'] and r['batch'] == b:
            t, how = estimate_seconds(r, chip, compiler=False)  # its whole cache: an upper bound
            out[r['drafters']] = (t / t_step, f'compiled forward, {how}')
    for name, spec in cfg.drafters.items():
        if spec['kind'] == 'lookup':
            out[name] = (0.0, 'no model')
        elif spec['kind'] == 'eagle' and name not in out:
            lm, _ = abstract_model(cfg.verifier, max_len=cfg.max_len, dtype=cfg.dtype)
            d = P.drafter('eagle', lm)
            t = _streamed_bytes(d.spec.lm) / model_axis / chip.hbm_bandwidth
            out[name] = (t / t_step, 'its streamed bytes ÷ bandwidth')
    return out


def _projection(cfg, ratios, costs) -> list[str]:
    seed = dict(cfg.get('seed_costs', None) or {})
    lines = [
        '| drafter | α (source) | c = T_draft / T_step (how) | γ | T_score(γ+1) / T_step | '
        'projected spec / AR | at seed sizes (c = params ratio, T_score = T_step) |',
        '|---|---|---|---|---|---|---|',
    ]
    for name, (alpha, source) in cfg.alphas.items():
        if name not in costs:
            continue
        c, how = costs[name]
        best = None
        for g in range(1, 8):
            if g + 1 not in ratios:
                continue
            sp = hw_aware_speedup(alpha, g, c, ratios[g + 1])
            if best is None or sp > best[0]:
                best = (sp, g, ratios[g + 1])
        if best is None:
            continue
        at_seed = '–'
        if name in seed:
            at_seed = (
                f'{hw_aware_speedup(alpha, best[1], seed[name], 1.0):.2f} (c {seed[name]:.3f})'
            )
        lines.append(
            f'| {name} | {alpha:.2f} ({source}) | {c:.3f} ({how}) | {best[1]} | {best[2]:.2f} | '
            f'{best[0]:.2f} | {at_seed} |'
        )
    return lines


def _estimates(cfg, sl, recs, chip, unread) -> list[str]:
    """The analytic estimates (`hf.estimate_bytes`, `hardware.roofline_seconds`) against
    the compiled figures of the recommended rules' steps."""
    from specjax.hardware import roofline_seconds  # pylint: disable=import-outside-toplevel

    chips = SLICES[sl].chips
    lm, params = _served(cfg.verifier, cfg.capacity, cfg.dtype, chips)
    n_params = sum(x.size for x in jax.tree.leaves(params))
    lines = [
        '| B | k | estimate_bytes GiB | compiled arguments GiB | ÷ | + temporaries: peak GiB | '
        'analytic T µs | compiled T µs (how) | ÷ |',
        '|---|---|---|---|---|---|---|---|---|',
    ]
    for r in sorted(recs, key=lambda r: (r['batch'], r['k'])):
        if not r['ok'] or r['k'] not in (1, 4):
            continue
        est = _estimate_bytes(lm.config, r['batch'], chips, cfg.recommend)
        t_an = (
            roofline_seconds(
                lm.config,
                n_params,
                r['k'],
                r['batch'],
                CONTEXT,
                chip.hbm_bandwidth,
                chip.peak_flops,
            )
            / chips
        )
        t_c, how = estimate_seconds(r, chip, unread(r['batch'], r['k']))
        t_r, _ = estimate_seconds(r, chip, unread(r['batch'], r['k']), compiler=False)
        if how == 'compiler':
            how = f'compiler; roofline {1e6 * t_r:.0f}'
        lines.append(
            f"| {r['batch']} | {r['k']} | {_gib(est['total'])} | {_gib(r['argument_bytes'])} | "
            f"{est['total'] / r['argument_bytes']:.2f} | {_gib(r['peak_bytes'])} | "
            f'{1e6 * t_an:.0f} | {1e6 * t_c:.0f} ({how}) | {t_an / t_c:.2f} |'
        )
    return lines


def render(journal: Path, configs: dict, command: str) -> str:
    """The results page of a journal (markdown)."""
    recs = list(_read_journal(journal).values())
    commit = os.popen('git rev-parse --short HEAD 2>/dev/null').read().strip() or 'unknown'
    try:
        import libtpu  # pylint: disable=import-outside-toplevel

        libtpu_v = getattr(libtpu, '__version__', '?')
    except ImportError:
        libtpu_v = 'absent'
    dates = sorted(r['date'] for r in recs)
    out = [
        '# Planning on TPU: what fits and what a round costs (compiled, not measured)',
        '',
        f'Written by `{command}` at commit `{commit}`; the programs compiled '
        f"{dates[0] if dates else '–'} … {dates[-1] if dates else '–'} with XLA:TPU's "
        f'compile-only devices (libtpu {libtpu_v}, jax {jax.__version__}) on a host with no '
        'TPU. Nothing on this page was run on a chip: memory, FLOPs, collectives and copies '
        "are the compiler's; a time is the compiler's estimate (`optimal_seconds`, "
        "'compiler') where it gives a positive one (v5p), else a roofline (max of the "
        "compiled FLOPs ÷ the chip's bf16 peak and the bytes the program must move once — "
        "its arguments and its non-donated outputs — ÷ its HBM bandwidth; 'roofline'). "
        'Chips: '
        + '; '.join(
            f'{c.name} {c.hbm_bytes / 1e9:.0f} GB HBM, {c.peak_flops / 1e12:.0f} TFLOP/s bf16, '
            f'{c.hbm_bandwidth / 1e9:.0f} GB/s ({c.source})'
            for c in CHIPS.values()
        )
        + '.',
        '',
        'Served form (`specjax.tpu.programs.serve_form`): KV heads repeated until the model '
        'axis divides them; a tied head stored as its own [D, V] array. Decode rules '
        '(`specjax.sharding.decode_rules`): under fsdp and fsdp_tp the batch is not split '
        "over 'data', so no weight moves. Caches are donated.",
        '',
    ]
    for dep_name, cfg in configs.items():
        mine = [r for r in recs if r['deployment'] == dep_name]
        if not mine:
            continue
        out += [f'## {cfg.title}', '', cfg.description, '']
        for sl in cfg.slices:
            chip = SLICES[sl].spec
            here = [r for r in mine if r['slice'] == sl]
            if not here:
                continue
            fwd = [r for r in here if r['program'] == 'forward']
            out += [f'### {sl} ({SLICES[sl].chips} × {chip.name})', '']
            fit = [r for r in fwd if r['k'] == 1]
            if fit:
                out += (
                    [f'Decode step (k = 1) per rule set, KV cache of {cfg.capacity} slots:', '']
                    + _fit_table(
                        sorted(fit, key=lambda r: (r['rules'], -r['model_axis'], r['batch'])),
                        chip,
                    )
                    + ['']
                )
            rec_fwd = [r for r in fwd if r['rules'] == cfg.recommend]
            unread = _unread_cache(cfg, sl)
            table, ratios = _ratio_table(rec_fwd, chip, unread, compiler=False)
            out += [
                f'T_step and T_score(k) / T_step under `{cfg.recommend}`, by the roofline of '
                'the compiled programs:',
                '',
            ]
            out += table + ['']
            by_compiler, _ = _ratio_table(rec_fwd, chip, unread, compiler=True)
            if any('| compiler |' in line for line in by_compiler):
                out += [
                    "The same by the compiler's own estimate (`optimal_seconds`). It is not "
                    'monotone in k (a one-token step estimated dearer than an 8-token '
                    'score), so the projections below use the roofline:',
                    '',
                ]
                out += by_compiler + ['']
            if ratios:
                b = min(ratios)
                t_step, rr = ratios[b]
                costs = _drafter_costs(cfg, here, b, t_step, chip, SLICES[sl].chips)
                out += [
                    f"Projected speculative ÷ autoregressive at B {b} (Leviathan et al.'s "
                    'hardware-aware formula, one chain: E[tokens per round] · T_step ÷ '
                    '(γ · T_draft + T_score(γ+1)); the best γ of 1–7 this page has '
                    'T_score for):',
                    '',
                ]
                out += _projection(cfg, rr, costs) + ['']
            out += [
                'The analytic estimates against the compiled figures (the recommended '
                "rules' steps; `hf.estimate_bytes`: weights and KV cache per chip; analytic "
                'T: `hardware.roofline_seconds` over 128 cached tokens, ÷ chips):',
                '',
            ]
            out += _estimates(cfg, sl, rec_fwd, chip, unread) + ['']
            progs = [r for r in here if r['program'] not in ('forward', 'drafter_forward')]
            if progs:
                out += [
                    'The engine\'s programs (generates and plan calls, batch '
                    f'{cfg.generate_batch}, γ {cfg.gamma}, {cfg.prompt_len}-token prompts, '
                    f'{cfg.new_tokens} new tokens):',
                    '',
                    '| program | rule | drafters | compiled | peak GiB / chip | '
                    'collectives per round (loop body) | relayout copies ≥ 1 MiB | '
                    'compile s (wall, this host) |',
                    '|---|---|---|---|---|---|---|---|',
                ]
                for r in progs:
                    ok = 'yes' if r['ok'] else f"no: {r['error'][:100]}"
                    out.append(
                        f"| {r['program']} | {r['rule'] or '–'} | {r['drafters'] or '–'} | {ok} | "
                        f"{_gib(r['peak_bytes']) if r['ok'] else '–'} | "
                        f"{_coll(r['collectives_in_loop']) if r['ok'] else '–'} | "
                        f"{r['n_copies'] if r['ok'] else '–'} | {r['compile_s']:.0f} |"
                    )
                out.append('')
    return '\n'.join(out) + '\n'


# ----------------------------------------------------------------------------------------
# Command line
# ----------------------------------------------------------------------------------------

FLAGS = flags.FLAGS
flags.DEFINE_multi_string('config', [], 'configs/plan_tpu.py:<deployment> (repeatable).')
flags.DEFINE_string('workdir', 'runs/plan_tpu', 'Where the journal plan.jsonl lives.')
flags.DEFINE_string('page', '', 'Write the results page here (markdown) after compiling.')
flags.DEFINE_bool('run', True, 'Compile what the journal lacks (--norun: only write the page).')


def _load(arg: str):
    """``path.py:name`` -> that file's ``get_config('name')``."""
    path, _, name = arg.partition(':')
    if not Path(path).is_file():
        raise ConfigError(f'--config={arg}: no file {path!r}; allowed: configs/plan_tpu.py:<name>')
    spec = importlib.util.spec_from_file_location('plan_config', path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config(name)


def main(argv) -> int:
    if len(argv) > 1:
        raise ConfigError(f'unexpected arguments {argv[1:]}; allowed: flags only')
    workdir = Path(FLAGS.workdir)
    if workdir.exists() and not workdir.is_dir():
        raise ConfigError(f'--workdir={workdir}: a file; allowed: a folder')
    if FLAGS.page:
        page = Path(FLAGS.page)
        if page.is_dir() or not page.parent.is_dir():
            raise ConfigError(f'--page={page}: allowed: a file path in an existing folder')
    args = FLAGS.config or ['configs/plan_tpu.py:smollm2', 'configs/plan_tpu.py:field_report']
    configs = {}
    for a in args:
        cfg = _load(a)
        for s in cfg.slices:
            get_slice(s)
        configs[cfg.name] = cfg
    for cfg in configs.values():
        if FLAGS.run:
            run_tasks(cfg, workdir)
    if FLAGS.page:
        command = 'python -m specjax.tpu.plan ' + ' '.join(
            a for a in sys.argv[1:] if not a.startswith(('--page', '--norun'))
        )
        page = Path(FLAGS.page)
        tmp = page.with_suffix('.tmp')
        tmp.write_text(render(workdir / 'plan.jsonl', configs, command.strip()), encoding='utf-8')
        tmp.replace(page)
        print(f'wrote {page}')
    return 0


def entry() -> None:
    def _main(argv):
        try:
            return main(argv)
        except ConfigError as e:
            print(f'error: {e}', file=sys.stderr)
            sys.exit(2)

    app.run(_main)


if __name__ == '__main__':
    entry()
