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
import os
import subprocess
import sys
import time
from pathlib import Path

import jax
from absl import app, flags

from specjax.errors import ConfigError
from specjax.tpu import layouts as LY
from specjax.tpu import programs as P
from specjax.tpu.aot import compile_for
from specjax.tpu.page import render
from specjax.tpu.shapes import abstract_model
from specjax.tpu.targets import get_slice, slice_mesh

__all__ = ['Task', 'main', 'model_axis', 'run_tasks']


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
    # The weights' layouts: 'auto' (the compiler's choice for this program), 'served' (the
    # deployment's one set, `specjax.tpu.layouts`, chosen for its 'served_layouts' program)
    # or '' (the device's default).
    layouts: str = ''

    @property
    def key(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)


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


def _served(cfg) -> set[str]:
    return set(cfg.served_drafters.split('+'))


def _forward_tasks(cfg, at, chips: int) -> list[Task]:
    """The verifier's steps and scores: every rule set, batch and k the config names (the
    recommended rules' in the served layouts, the others' in their own)."""
    out = []
    for rules in cfg.rule_sets:
        batches = cfg.batches if rules == cfg.recommend else cfg.other_batches
        layouts = 'served' if rules == cfg.recommend else 'auto'
        for b in batches:
            ks = cfg.ks if b == min(cfg.batches) and rules == cfg.recommend else cfg.ks_other
            for k in ks:
                axis = model_axis(rules, chips)
                out.append(
                    at(rules, 'forward', b, k, cfg.capacity, model_axis=axis, layouts=layouts)
                )
    return out


def _drafter_tasks(cfg, at, chips: int) -> list[Task]:
    """A one-token forward of each drafter that runs a model of its own."""
    out = []
    for b in cfg.drafter_batches:
        for name in cfg.drafters:
            kind = P.entry_kind(cfg.drafters[name]['kind'])
            if kind.has_weights and not kind.reads_features:
                layouts = 'served' if name in _served(cfg) else 'auto'
                out.append(
                    at(
                        cfg.recommend,
                        'drafter_forward',
                        b,
                        1,
                        cfg.capacity,
                        drafters=name,
                        model_axis=chips,
                        layouts=layouts,
                    )
                )
    return out


def _call_tasks(cfg, at, chips: int) -> list[Task]:
    """The engine's calls: the generates the config names, then (``state_programs``) the
    autoregressive baseline and the plan runner's calls on carried state."""
    call = functools.partial(
        at, cfg.recommend, batch=cfg.generate_batch, model_axis=chips, layouts='served'
    )
    out = [
        call(program='generate', rule=rule, drafters=names, gamma=cfg.gamma)
        for rule, names in cfg.generates
    ]
    if cfg.state_programs:
        out.append(call(program='ar'))
        for prog in ('plan_first', 'plan_continue', 'plan_fallback', 'state_rows'):
            out.append(
                call(
                    program=prog,
                    rule=cfg.state_rule,
                    drafters=cfg.state_drafters,
                    gamma=cfg.gamma,
                    layouts='' if prog == 'state_rows' else 'served',
                )
            )
    return out


def _tasks(cfg) -> list[Task]:
    """Every program of ``cfg``, per slice: first the program whose compiled layouts every
    'served' program takes, then the steps, the drafters' forwards and the calls."""
    out = []
    for sl in cfg.slices:
        chips = get_slice(sl).chips
        at = functools.partial(Task, cfg.name, sl)
        out.append(
            at(
                cfg.recommend,
                'served_layouts',
                cfg.generate_batch,
                rule=cfg.state_rule,
                drafters=cfg.served_drafters,
                gamma=cfg.gamma,
                model_axis=chips,
                layouts='auto',
            )
        )
        out += _forward_tasks(cfg, at, chips)
        out += _drafter_tasks(cfg, at, chips)
        out += _call_tasks(cfg, at, chips)
    return out


def _copy_bytes(cfg) -> int:
    """The smallest relayout copy the journal counts (``cfg.copy_min_bytes``, 1 MiB)."""
    return int(cfg.get('copy_min_bytes', 1 << 20))


