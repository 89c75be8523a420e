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
==============================  ===========================================================

Where several cells share a point (other axes, seeds) the plots show the mean and, as
error bars, the standard deviation over those cells. Figures are drawn with
`matplotlib.figure.Figure` and the Agg canvas, never pyplot, so that importing this from
a notebook leaves its backend alone.
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from specjax.runner import results as results_lib

__all__ = [
    "AXES",
    "METRICS",
    "PLOTS",
    "write_report",
    "markdown_report",
    "label",
    "plot_acceptance_vs_gamma",
    "plot_joint_vs_per_drafter",
    "plot_joint_vs_kl",
    "plot_policy_costs",
    "plot_decision_boundary",
]

REPORT_NAME = "report.md"
PLOTS_DIR = "plots"

# Grid axes shown first in the tables, in this order, then any other axis.
AXES = ("gamma", "drafter_temperature", "verifier_temperature", "pairing", "policy", "seed")
# SPEC §7 metric columns, in table order, with their table headers.
METRICS = {
    "acceptance": "α per drafter",
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
    "wall_time_s": "cell wall s",
}
# Columns averaged in the per-policy summary table.
SUMMARY_METRICS = ("joint_acceptance", "consensus_fallback_rate", "mean_truncation_depth",
                   "kl_max", "throughput_ratio_vs_single", "wallclock_ratio_vs_single",
                   "tv_distance", "mean_accepted_length")

# SPEC §4 and §6 defaults; a config field of the same name overrides them.
DEFAULT_KL_CEILING = 0.35
DEFAULT_ACCEPTANCE_FLOOR = 0.45
DEFAULT_DEPTH_CEILING = 2.5
DEFAULT_OVERHEAD = 0.15

Row = dict[str, Any]


# ----------------------------------------------------------------------------------
# The report.
# ----------------------------------------------------------------------------------


def write_report(workdir: str | Path, results: Sequence[Row] | None = None,
                 config: dict | None = None) -> Path:
    """Writes ``workdir/report.md`` and the plots its results allow; returns the .md path.

    Args:
      workdir: the run's directory.
      results: result rows (default: read from the workdir's journals).
      config: the run's config as a dict (default: ``workdir/config.json`` if present).
    """
    workdir = Path(workdir)
    if results is None:
        results = results_lib.read_all_results(workdir)
    if config is None:
        config = _read_json(workdir / "config.json") or {}
    version = _read_json(workdir / "version.json") or {}
    plots_dir = workdir / PLOTS_DIR
    plots_dir.mkdir(parents=True, exist_ok=True)
    thresholds = {
        "kl_ceiling": _config_number(config, "kl_ceiling", DEFAULT_KL_CEILING),
        "acceptance_floor": _config_number(config, "acceptance_floor",
                                           DEFAULT_ACCEPTANCE_FLOOR),
        "depth_ceiling": _config_number(config, "depth_ceiling", DEFAULT_DEPTH_CEILING),
        "overhead": _config_number(config, "truncation_overhead_ratio", DEFAULT_OVERHEAD),
    }
    written = []
    for name, (title, fn, keys) in PLOTS.items():
        path = plots_dir / f"{name}.png"
        kwargs = {k: thresholds[k] for k in keys}
        if fn(results, path, **kwargs):
            written.append((title, path.relative_to(workdir)))
        else:
            path.unlink(missing_ok=True)  # a plot from an earlier build no longer applies
    text = markdown_report(results, config=config, version=version, plots=written)
    out = workdir / REPORT_NAME
    results_lib.atomic_write_text(out, text)
    return out


