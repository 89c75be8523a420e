"""The report of a sweep: ``report.md`` (tables) and ``plots/*.png``, from its result rows.

Built from ``results.jsonl`` alone, so it can be rebuilt without rerunning anything
(``python -m specjax.report --workdir=DIR``). Each plot is drawn only when the columns it
needs exist in the results (SPEC §7 names):

==============================  ===========================================================
plot                            columns
==============================  ===========================================================
acceptance_vs_gamma.png         gamma, acceptance (+ drafter/verifier_temperature)
joint_vs_per_drafter.png        pairing, acceptance, joint_acceptance (+ policy)
joint_vs_kl.png                 kl_max, joint_acceptance (+ policy, pairing)
policy_costs.png                policy and consensus_fallback_rate and/or
                                throughput_ratio_vs_single / wallclock_ratio_vs_single
decision_boundary.png           mean_truncation_depth, shared_prefix_acceptance
                                (+ independent_branch_acceptance, policy)
policies_vs_gamma.png           gamma (≥ 2 values), policy, joint_acceptance and/or
                                throughput_ratio_vs_single / consensus_fallback_rate
kl_ceiling.png                  policies with ≥ 2 KL ceilings (kl_ceiling), and
                                branch_records and/or those metrics
==============================  ===========================================================

Where the rows ran with more than one KL ceiling (off counts as one) and record their
branches' drafters, a "Sharing sets" table lists per policy the sets its steps ran.

Where several cells share a point (other axes, seeds) the plots show the mean and, as
error bars, the standard deviation over those cells. A value that is not a finite number
(``Infinity``, ``NaN`` in the JSON) is written as such in the tables (``inf``, ``nan``; a
mean over it too) and left out of the plots, which draw finite values only. Rows that are
no cell of the run's grid (`specjax.runner.grid.split_rows`) are listed, never counted.
Thresholds drawn in a plot (the KL ceiling, the decision boundary's) are those each row ran
with (`specjax.runner.rows`). Figures are drawn with `matplotlib.figure.Figure` and the Agg
canvas, never pyplot, so that importing this from a notebook leaves its backend alone.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from specjax.policy import names as policy_names
from specjax.runner import results as results_lib
from specjax.runner.rows import Row, as_float, has, label, mean, numeric, unique

__all__ = [
    "AXES",
    "METRICS",
    "write_report",
    "markdown_report",
]

REPORT_NAME = "report.md"
PLOTS_DIR = "plots"

# Grid axes shown first in the tables, in this order, then any other axis.
AXES = (
    "gamma",
    "drafter_temperature",
    "drafter_gamma",
    "verifier_temperature",
    "pairing",
    "policy",
    "seed",
)
# SPEC §7 metric columns, in table order, with their table headers.
METRICS = {
    # Leviathan's α (each chain tested alone, rule 1's test) and, beside it, what each
    # drafter's proposals got committed: in a naive shared block every chain is cut at the
    # first rejection of any chain, so accepted ÷ proposed is the same for every drafter.
    "per_drafter_alpha": "α per drafter",
    "acceptance": "accepted ÷ proposed per drafter",
    "joint_acceptance": "joint α",
    "shared_prefix_acceptance": "shared-prefix α",
    "independent_branch_acceptance": "independent α",
    "mean_accepted_length": "accepted/call",
    "mean_truncation_depth": "trunc. depth",
    "consensus_fallback_rate": "fallback rate",
    "kl_max": "KL max",
    "kl_mean": "KL mean",
    "tv_distance": "TV",
    "throughput_ratio_vs_single": "throughput ×single (cost)",
    "wallclock_ratio_vs_single": "throughput ×single (wall)",
    "predicted_over_wall": "predicted ÷ wall",
    "wall_time_s": "cell wall s",
}
# Columns averaged in the per-policy summary table.
SUMMARY_METRICS = (
    "joint_acceptance",
    "consensus_fallback_rate",
    "mean_truncation_depth",
    "kl_max",
    "throughput_ratio_vs_single",
    "wallclock_ratio_vs_single",
    "tv_distance",
    "mean_accepted_length",
)


# ----------------------------------------------------------------------------------
# The report.
# ----------------------------------------------------------------------------------


def write_report(
    workdir: str | Path,
    results: Sequence[Row] | None = None,
    config: dict | None = None,
    outside: Sequence[tuple[Row, str]] = (),
) -> Path:
    """Writes ``workdir/report.md`` and the plots its results allow; returns the .md path.

    Args:
      workdir: the run's directory.
      results: result rows (default: read from the workdir's journals).
      config: the run's config as a dict (default: ``workdir/config.json`` if present).
      outside: (row, why) of the journal's rows that are no cell of the grid: listed in
        the report, counted nowhere.
    """
    workdir = Path(workdir)
    if config is None:
        config = _read_json(workdir / "config.json") or {}
    if not isinstance(config, dict):
        config = {}
    if results is None:  # the journal's rows, those of cells outside the grid set apart
        results = results_lib.read_all_results(workdir)
        if isinstance(config.get("grid"), dict) and not outside:
            from specjax.runner import grid as grid_lib  # pylint: disable=import-outside-toplevel

            try:
                results, outside = grid_lib.split_rows(results, grid_lib.expand_grid(config))
            except ValueError:  # a grid that does not expand: every row counts
                pass
    version = _read_json(workdir / "version.json") or {}
    if not isinstance(version, dict):
        version = {}
    results = [r for r in results if isinstance(r, dict)]
    text, pngs = render_report(results, config, version, outside)
    return commit_report(workdir, text, pngs)


def commit_report(workdir: str | Path, text: str, pngs: dict[str, bytes]) -> Path:
    """Writes what `render_report` made: the plots (removing those that no longer apply),
    then report.md; returns the .md path."""
    workdir = Path(workdir)
    plots_dir = workdir / PLOTS_DIR
    plots_dir.mkdir(parents=True, exist_ok=True)
    for name in _plot_names():
        path = plots_dir / f"{name}.png"
        if name in pngs:
            results_lib.atomic_write_bytes(path, pngs[name])
        else:
            path.unlink(missing_ok=True)  # a plot from an earlier build no longer applies
    out = workdir / REPORT_NAME
    results_lib.atomic_write_text(out, text)
    return out


def _plot_names() -> list[str]:
    from specjax.runner.plots import PLOTS  # pylint: disable=import-outside-toplevel

    return list(PLOTS)


def render_report(
    results: Sequence[Row], config: dict, version: dict, outside: Sequence[tuple[Row, str]] = ()
) -> tuple[str, dict[str, bytes]]:
    """report.md's text and the PNG bytes of each plot its rows allow, in memory: nothing
    is written, so every output is built before any file is replaced."""
    import io  # pylint: disable=import-outside-toplevel

    written, pngs = [], {}
    from specjax.runner.plots import PLOTS  # pylint: disable=import-outside-toplevel

    for name, (title, fn, wants_config) in PLOTS.items():
        buf = io.BytesIO()
        kwargs = {"config": config} if wants_config else {}
        if fn(results, buf, **kwargs):
            pngs[name] = buf.getvalue()
            written.append((title, Path(PLOTS_DIR) / f"{name}.png"))
    text = markdown_report(results, config=config, version=version, plots=written, outside=outside)
    return text, pngs


def markdown_report(
    results: Sequence[Row],
    config: dict | None = None,
    version: dict | None = None,
    plots: Iterable[tuple[str, Path]] = (),
    outside: Sequence[tuple[Row, str]] = (),
) -> str:
    """The markdown text: header, per-policy means, every cell's metrics, the plots, and
    the rows outside the grid (listed, not counted)."""
    config, version = config or {}, version or {}
    rows = list(results)
    title = label(config.get("experiment") or "sweep")
    lines = [f"# {title}: {len(rows)} cells", ""]
    if outside:
        lines += [
            f"{len(outside)} row(s) of {results_lib.RESULTS_NAME} are no cell of this "
            f"grid and are left out of every figure below (listed at the end).",
            "",
        ]
    meta = []
    if version.get("git_commit"):
        dirty = " (uncommitted changes)" if version.get("git_dirty") else ""
        meta.append(f"commit `{label(version['git_commit'])[:12]}`{dirty}")
    for key in ("specjax", "jax"):
        if version.get(key):
            meta.append(f"{key} {label(version[key])}")
    if version.get("device_count"):
        meta.append(f"{label(version['device_count'])} × {label(version.get('device_kind', '?'))}")
    if meta:
        lines += [", ".join(meta), ""]
    if not rows:
        return "\n".join(lines + ["No results yet.", ""] + _outside_section(outside))

    axes = _axes(rows, config)
    varying = [a for a in axes if len({_key(r.get(a)) for r in rows}) > 1]
    fixed = [a for a in axes if a not in varying]
    if fixed:
        lines += ["Fixed: " + ", ".join(f"{a} = {label(rows[0].get(a))}" for a in fixed), ""]

    if "policy" in varying:
        present = [m for m in SUMMARY_METRICS if has(rows, m)]
        if present:
            lines += ["## Mean over cells, per policy", ""]
            header = ["policy", "cells"] + [METRICS[m] for m in present]
            table = []
            for policy, group in _group(rows, lambda r: policy_names.label(r.get("policy"))):
                cells = [policy, str(len(group))]
                for m in present:
                    vals = numeric(r.get(m) for r in group)
                    cells.append(_fmt(mean(vals)) if vals else "–")
                table.append(cells)
            lines += _md_table(header, table) + [""]

    lines += _sharing_sets_section(rows, varying)

    metrics = [m for m in METRICS if has(rows, m)]
    lines += ["## Every cell", ""]
    header = ["cell"] + varying + [METRICS[m] for m in metrics]
    table = [
        [f"`{r.get('cell_id', '?')}`"]
        + [label(r.get(a)) for a in varying]
        + [_fmt(r.get(m)) for m in metrics]
        for r in rows
    ]
    lines += _md_table(header, table) + [""]

    plots = list(plots)
    if plots:
        lines += ["## Plots", ""]
        for plot_title, path in plots:
            lines += [f"### {plot_title}", "", f"![{plot_title}]({path.as_posix()})", ""]
    return "\n".join(lines + _outside_section(outside))


def _sharing_sets_section(rows: Sequence[Row], varying: Sequence[str]) -> list[str]:
    """Per policy (and pairing, where it varies): the KL ceiling it ran with, the KL it
    measured, the sharing sets its steps ran (each with the share of plan steps that ran
    it, mean over cells) and the largest, beside joint acceptance, fallback and modelled
    throughput. Only where the rows ran with more than one ceiling (off counts as one) and
    record their branches' drafters."""
    from specjax.runner import plots  # pylint: disable=import-outside-toplevel
    from specjax.runner import rows as rows_lib  # pylint: disable=import-outside-toplevel

    ceilings = {rows_lib.kl_ceiling(r) for r in rows if r.get("policy") is not None}
    if len(ceilings) < 2 or not any(plots.sharing_sets(r) for r in rows):
        return []
    by_pairing = "pairing" in varying
    header = (["pairing"] if by_pairing else []) + [
        "policy",
        "KL ceiling",
        "cells",
        METRICS["kl_max"],
        "sharing sets run (share of plan steps)",
        "largest set",
        METRICS["joint_acceptance"],
        METRICS["consensus_fallback_rate"],
        METRICS["throughput_ratio_vs_single"],
    ]
    groups = _group(
        rows,
        lambda r: _key(
            [label(r.get("pairing")) if by_pairing else "", policy_names.label(r.get("policy"))]
        ),
    )
    table = []
    for _, group in groups:
        shares: dict[str, list[float]] = {}
        for r in group:
            for name, share in plots.sharing_sets(r).items():
                shares.setdefault(name, []).append(share)
        sets = ", ".join(f"{n} {mean(v) * len(v) / len(group):.0%}" for n, v in shares.items())
        largest = [n for n in map(plots.largest_set, group) if n is not None]
        ceiling = rows_lib.kl_ceiling(group[0])
        cells = [label(group[0].get("pairing"))] if by_pairing else []
        cells += [
            policy_names.label(group[0].get("policy")),
            "off" if ceiling is None else f"{ceiling:g}",
            str(len(group)),
        ]
        for m in ("kl_max",):
            vals = numeric(r.get(m) for r in group)
            cells.append(_fmt(mean(vals)) if vals else "–")
        cells += [sets or "–", str(max(largest)) if largest else "–"]
        for m in ("joint_acceptance", "consensus_fallback_rate", "throughput_ratio_vs_single"):
            vals = numeric(r.get(m) for r in group)
            cells.append(_fmt(mean(vals)) if vals else "–")
        table.append(cells)
    intro = (
        "Which drafters shared a prefix: each branch's drafters as the rows record them "
        "(`branch_records`), after the KL ceiling and the decision boundary split the sets."
    )
    return ["## Sharing sets, per policy", "", intro, ""] + _md_table(header, table) + [""]


def _outside_section(outside: Sequence[tuple[Row, str]]) -> list[str]:
    if not outside:
        return []
    lines = ["## Rows outside the grid (not counted)", ""]
    table = [
        [f"`{label(r.get('cell_id', '?')) if isinstance(r, dict) else '?'}`", why]
        for r, why in outside
    ]
    return lines + _md_table(["cell", "why it is not a cell of this grid"], table) + [""]


# ----------------------------------------------------------------------------------
# Helpers.
# ----------------------------------------------------------------------------------


def _axes(rows: Sequence[Row], config: dict) -> list[str]:
    grid = config.get("grid")
    names = (
        list(grid)
        if isinstance(grid, dict)
        else unique(
            k for r in rows for k in (r.get("cell") if isinstance(r.get("cell"), dict) else {})
        )
    )
    return sorted(names, key=lambda a: (AXES.index(a) if a in AXES else len(AXES), names.index(a)))


def _group(rows: Sequence[Row], key: Callable[[Row], str]) -> list[tuple[str, list[Row]]]:
    out: dict[str, list[Row]] = {}
    for r in rows:
        out.setdefault(key(r), []).append(r)
    return list(out.items())


def _md_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    esc = lambda s: " ".join(str(s).replace("|", "\\|").split())  # pylint: disable=unnecessary-lambda-assignment
    lines = [
        "| " + " | ".join(esc(h) for h in header) + " |",
        "|" + "|".join("---" for _ in header) + "|",
    ]
    lines += ["| " + " | ".join(esc(c) for c in row) + " |" for row in rows]
    return lines


def _fmt(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, dict):
        return ", ".join(f"{k} {_fmt(v)}" for k, v in value.items())
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (int, float)):
        f = as_float(value)
        if not math.isfinite(f):
            return str(f)  # nan, inf, -inf: written as such
        if isinstance(value, int):
            return str(value) if abs(value) < 10**12 else f"{f:.3g}"
        return f"{value:.3f}" if abs(value) < 1e4 else f"{value:.3g}"
    return label(value)


def _key(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