def layouts_path(workdir: Path, task: Task) -> Path:
    """Where a slice's served layouts live (`specjax.tpu.layouts.save`)."""
    return Path(workdir) / 'layouts' / f'{task.deployment}_{task.slice}_{task.rules}.json'


def _served_set(workdir: Path, task: Task):
    """(verifier layouts, {drafter: layouts}) of the task's slice, or None where its
    'served_layouts' program has not compiled (the program then takes default layouts,
    and its journal line says so)."""
    path = layouts_path(workdir, task)
    return LY.load(path) if path.is_file() else None


def _forward(lm, params, mesh, task: Task, served):
    fn, args = P.forward_program(
        lm,
        params,
        mesh,
        task.rules,
        task.batch,
        task.k,
        task.capacity,
        param_layouts='auto' if task.layouts == 'auto' else None,
    )
    return fn, {}, (LY.apply(args, served, []) if served is not None else args), mesh


def _program(cfg, task: Task, cache: dict, workdir: Path):
    """(fn, statics, args, mesh, layouts) of a task; ``layouts`` says which the weights
    were compiled in ('auto', 'served', 'default': no served set yet)."""
    mesh = slice_mesh(task.slice, get_slice(task.slice).chips // task.model_axis, task.model_axis)
    key = (task.slice, task.model_axis)
    if key not in cache:
        cache.clear()
        cache[key] = _deployment(cfg, task.model_axis)
    lm, params, drafters = cache[key]
    served = _served_set(workdir, task) if task.layouts == 'served' else None
    how = 'default' if task.layouts == 'served' and served is None else task.layouts or 'default'
    if task.program == 'forward':
        return (*_forward(lm, params, mesh, task, served and served[0]), how)
    if task.program == 'drafter_forward':
        d = drafters[task.drafters]
        inner = getattr(d.spec.lm, 'inner', d.spec.lm)
        mine = served and served[1].get(task.drafters)
        return (*_forward(inner, inner.abstract_params(), mesh, task, mine), how)
    names = [n for n in task.drafters.split('+') if n]
    ds = [drafters[n] for n in names]
    common = dict(batch=task.batch, prompt_len=cfg.prompt_len, new_tokens=cfg.new_tokens)
    if task.program in ('generate', 'served_layouts'):
        fn, st, args = P.generate_program(
            lm, params, ds, mesh, task.rules, rule=task.rule, gamma=task.gamma, **common
        )
        if task.program == 'served_layouts':
            return LY.auto(fn, st, args), {}, args, mesh, how
    elif task.program == 'ar':
        fn, st, args = P.ar_program(lm, params, mesh, task.rules, **common)
    else:
        progs = P.state_programs(
            lm, params, ds, mesh, task.rules, rule=task.rule, gamma=task.gamma, **common
        )
        fn, st, args = progs[task.program]
    if served is not None:
        args = LY.apply(args, served[0], [served[1].get(n) for n in names])
    return fn, st, args, mesh, how


def _save_served(workdir: Path, task: Task, formats) -> None:
    v, ds = LY.chosen(formats)
    names = [n for n in task.drafters.split('+') if n]
    about = dict(dataclasses.asdict(task), date=time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime()))
    LY.save(layouts_path(workdir, task), v, dict(zip(names, ds)), about)


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


def _op(o):
    return None if o is None else {'bytes': o.bytes, 'shape': o.shape[:120], 'in_loop': o.in_loop}


def missing(cfg, workdir: Path) -> list[Task]:
    """The tasks of ``cfg`` that ``workdir/plan.jsonl`` does not hold yet."""
    done = _read_journal(workdir / 'plan.jsonl')
    return [t for t in _tasks(cfg) if t.key not in done]