def markdown_report(results: Sequence[Row], config: dict | None = None,
                    version: dict | None = None,
                    plots: Iterable[tuple[str, Path]] = ()) -> str:
    """The markdown text: header, per-policy means, every cell's metrics, the plots."""
    config, version = config or {}, version or {}
    rows = list(results)
    title = config.get("experiment") or "sweep"
    lines = [f"# {title}: {len(rows)} cells", ""]
    meta = []
    if version.get("git_commit"):
        dirty = " (uncommitted changes)" if version.get("git_dirty") else ""
        meta.append(f"commit `{version['git_commit'][:12]}`{dirty}")
    for key in ("specjax", "jax"):
        if version.get(key):
            meta.append(f"{key} {version[key]}")
    if version.get("device_count"):
        meta.append(f"{version['device_count']} × {version.get('device_kind', '?')}")
    if meta:
        lines += [", ".join(meta), ""]
    if not rows:
        return "\n".join(lines + ["No results yet.", ""])

    axes = _axes(rows, config)
    varying = [a for a in axes if len({_key(r.get(a)) for r in rows}) > 1]
    fixed = [a for a in axes if a not in varying]
    if fixed:
        lines += ["Fixed: " + ", ".join(f"{a} = {label(rows[0].get(a))}" for a in fixed), ""]

    if "policy" in varying:
        present = [m for m in SUMMARY_METRICS if _has(rows, m)]
        if present:
            lines += ["## Mean over cells, per policy", ""]
            header = ["policy", "cells"] + [METRICS[m] for m in present]
            table = []
            for policy, group in _group(rows, lambda r: label(r.get("policy"))):
                cells = [policy, str(len(group))]
                for m in present:
                    vals = _numbers(r.get(m) for r in group)
                    cells.append(_fmt(statistics.fmean(vals)) if vals else "–")
                table.append(cells)
            lines += _md_table(header, table) + [""]

    metrics = [m for m in METRICS if _has(rows, m)]
    lines += ["## Every cell", ""]
    header = ["cell"] + varying + [METRICS[m] for m in metrics]
    table = [[f"`{r.get('cell_id', '?')}`"] + [label(r.get(a)) for a in varying]
             + [_fmt(r.get(m)) for m in metrics] for r in rows]
    lines += _md_table(header, table) + [""]

    plots = list(plots)
    if plots:
        lines += ["## Plots", ""]
        for plot_title, path in plots:
            lines += [f"### {plot_title}", "", f"![{plot_title}]({path.as_posix()})", ""]
    return "\n".join(lines)


def label(value: Any) -> str:
    """A short display name: ``code+prose`` for a pairing, a policy's name or 4-bit code."""
    if value is None:
        return "–"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (list, tuple)):
        return "+".join(label(v) for v in value)
    if isinstance(value, dict):
        if "name" in value:
            return str(value["name"])
        switches = ("prefix_partitioning", "truncate_and_attribute",
                    "agreement_weighted_consensus", "kl_ceiling")
        if all(k in value for k in switches):
            kl = value["kl_ceiling"]
            code = "".join(f"{s[0]}{int(bool(value[s]))}" for s in switches)
            if kl not in (None, False, True) and not math.isclose(float(kl), DEFAULT_KL_CEILING):
                code += f"_kl{float(kl):g}"
            return code
        return ",".join(f"{k}={label(v)}" for k, v in value.items())
    return str(value)


# ----------------------------------------------------------------------------------
# Plots. Each takes the rows and a path, returns False (writing nothing) when the rows
# lack the columns it needs.
# ----------------------------------------------------------------------------------


def plot_acceptance_vs_gamma(rows: Sequence[Row], path: str | Path) -> bool:
    """Per-drafter acceptance α against γ, one line per temperature, a panel per drafter."""
    rows = [r for r in rows if _is_number(r.get("gamma")) and _acceptance(r)]
    if not rows:
        return False
    drafters = _unique(d for r in rows for d in _acceptance(r))
    temp_keys = [k for k in ("drafter_temperature", "verifier_temperature") if _has(rows, k)]

    def temp_label(r: Row) -> str:
        names = {"drafter_temperature": "τ drafter", "verifier_temperature": "τ verifier"}
        return ", ".join(f"{names[k]} = {label(r.get(k))}" for k in temp_keys) or "all cells"

    fig, axs = _figure(len(drafters), width=4.2, height=3.6, sharey=True)
    temps = _unique(temp_label(r) for r in rows)
    colors = _colors(temps)
    for ax, drafter in zip(axs, drafters):
        for temp in temps:
            pts: dict[float, list[float]] = {}
            for r in rows:
                a = _acceptance(r).get(drafter)
                if temp_label(r) == temp and _is_number(a):
                    pts.setdefault(r["gamma"], []).append(a)
            if not pts:
                continue
            xs = sorted(pts)
            ax.errorbar(xs, [statistics.fmean(pts[x]) for x in xs],
                        yerr=[_sd(pts[x]) for x in xs], marker="o", capsize=3,
                        color=colors[temp], label=temp)
        ax.set_title(f"drafter: {drafter}")
        ax.set_xlabel("γ (draft tokens per round)")
        ax.set_xticks(sorted({r["gamma"] for r in rows}))
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
    axs[0].set_ylabel("acceptance α (accepted / proposed)")
    axs[-1].legend(title="temperature", fontsize=8, title_fontsize=8, loc="lower left")
    fig.suptitle("Per-drafter acceptance vs γ (mean ± sd over the other axes)")
    return _save(fig, path)


