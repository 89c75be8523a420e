"""The TPU planner's results page (`specjax.tpu.plan --page`), rendered from its journal.

Each deployment gets, per slice: the decode step's fit per rule set (peak memory per chip
against HBM, collectives, relayout copies), T_step and T_score(k) ÷ T_step (the roofline of
the compiled programs; the compiler's own estimate beside it where it gives one), the
projected speculative ÷ autoregressive per drafter, the analytic estimates against the
compiled figures, the engine's programs, and the seed table priced at the slice's prices
from a run's per-plan counts (`specjax.runner.seed_reprice.reprice`).
"""

from __future__ import annotations

import functools
import json
import math
import os
from pathlib import Path

import jax

from specjax.field_report import FIELD_REPORT_COSTS, FIELD_REPORT_TABLE
from specjax.runner.seed_reprice import reprice
from specjax.tpu import programs as P
from specjax.tpu.shapes import abstract_model
from specjax.tpu.targets import CHIPS, SLICES

__all__ = ['CONTEXT', 'estimate_seconds', 'hw_aware_speedup', 'render']

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


def _drafter_costs(
    cfg, here, b, t_step, chip, model_axis, compiler: bool = False
) -> dict[str, tuple[float, str]]:
    """{drafter: (c = T_draft / T_step, how)} at TPU prices: a compiled forward where the
    page has one (the compiler's estimate with ``compiler``, where it gives one; else the
    roofline over its whole cache: an upper bound), a feature drafter's streamed bytes ÷
    the chip's bandwidth, 0 for lookup."""
    out = {}
    for r in here:
        if r['program'] == 'drafter_forward' and r['ok'] and r['batch'] == b:
            t, how = estimate_seconds(r, chip, compiler=compiler)
            out[r['drafters']] = (t / t_step, f'compiled forward, {how}')
    for name, spec in cfg.drafters.items():
        kind = P.entry_kind(spec['kind'])
        if not kind.has_weights:
            out[name] = (0.0, 'no model')
        elif kind.reads_features and name not in out:
            lm, _ = abstract_model(cfg.verifier, max_len=cfg.max_len, dtype=cfg.dtype)
            d = P.drafter(spec['kind'], lm)
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


def _seed_table(cfg, sl: str, ratios: dict, costs: dict) -> list[str]:
    """The seed table's throughput column priced at this slice's prices: the run named by
    ``cfg.seed_run`` (its per-plan counts, `seed_reprice.reprice`) at c_i = T_draft ÷ T_step
    of the compiled drafters and a scored token's price from T_score(4) ÷ T_step."""
    run = cfg.get('seed_run', '')
    if not run:
        return []
    head = [
        f"The seed table at {sl} prices: the policies' counts of `{run}` (the zoo run of "
        '`make reproduce`; α and the counts are the drafters\' and the text\'s, not the '
        "hardware's) priced at this slice's c_i and scored-token price, each policy at its "
        'best γ, ÷ the best single drafter at the same prices (95% bootstrap intervals over '
        'plans):',
        '',
    ]
    path = Path(run) / 'results.jsonl'
    if not (Path(run) / 'summary.json').is_file():  # written once every cell has a result
        return head[:1] + [
            '',
            f'Not priced: `{run}` is not a finished run (no summary.json: cells missing); '
            'run `make reproduce` to the end first.',
            '',
        ]
    try:
        rows = [json.loads(line) for line in path.read_text(encoding='utf-8').splitlines()]
        consensus = json.loads((Path(run) / 'config.json').read_text())['consensus_cost']
        names = list(next(r for r in rows if 'per_plan' in r)['pairing'])
        tpu = {n: costs[n][0] for n in names}
        score = max(0.0, (ratios[4] - 1) / 3) if 4 in ratios else 0.0
        at_tpu = reprice(rows, tpu, score_cost=score, consensus_cost=consensus)
        at_seed = reprice(rows, FIELD_REPORT_COSTS, consensus_cost=consensus)
    except (OSError, ValueError, KeyError, StopIteration) as e:
        why = ' '.join(str(e).split())[:200]
        return head[:1] + ['', f'Not priced: {why} (run `make reproduce` first).', '']
    seed = FIELD_REPORT_TABLE['throughput_ratio_vs_single']
    lines = head + [
        f'c_i at {sl}: '
        + ', '.join(f'{n} {tpu[n]:.3f}' for n in names)
        + f'; a scored token {score:.4f} of a step (at seed sizes: '
        + ', '.join(f'{n} {FIELD_REPORT_COSTS[n]:.3f}' for n in names)
        + ', 0).',
        '',
        '| policy | the field report | at seed sizes (γ) | at TPU prices (γ) |',
        '|---|---|---|---|',
    ]

    def cell(f):
        lo, hi = f['ci']
        return f"{f['value']:.2f} [{lo:.2f}, {hi:.2f}] ({f['gamma']})"

    for name in sorted(k for k in at_tpu if not k.startswith('_')):
        ref = f'{seed[name]:.1f}' if name in seed else '–'
        lines.append(f'| {name} | {ref} | {cell(at_seed[name])} | {cell(at_tpu[name])} |')
    best_t, best_s = at_tpu['_best_single'], at_seed['_best_single']
    lines += [
        '',
        f"Best single drafter: {best_s['drafter']} (γ {best_s['gamma']}) at seed sizes, "
        f"{best_t['drafter']} (γ {best_t['gamma']}) at {sl} prices.",
        '',
    ]
    return lines