def run_tasks(cfg, workdir: Path, log=print, limit: int = 0) -> Path:
    """Compiles the tasks of ``cfg`` not yet in ``workdir/plan.jsonl`` (at most ``limit``
    of them when > 0); returns its path."""
    workdir.mkdir(parents=True, exist_ok=True)
    journal = workdir / 'plan.jsonl'
    cache: dict = {}
    todo = missing(cfg, workdir)
    log(f'{len(todo)} programs to compile')
    if limit > 0:
        todo = todo[:limit]
    for i, task in enumerate(todo):
        fn, st, args, mesh, how = _program(cfg, task, cache, workdir)
        with jax.set_mesh(mesh):
            c = compile_for(fn, args, st, name=task.program, target=task.slice)
        if task.program == 'served_layouts' and c.ok:
            _save_served(workdir, task, c.input_formats)
        rec = dict(
            dataclasses.asdict(task),
            key=task.key,
            ok=c.ok,
            error=c.error,
            compiled_layouts=how,
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
            copies=[_op(o) for o in c.copies(_copy_bytes(cfg))][:8],
            n_copies=len(c.copies(_copy_bytes(cfg))),
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


# ----------------------------------------------------------------------------------------
# Command line
# ----------------------------------------------------------------------------------------

FLAGS = flags.FLAGS


def define_flags() -> None:
    """The command line's flags, defined when it runs (`entry`), never at import: importing
    the planner beside `specjax.main` (tests, notebooks) must not redefine --config."""
    flags.DEFINE_multi_string('config', [], 'configs/plan_tpu.py:<deployment> (repeatable).')
    flags.DEFINE_string('workdir', 'runs/plan_tpu', 'Where the journal plan.jsonl lives.')
    flags.DEFINE_string('page', '', 'Write the results page here (markdown) after compiling.')
    flags.DEFINE_bool('run', True, 'Compile what the journal lacks (--norun: only write the page).')
    flags.DEFINE_integer(
        'programs_per_process',
        8,
        'Compile in child processes of at most this many programs each (the compile-only '
        "client keeps ~0.3-0.5 GB per 70B program until its process exits); 0: all in this one.",
        lower_bound=0,
    )
    flags.DEFINE_integer('limit', 0, 'Compile at most this many programs (0: all).', lower_bound=0)


def _load(arg: str):
    """``path.py:name`` -> that file's ``get_config('name')``."""
    path, _, name = arg.partition(':')
    if not Path(path).is_file():
        raise ConfigError(f'--config={arg}: no file {path!r}; allowed: configs/plan_tpu.py:<name>')
    spec = importlib.util.spec_from_file_location('plan_config', path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config(name)


def _compile(arg: str, cfg, workdir: Path, per_process: int) -> None:
    """Compiles what the journal lacks for ``cfg``: here, or in child processes of at most
    ``per_process`` programs each (each appends to the journal; a child that compiles
    nothing stops the loop with its exit code)."""
    if per_process <= 0:
        run_tasks(cfg, workdir)
        return
    while True:
        left = len(missing(cfg, workdir))
        if not left:
            return
        print(f'{cfg.name}: {left} programs to compile, {per_process} per process', flush=True)
        cmd = [sys.executable, '-m', 'specjax.tpu.plan', f'--config={arg}']
        cmd += [f'--workdir={workdir}', '--programs_per_process=0', f'--limit={per_process}']
        code = subprocess.run(cmd, check=False).returncode
        if code != 0 or len(missing(cfg, workdir)) >= left:
            raise ConfigError(
                f'--config={arg}: a compile process exited {code} with {left} programs left'
            )


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
    for arg, cfg in zip(args, configs.values()):
        if FLAGS.run and FLAGS.limit:
            run_tasks(cfg, workdir, limit=FLAGS.limit)
        elif FLAGS.run:
            _compile(arg, cfg, workdir, FLAGS.programs_per_process)
    if FLAGS.page:
        command = 'python -m specjax.tpu.plan ' + ' '.join(
            a for a in sys.argv[1:] if not a.startswith(('--page', '--norun'))
        )
        page = Path(FLAGS.page)
        tmp = page.with_suffix('.tmp')
        recs = list(_read_journal(workdir / 'plan.jsonl').values())
        todo = {name: missing(cfg, workdir) for name, cfg in configs.items()}
        tmp.write_text(render(recs, configs, command.strip(), todo), encoding='utf-8')
        tmp.replace(page)
        print(f'wrote {page}')
    return 0


def entry() -> None:
    define_flags()

    def _main(argv):
        try:
            return main(argv)
        except ConfigError as e:
            print(f'error: {e}', file=sys.stderr)
            sys.exit(2)

    app.run(_main)


if __name__ == '__main__':
    entry()