def plot_joint_vs_per_drafter(rows: Sequence[Row], path: str | Path) -> bool:
    """Bars: each drafter's α and the joint acceptance, per pairing (a panel per policy).

    A red ✕ marks the product of the pairing's α — what the joint acceptance collapses to
    when one shared block must pass every drafter (SPEC §4, switch 2 off).
    """
    rows = [r for r in rows if r.get("pairing") is not None and _acceptance(r)
            and _is_number(r.get("joint_acceptance"))]
    if not rows:
        return False
    policies = _unique(label(r.get("policy")) for r in rows) if _has(rows, "policy") else [None]
    drafters = _unique(d for r in rows for d in _acceptance(r))
    colors = _colors(drafters)
    pairings = _unique(label(r["pairing"]) for r in rows)
    fig, axs = _figure(len(policies), width=max(4.5, 1.3 * len(pairings) + 2), height=4.0,
                       sharey=True)
    for ax, policy in zip(axs, policies):
        group = [r for r in rows if policy is None or label(r.get("policy")) == policy]
        for i, pairing in enumerate(pairings):
            cells = [r for r in group if label(r["pairing"]) == pairing]
            if not cells:
                continue
            members = _unique(d for r in cells for d in _acceptance(r))
            n = len(members) + 1
            width = 0.8 / n
            x0 = i - 0.4 + width / 2
            alphas = []
            for j, d in enumerate(members):
                vals = _numbers(_acceptance(r).get(d) for r in cells)
                alphas.append(statistics.fmean(vals))
                ax.bar(x0 + j * width, alphas[-1], width, yerr=_sd(vals), capsize=2,
                       color=colors[d], label=f"α {d}")
            joint = _numbers(r["joint_acceptance"] for r in cells)
            ax.bar(x0 + len(members) * width, statistics.fmean(joint), width, yerr=_sd(joint),
                   capsize=2, color="0.25", hatch="//", edgecolor="white", label="joint α")
            if len(members) > 1:
                ax.plot([x0 + len(members) * width], [math.prod(alphas)], "x", color="red",
                        markersize=9, markeredgewidth=2, label="product of α")
        ax.set_xticks(range(len(pairings)))
        ax.set_xticklabels(pairings, rotation=15 if len(pairings) > 3 else 0, fontsize=8)
        ax.set_xlabel("tokenizer pairing (drafters sharing the prefix)")
        ax.set_ylim(0, 1.02)
        ax.grid(axis="y", alpha=0.3)
        ax.set_title(f"policy: {policy}" if policy is not None else "all cells")
        _dedup_legend(ax, order=[f"α {d}" for d in drafters] + ["joint α", "product of α"],
                      fontsize=8, loc="upper right")
    axs[0].set_ylabel("acceptance")
    fig.suptitle("Joint vs per-drafter acceptance, per pairing")
    return _save(fig, path)