def _estimates(cfg, sl, recs, chip, unread) -> list[str]:
    """The analytic estimates (`hf.estimate_bytes`, `hardware.roofline_seconds`) against
    the compiled figures of the recommended rules' steps."""
    from specjax.measure.hardware import roofline_seconds  # pylint: disable=import-outside-toplevel

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


def render(recs: list[dict], configs: dict, command: str, todo: dict | None = None) -> str:
    """The results page of a journal (markdown); ``todo``: per deployment, the tasks the
    journal does not hold yet (each a `Task`), said per slice."""
    out = _preamble(recs, command)
    for dep_name, cfg in configs.items():
        mine = [r for r in recs if r['deployment'] == dep_name]
        left = (todo or {}).get(dep_name, [])
        out += [f'## {cfg.title}', '', cfg.description, '']
        if left:
            per = {sl: sum(t.slice == sl for t in left) for sl in cfg.slices}
            out += [
                'Not compiled yet (the journal resumes where it stopped: `make plan-tpu`): '
                + ', '.join(f'{n} programs on {sl}' for sl, n in per.items() if n)
                + '.',
                '',
            ]
        for sl in cfg.slices:
            chip = SLICES[sl].spec
            here = [r for r in mine if r['slice'] == sl]
            if here:
                out += _slice_section(cfg, sl, chip, here)
    return '\n'.join(out) + '\n'


def _preamble(recs: list[dict], command: str) -> list[str]:
    """The page's title and how its figures were made: the command and commit, the
    compile dates, the compiler's versions, the chips and the served form."""
    commit = os.popen('git rev-parse --short HEAD 2>/dev/null').read().strip() or 'unknown'
    try:
        import libtpu  # pylint: disable=import-outside-toplevel

        libtpu_v = getattr(libtpu, '__version__', '?')
    except ImportError:
        libtpu_v = 'absent'
    dates = sorted(r['date'] for r in recs)
    return [
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
        '(`specjax.runtime.sharding.decode_rules`): under fsdp and fsdp_tp the batch is not split '
        "over 'data', so no weight moves. Caches are donated. The weights' memory layouts "
        "(`specjax.tpu.layouts`): one set per slice, the compiler's choice for the "
        "speculative generate over every drafter with weights (the `served_layouts` program); "
        'every program of the recommended rules is compiled for weights already in that set '
        "(layouts 'served'), the other rule sets' steps with their own choice ('auto'); a "
        'relayout copy counts what a program would still relay per call.',
        '',
    ]


def _slice_section(cfg, sl: str, chip, here: list[dict]) -> list[str]:
    """A deployment's section for one slice of `chip`s (`here`: its records there): the
    decode step's fit, the step's and scores' times, the projections, the estimates, the
    engine's programs."""
    fwd = [r for r in here if r['program'] == 'forward']
    out = [f'### {sl} ({SLICES[sl].chips} × {chip.name})', '']
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
    ratio_lines, ratios, by_compiler = _step_times(cfg, rec_fwd, chip, unread)
    out += ratio_lines
    if ratios:
        out += _projections(cfg, sl, here, chip, ratios, by_compiler)
    out += [
        'The analytic estimates against the compiled figures (the recommended '
        "rules' steps; `hf.estimate_bytes`: weights and KV cache per chip; analytic "
        'T: `hardware.roofline_seconds` over 128 cached tokens, ÷ chips):',
        '',
    ]
    out += _estimates(cfg, sl, rec_fwd, chip, unread) + ['']
    progs = [r for r in here if r['program'] not in ('forward', 'drafter_forward')]
    if progs:
        out += _programs_table(cfg, progs)
    return out