def plot_joint_vs_kl(rows: Sequence[Row], path: str | Path,
                     kl_ceiling: float = DEFAULT_KL_CEILING) -> bool:
    """Scatter of joint acceptance against the max pairwise KL, the KL ceiling marked."""
    rows = [r for r in rows if _is_number(r.get("kl_max")) and math.isfinite(r["kl_max"])
            and _is_number(r.get("joint_acceptance"))]
    if not rows:
        return False
    fig, (ax,) = _figure(1, width=8.0, height=4.4)
    by_policy = _has(rows, "policy")
    by_pairing = _has(rows, "pairing")
    series = _unique(label(r.get("policy")) for r in rows) if by_policy else ["cells"]
    colors = _colors(series)
    shapes = dict(zip(_unique(label(r.get("pairing")) for r in rows) if by_pairing else [],
                      "osD^vP*Xph"))
    for s in series:
        for shape_label, marker in (shapes.items() if by_pairing else [(None, "o")]):
            pts = [r for r in rows if (not by_policy or label(r.get("policy")) == s)
                   and (shape_label is None or label(r.get("pairing")) == shape_label)]
            if pts:
                ax.scatter([r["kl_max"] for r in pts], [r["joint_acceptance"] for r in pts],
                           color=colors[s], marker=marker, alpha=0.8, edgecolor="black",
                           linewidth=0.4)
    xmax = max(max(r["kl_max"] for r in rows), kl_ceiling) * 1.1
    ax.axvline(kl_ceiling, color="firebrick", linestyle="--", linewidth=1.5)
    ax.axvspan(kl_ceiling, xmax, color="firebrick", alpha=0.07)
    ax.set_xlim(0, xmax)
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("max pairwise KL(q_i ‖ q_j) on the shared prefix (nats)")
    ax.set_ylabel("joint acceptance (shared prefix)")
    ax.set_title("Joint acceptance vs drafter divergence")
    ax.grid(alpha=0.3)
    handles = [_line("firebrick", "--", f"KL ceiling {kl_ceiling:g} nats"),
               _patch("firebrick", 0.07, "beyond it: drafters do\nnot share a prefix")]
    handles += [_handle(ax, "o", colors[s], f"policy {s}") for s in series] if by_policy else []
    handles += [_handle(ax, m, "white", f"pairing {p}") for p, m in shapes.items()]
    fig.legend(handles=handles, fontsize=8, loc="outside right upper")
    return _save(fig, path)


def plot_policy_costs(rows: Sequence[Row], path: str | Path) -> bool:
    """Bars per policy: consensus-fallback rate; throughput ratios to the single drafter."""
    rows = [r for r in rows if r.get("policy") is not None]
    ratio_keys = [k for k in ("throughput_ratio_vs_single", "wallclock_ratio_vs_single")
                  if _has(rows, k)]
    panels = (["consensus_fallback_rate"] if _has(rows, "consensus_fallback_rate") else [])
    panels += ["ratios"] if ratio_keys else []
    if not rows or not panels:
        return False
    policies = _unique(label(r["policy"]) for r in rows)
    fig, axs = _figure(len(panels), width=max(4.5, 0.9 * len(policies) + 2.5), height=4.0)
    xs = range(len(policies))
    for ax, panel in zip(axs, panels):
        if panel == "consensus_fallback_rate":
            means, sds = _per_group(rows, policies, "consensus_fallback_rate")
            ax.bar(xs, means, yerr=sds, capsize=3, color="tab:orange")
            ax.set_ylim(0, 1.02)
            ax.set_ylabel("consensus-fallback rate (fallback steps / plan steps)")
            ax.set_title("Consensus fallback")
        else:
            names = {"throughput_ratio_vs_single": "cost model",
                     "wallclock_ratio_vs_single": "wall clock"}
            width = 0.8 / len(ratio_keys)
            for j, key in enumerate(ratio_keys):
                means, sds = _per_group(rows, policies, key)
                ax.bar([x - 0.4 + width * (j + 0.5) for x in xs], means, width, yerr=sds,
                       capsize=3, label=names[key], color=("tab:blue", "tab:cyan")[j])
            ax.axhline(1.0, color="black", linestyle="--", linewidth=1,
                       label="single-drafter baseline")
            ax.set_ylabel("throughput / single-drafter throughput")
            ax.set_title("Throughput vs the best single drafter")
            ax.legend(fontsize=8)
        ax.set_xticks(list(xs))
        ax.set_xticklabels(policies, rotation=20 if len(policies) > 3 else 0, fontsize=8)
        ax.set_xlabel("policy")
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle("Cost of each policy (mean ± sd over the other axes)")
    return _save(fig, path)