def _step_times(cfg, rec_fwd: list[dict], chip, unread) -> tuple[list[str], dict, bool]:
    """T_step and T_score(k) ÷ T_step of the recommended rules' steps, by the roofline and
    (where it gives them) by the compiler — (the lines, the ratios by batch the projections
    use, whether they are the compiler's: where it estimates every step of the smallest
    batch, else the roofline's)."""
    table, ratios = _ratio_table(rec_fwd, chip, unread, compiler=False)
    out = [
        f'T_step and T_score(k) / T_step under `{cfg.recommend}`, by the roofline of '
        'the compiled programs:',
        '',
    ]
    out += table + ['']
    by_compiler, c_ratios = _ratio_table(rec_fwd, chip, unread, compiler=True)
    if any('| compiler |' in line for line in by_compiler):
        dips = sorted(
            (b, k) for b, (_, rr) in c_ratios.items() for k, x in rr.items() if k > 1 and x < 0.98
        )
        shape = (
            f'It is not monotone in k (a one-token step estimated dearer than a score of '
            f'more tokens at {", ".join(f"B {b} k {k}" for b, k in dips)})'
            if dips
            else 'It grows with k as the roofline does'
        )
        b = min(ratios)
        every = c_ratios.get(b) is not None and all(
            estimate_seconds(r, chip, unread(r['batch'], r['k']))[1] == 'compiler'
            for r in rec_fwd
            if r['ok'] and r['batch'] == b
        )
        out += [
            f"The same by the compiler's own estimate (`optimal_seconds`). {shape}; "
            + (
                "the projections below use the compiler's figures (T_step, T_score and "
                'T_draft alike):'
                if every
                else 'the projections below use the roofline (the compiler left a step '
                'unestimated):'
            ),
            '',
        ]
        out += by_compiler + ['']
        if every:
            return out, c_ratios, True
    return out, ratios, False


def _projections(
    cfg, sl: str, here: list[dict], chip, ratios: dict, compiler: bool = False
) -> list[str]:
    """The projected speculative ÷ autoregressive per drafter at the smallest batch, and
    the seed table at this slice's prices (``compiler``: the drafters' forwards priced by
    the compiler's estimate too, like the steps)."""
    b = min(ratios)
    t_step, rr = ratios[b]
    costs = _drafter_costs(cfg, here, b, t_step, chip, SLICES[sl].chips, compiler)
    out = [
        f"Projected speculative ÷ autoregressive at B {b} (Leviathan et al.'s "
        'hardware-aware formula, one chain: E[tokens per round] · T_step ÷ '
        '(γ · T_draft + T_score(γ+1)); the best γ of 1–7 this page has '
        'T_score for):',
        '',
    ]
    out += _projection(cfg, rr, costs) + ['']
    out += _seed_table(cfg, sl, rr, costs)
    return out


def _programs_table(cfg, progs: list[dict]) -> list[str]:
    """The engine's programs (generates and plan calls) compiled on the slice."""
    out = [
        'The engine\'s programs (generates and plan calls, batch '
        f'{cfg.generate_batch}, γ {cfg.gamma}, {cfg.prompt_len}-token prompts, '
        f'{cfg.new_tokens} new tokens):',
        '',
        '| program | rule | drafters | layouts | compiled | peak GiB / chip | '
        'collectives per round (loop body) | relayout copies ≥ 1 MiB | '
        'compile s (wall, this host) |',
        '|---|---|---|---|---|---|---|---|---|',
    ]
    for r in progs:
        ok = 'yes' if r['ok'] else f"no: {r['error'][:100]}"
        out.append(
            f"| {r['program']} | {r['rule'] or '–'} | {r['drafters'] or '–'} | "
            f"{r.get('compiled_layouts') or r.get('layouts') or 'default'} | {ok} | "
            f"{_gib(r['peak_bytes']) if r['ok'] else '–'} | "
            f"{_coll(r['collectives_in_loop']) if r['ok'] else '–'} | "
            f"{r['n_copies'] if r['ok'] else '–'} | {r['compile_s']:.0f} |"
        )
    out.append('')
    return out