def plot_decision_boundary(rows: Sequence[Row], path: str | Path,
                           acceptance_floor: float = DEFAULT_ACCEPTANCE_FLOOR,
                           depth_ceiling: float = DEFAULT_DEPTH_CEILING,
                           overhead: float = DEFAULT_OVERHEAD) -> bool:
    """Shared-prefix acceptance against mean truncation depth, the SPEC §6 region marked.

    Below the acceptance floor or beyond the depth ceiling the boundary raises
    SpeculativePrefixCollapseError; inside, a cell is coloured by the boundary's answer
    when its independent-branch acceptance is known (shared − independent > overhead:
    truncate and re-propose, else independent branches), by policy otherwise.
    """
    rows = [r for r in rows if _is_number(r.get("mean_truncation_depth"))
            and _is_number(r.get("shared_prefix_acceptance"))]
    if not rows:
        return False
    fig, (ax,) = _figure(1, width=8.6, height=4.6)
    xmax = max(max(r["mean_truncation_depth"] for r in rows), depth_ceiling) * 1.15
    ax.axhspan(0, acceptance_floor, color="firebrick", alpha=0.08)
    ax.axvspan(depth_ceiling, xmax, color="firebrick", alpha=0.08)
    ax.axhline(acceptance_floor, color="firebrick", linestyle="--", linewidth=1.5)
    ax.axvline(depth_ceiling, color="firebrick", linestyle=":", linewidth=1.5)

    def decision(r: Row) -> str:
        shared, depth = r["shared_prefix_acceptance"], r["mean_truncation_depth"]
        if not 0 <= shared <= 1 or shared < acceptance_floor or depth > depth_ceiling:
            return "collapse"
        indep = r.get("independent_branch_acceptance")
        if not _is_number(indep):
            return "inside the boundary"
        return ("truncate & re-propose" if shared - indep > overhead
                else "independent branches")

    decisions = _unique(decision(r) for r in rows)
    palette = {"collapse": "firebrick", "truncate & re-propose": "tab:green",
               "independent branches": "tab:blue", "inside the boundary": "tab:green"}
    by_policy = _has(rows, "policy")
    markers = dict(zip(_unique(label(r.get("policy")) for r in rows) if by_policy else [],
                       "osD^vP*Xph"))
    for r in rows:
        ax.scatter(r["mean_truncation_depth"], r["shared_prefix_acceptance"],
                   color=palette[decision(r)], marker=markers.get(label(r.get("policy")), "o"),
                   alpha=0.85, edgecolor="black", linewidth=0.4)
    ax.set_xlim(0, xmax)
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("mean truncation depth (draft tokens discarded per truncation)")
    ax.set_ylabel("shared-prefix (joint) acceptance")
    ax.set_title("Decision boundary (per batch, SPEC §6)")
    ax.grid(alpha=0.3)
    handles = [_line("firebrick", "--", f"acceptance floor {acceptance_floor:g}"),
               _line("firebrick", ":", f"depth ceiling {depth_ceiling:g}"),
               _patch("firebrick", 0.08, "collapse region (raises\nSpeculativePrefixCollapseError)")]
    handles += [_handle(ax, "o", palette[d], f"decision: {d}") for d in decisions]
    handles += [_handle(ax, m, "white", f"policy {p}") for p, m in markers.items()]
    fig.legend(handles=handles, fontsize=8, loc="outside right upper")
    return _save(fig, path)


# name -> (title in the report, function, thresholds it takes)
PLOTS: dict[str, tuple[str, Callable[..., bool], tuple[str, ...]]] = {
    "acceptance_vs_gamma": ("Acceptance vs γ per temperature", plot_acceptance_vs_gamma, ()),
    "joint_vs_per_drafter": ("Joint vs per-drafter acceptance per pairing",
                             plot_joint_vs_per_drafter, ()),
    "joint_vs_kl": ("Joint acceptance vs max pairwise KL", plot_joint_vs_kl, ("kl_ceiling",)),
    "policy_costs": ("Fallback rate and throughput per policy", plot_policy_costs, ()),
    "decision_boundary": ("Decision boundary", plot_decision_boundary,
                          ("acceptance_floor", "depth_ceiling", "overhead")),
}


# ----------------------------------------------------------------------------------
# Helpers.
# ----------------------------------------------------------------------------------


def _figure(n: int, width: float, height: float, sharey: bool = False):
    from matplotlib.figure import Figure  # pylint: disable=import-outside-toplevel

    fig = Figure(figsize=(width * n, height), dpi=110, layout="constrained")
    axs = fig.subplots(1, n, sharey=sharey, squeeze=False)[0]
    return fig, list(axs)


def _save(fig, path: str | Path) -> bool:
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # pylint: disable=import-outside-toplevel

    FigureCanvasAgg(fig)
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp)
    tmp.replace(path)
    return True


def _colors(keys: Sequence[str]) -> dict[str, Any]:
    from matplotlib import colormaps  # pylint: disable=import-outside-toplevel

    cmap = colormaps["tab10"]
    return {k: cmap(i % 10) for i, k in enumerate(keys)}


def _handle(ax, marker: str, color: Any, text: str):
    del ax
    from matplotlib.lines import Line2D  # pylint: disable=import-outside-toplevel

    return Line2D([], [], marker=marker, linestyle="", markerfacecolor=color,
                  markeredgecolor="black", markersize=7, label=text)


def _dedup_legend(ax, order: Sequence[str] = (), **kwargs) -> None:
    handles, labels = ax.get_legend_handles_labels()
    seen = {}
    for h, l in zip(handles, labels):
        seen.setdefault(l, h)
    rank = {l: i for i, l in enumerate(order)}
    names = sorted(seen, key=lambda l: rank.get(l, len(rank)))
    if names:
        ax.legend([seen[l] for l in names], names, **kwargs)


def _line(color: Any, style: str, text: str):
    from matplotlib.lines import Line2D  # pylint: disable=import-outside-toplevel

    return Line2D([], [], color=color, linestyle=style, linewidth=1.5, label=text)


def _patch(color: Any, alpha: float, text: str):
    from matplotlib.patches import Patch  # pylint: disable=import-outside-toplevel

    return Patch(facecolor=color, alpha=alpha * 2, edgecolor="none", label=text)


def _acceptance(r: Row) -> dict[str, float]:
    a = r.get("acceptance")
    if isinstance(a, dict):
        return {str(k): v for k, v in a.items() if _is_number(v)}
    if _is_number(a):
        return {"drafter": a}
    return {}


def _per_group(rows: Sequence[Row], groups: Sequence[str], key: str):
    means, sds = [], []
    for g in groups:
        vals = _numbers(r.get(key) for r in rows if label(r["policy"]) == g)
        means.append(statistics.fmean(vals) if vals else math.nan)
        sds.append(_sd(vals))
    return means, sds


def _axes(rows: Sequence[Row], config: dict) -> list[str]:
    grid = config.get("grid")
    names = list(grid) if isinstance(grid, dict) else _unique(
        k for r in rows for k in (r.get("cell") or {}))
    return sorted(names, key=lambda a: (AXES.index(a) if a in AXES else len(AXES), names.index(a)))


def _group(rows: Sequence[Row], key: Callable[[Row], str]) -> list[tuple[str, list[Row]]]:
    out: dict[str, list[Row]] = {}
    for r in rows:
        out.setdefault(key(r), []).append(r)
    return list(out.items())


def _md_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    esc = lambda s: str(s).replace("|", "\\|")  # pylint: disable=unnecessary-lambda-assignment
    lines = ["| " + " | ".join(esc(h) for h in header) + " |",
             "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(esc(c) for c in row) + " |" for row in rows]
    return lines


def _fmt(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, dict):
        return ", ".join(f"{k} {_fmt(v)}" for k, v in value.items())
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        return f"{value:.3f}" if abs(value) < 1e4 else f"{value:.3g}"
    return label(value)


def _key(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def _has(rows: Sequence[Row], key: str) -> bool:
    return any(r.get(key) is not None for r in rows)


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and not (
        isinstance(x, float) and math.isnan(x))


def _numbers(values: Iterable[Any]) -> list[float]:
    return [v for v in values if _is_number(v)]


def _sd(values: Sequence[float]) -> float:
    return statistics.stdev(values) if len(values) > 1 else 0.0


def _unique(items: Iterable[Any]) -> list[Any]:
    return list(dict.fromkeys(items))


def _config_number(config: Any, key: str, default: float) -> float:
    """The first numeric `key` in the config (top level first, then nested dicts)."""
    if isinstance(config, dict):
        if _is_number(config.get(key)):
            return float(config[key])
        for v in config.values():
            if isinstance(v, dict):
                found = _config_number(v, key, math.nan)
                if not math.isnan(found):
                    return found
    return default


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
