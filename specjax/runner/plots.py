"""The report's plots: each takes result rows and a path (or a binary file object), and
returns False (writing nothing) when the rows lack the columns it needs. Only finite
numbers are drawn (`rows.is_number`). `PLOTS` lists them for `report.py`; `plots_kit` draws.

Each `plot_<name>` saves the figure its `figure_<name>` builds (None: the rows lack the
columns), so a test can look at what a figure draws. A threshold drawn (the KL ceiling, the
decision boundary's) is the one each row ran with (`rows.kl_ceiling`, `rows.thresholds`).
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any, Callable, Sequence

from specjax.policy import names as policy_names
from specjax.runner import rows as rows_lib
from specjax.runner.plots_kit import (
    _acceptance,
    _colors,
    _dedup_legend,
    _figure,
    _handle,
    _line,
    _patch,
    _per_group,
    _policy,
    _save,
)
from specjax.runner.rows import Row, has, is_number, label, numbers, sd, unique

# ----------------------------------------------------------------------------------
# Plots. Each takes the rows and a path, returns False (writing nothing) when the rows
# lack the columns it needs.
# ----------------------------------------------------------------------------------


def figure_acceptance_vs_gamma(rows: Sequence[Row]):
    """Per-drafter acceptance α against γ, one line per temperature, a panel per drafter."""
    rows = [r for r in rows if is_number(r.get("gamma")) and _acceptance(r)]
    if not rows:
        return None
    drafters = unique(d for r in rows for d in _acceptance(r))
    temp_keys = [k for k in ("drafter_temperature", "verifier_temperature") if has(rows, k)]

    def temp_label(r: Row) -> str:
        names = {"drafter_temperature": "τ drafter", "verifier_temperature": "τ verifier"}
        return ", ".join(f"{names[k]} = {label(r.get(k))}" for k in temp_keys) or "all cells"

    fig, axs = _figure(len(drafters), width=4.2, height=3.6, sharey=True)
    temps = unique(temp_label(r) for r in rows)
    colors = _colors(temps)
    for ax, drafter in zip(axs, drafters):
        for temp in temps:
            pts: dict[float, list[float]] = {}
            for r in rows:
                a = _acceptance(r).get(drafter)
                if temp_label(r) == temp and is_number(a):
                    pts.setdefault(r["gamma"], []).append(a)
            if not pts:
                continue
            xs = sorted(pts)
            ax.errorbar(
                xs,
                [statistics.fmean(pts[x]) for x in xs],
                yerr=[sd(pts[x]) for x in xs],
                marker="o",
                capsize=3,
                color=colors[temp],
                label=temp,
            )
        ax.set_title(f"drafter: {drafter}")
        ax.set_xlabel("γ (draft tokens per round)")
        ax.set_xticks(sorted({r["gamma"] for r in rows}))
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
    axs[0].set_ylabel("acceptance α per position (chain tested alone)")
    axs[-1].legend(title="temperature", fontsize=8, title_fontsize=8, loc="upper right")
    fig.suptitle("Per-drafter acceptance vs γ (mean ± sd over the other axes)")
    return fig


def figure_joint_vs_per_drafter(rows: Sequence[Row]):
    """Bars: each drafter's α and the joint acceptance, per pairing (a panel per policy).

    A red ✕ marks the product of the pairing's α — what the joint acceptance collapses to
    when one shared block must pass every drafter (SPEC §4, switch 2 off).
    """
    rows = [
        r
        for r in rows
        if r.get("pairing") is not None and _acceptance(r) and is_number(r.get("joint_acceptance"))
    ]
    if not rows:
        return None
    policies = unique(_policy(r) for r in rows) if has(rows, "policy") else [None]
    drafters = unique(d for r in rows for d in _acceptance(r))
    colors = _colors(drafters)
    pairings = unique(label(r["pairing"]) for r in rows)
    cols = 4
    fig, axs = _figure(
        len(policies),
        width=max(4.5, 1.3 * len(pairings) + 2),
        height=4.0,
        sharey=True,
        max_cols=cols,
    )
    for ax, policy in zip(axs, policies):
        group = [r for r in rows if policy is None or _policy(r) == policy]
        for i, pairing in enumerate(pairings):
            cells = [r for r in group if label(r["pairing"]) == pairing]
            if cells:
                _pairing_bars(ax, i, cells, colors)
        _pairing_axes(ax, policy, pairings, drafters)
    for ax in axs[::cols]:
        ax.set_ylabel("acceptance per position")
    fig.suptitle(
        "Joint vs per-drafter acceptance (α per position, each chain tested alone), per pairing"
    )
    return fig


def _pairing_bars(ax, i: int, cells: Sequence[Row], colors: dict[str, Any]) -> None:
    """Pairing i's bars: each member's α, the joint α, and the product of the α (✕)."""
    members = unique(d for r in cells for d in _acceptance(r))
    n = len(members) + 1
    width = 0.8 / n
    x0 = i - 0.4 + width / 2
    alphas = []
    for j, d in enumerate(members):
        vals = numbers(_acceptance(r).get(d) for r in cells)
        alphas.append(statistics.fmean(vals))
        ax.bar(
            x0 + j * width,
            alphas[-1],
            width,
            yerr=sd(vals),
            capsize=2,
            color=colors[d],
            label=f"α {d}",
        )
    joint = numbers(r["joint_acceptance"] for r in cells)
    ax.bar(
        x0 + len(members) * width,
        statistics.fmean(joint),
        width,
        yerr=sd(joint),
        capsize=2,
        color="0.25",
        hatch="//",
        edgecolor="white",
        label="joint α",
    )
    if len(members) > 1:
        ax.plot(
            [x0 + len(members) * width],
            [math.prod(alphas)],
            "x",
            color="red",
            markersize=9,
            markeredgewidth=2,
            label="product of α",
        )


def _pairing_axes(ax, policy: str | None, pairings: Sequence[str], drafters: Sequence[str]) -> None:
    """A policy panel's ticks (one per pairing), limits, grid, title and legend."""
    ax.set_xticks(range(len(pairings)))
    ax.set_xticklabels(pairings, rotation=15 if len(pairings) > 3 else 0, fontsize=8)
    ax.set_xlabel("tokenizer pairing (drafters sharing the prefix)")
    ax.set_ylim(0, 1.02)
    ax.grid(axis="y", alpha=0.3)
    ax.set_title(f"policy: {policy}" if policy is not None else "all cells")
    _dedup_legend(
        ax,
        order=[f"α {d}" for d in drafters] + ["joint α", "product of α"],
        fontsize=8,
        loc="upper right",
    )


def figure_joint_vs_kl(rows: Sequence[Row]):
    """Scatter of joint acceptance against the max pairwise KL, each KL ceiling the rows ran
    with marked (`rows.kl_ceiling`; none when no row had switch 4 on)."""
    rows = [
        r
        for r in rows
        if is_number(r.get("kl_max"))
        and math.isfinite(r["kl_max"])
        and is_number(r.get("joint_acceptance"))
    ]
    if not rows:
        return None
    fig, (ax,) = _figure(1, width=8.0, height=4.4)
    by_policy = has(rows, "policy")
    by_pairing = has(rows, "pairing")
    series = unique(_policy(r) for r in rows) if by_policy else ["cells"]
    colors = _colors(series)
    shapes = dict(
        zip(unique(label(r.get("pairing")) for r in rows) if by_pairing else [], "osD^vP*Xph")
    )
    for s in series:
        for shape_label, marker in shapes.items() if by_pairing else [(None, "o")]:
            pts = [
                r
                for r in rows
                if (not by_policy or _policy(r) == s)
                and (shape_label is None or label(r.get("pairing")) == shape_label)
            ]
            if pts:
                ax.scatter(
                    [r["kl_max"] for r in pts],
                    [r["joint_acceptance"] for r in pts],
                    color=colors[s],
                    marker=marker,
                    alpha=0.8,
                    edgecolor="black",
                    linewidth=0.4,
                )
    ceilings = sorted(unique(c for c in map(rows_lib.kl_ceiling, rows) if c is not None))
    xmax = max([r["kl_max"] for r in rows] + ceilings) * 1.1
    for ceiling in ceilings:
        ax.axvline(ceiling, color="firebrick", linestyle="--", linewidth=1.5)
        ax.axvspan(ceiling, xmax, color="firebrick", alpha=0.07)
    ax.set_xlim(0, xmax)
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("max pairwise KL(q_i ‖ q_j) on the shared prefix (nats)")
    ax.set_ylabel("joint acceptance (shared prefix)")
    ax.set_title("Joint acceptance vs drafter divergence")
    ax.grid(alpha=0.3)
    handles = [_line("firebrick", "--", f"KL ceiling {c:g} nats") for c in ceilings]
    handles += (
        [_patch("firebrick", 0.07, "beyond it: drafters do\nnot share a prefix")]
        if ceilings
        else []
    )
    handles += [_handle(ax, "o", colors[s], f"policy {s}") for s in series] if by_policy else []
    handles += [_handle(ax, m, "white", f"pairing {p}") for p, m in shapes.items()]
    fig.legend(handles=handles, fontsize=8, loc="outside right upper")
    return fig


def figure_policy_costs(rows: Sequence[Row]):
    """Bars per policy: consensus-fallback rate; throughput ratios to the single drafter."""
    rows = [r for r in rows if r.get("policy") is not None]
    ratio_keys = [
        k for k in ("throughput_ratio_vs_single", "wallclock_ratio_vs_single") if has(rows, k)
    ]
    panels = ["consensus_fallback_rate"] if has(rows, "consensus_fallback_rate") else []
    panels += ["ratios"] if ratio_keys else []
    if not rows or not panels:
        return None
    policies = unique(_policy(r) for r in rows)
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
            names = {
                "throughput_ratio_vs_single": "cost model",
                "wallclock_ratio_vs_single": "wall clock",
            }
            width = 0.8 / len(ratio_keys)
            for j, key in enumerate(ratio_keys):
                means, sds = _per_group(rows, policies, key)
                ax.bar(
                    [x - 0.4 + width * (j + 0.5) for x in xs],
                    means,
                    width,
                    yerr=sds,
                    capsize=3,
                    label=names[key],
                    color=("tab:blue", "tab:cyan")[j],
                )
            ax.axhline(
                1.0, color="black", linestyle="--", linewidth=1, label="single-drafter baseline"
            )
            ax.set_ylabel("throughput / single-drafter throughput")
            ax.set_title("Throughput vs the best single drafter")
            ax.legend(fontsize=8)
        ax.set_xticks(list(xs))
        ax.set_xticklabels(policies, rotation=20 if len(policies) > 3 else 0, fontsize=8)
        ax.set_xlabel("policy")
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle("Cost of each policy (mean ± sd over the other axes)")
    return fig


def figure_decision_boundary(rows: Sequence[Row], config: dict | None = None):
    """Shared-prefix acceptance against mean truncation depth, the SPEC §6 region marked.

    Below the acceptance floor or beyond the depth ceiling the boundary raises
    SpeculativePrefixCollapseError; inside, a cell is coloured by the boundary's answer
    when its independent-branch acceptance is known (shared − independent > overhead:
    truncate and re-propose, else independent branches), by policy otherwise. Each cell is
    judged by the thresholds it ran with (`rows.thresholds`: a row without them, the
    config's `boundary` block), and each distinct floor and ceiling is drawn.
    """
    rows = [
        r
        for r in rows
        if is_number(r.get("mean_truncation_depth"))
        and is_number(r.get("shared_prefix_acceptance"))
    ]
    if not rows:
        return None
    fig, (ax,) = _figure(1, width=8.6, height=4.6)
    limits = {id(r): rows_lib.thresholds(r, config) for r in rows}
    floors = sorted(unique(t.acceptance_floor for t in limits.values()))
    depths = sorted(
        unique(t.depth_ceiling for t in limits.values() if math.isfinite(t.depth_ceiling))
    )
    xmax = max([r["mean_truncation_depth"] for r in rows] + depths) * 1.15
    for floor in floors:
        ax.axhspan(0, floor, color="firebrick", alpha=0.08)
        ax.axhline(floor, color="firebrick", linestyle="--", linewidth=1.5)
    for depth in depths:
        ax.axvspan(depth, xmax, color="firebrick", alpha=0.08)
        ax.axvline(depth, color="firebrick", linestyle=":", linewidth=1.5)

    def decision(r: Row) -> str:
        shared, depth, t = r["shared_prefix_acceptance"], r["mean_truncation_depth"], limits[id(r)]
        if not 0 <= shared <= 1 or shared < t.acceptance_floor or depth > t.depth_ceiling:
            return "collapse"
        indep = r.get("independent_branch_acceptance")
        if not is_number(indep):
            return "inside the boundary"
        return (
            "truncate & re-propose"
            if shared - indep > t.truncation_overhead_ratio
            else "independent branches"
        )

    decisions = unique(decision(r) for r in rows)
    palette = {
        "collapse": "firebrick",
        "truncate & re-propose": "tab:green",
        "independent branches": "tab:blue",
        "inside the boundary": "tab:green",
    }
    by_policy = has(rows, "policy")
    markers = dict(zip(unique(_policy(r) for r in rows) if by_policy else [], "osD^vP*Xph"))
    for r in rows:
        ax.scatter(
            r["mean_truncation_depth"],
            r["shared_prefix_acceptance"],
            color=palette[decision(r)],
            marker=markers.get(_policy(r), "o"),
            alpha=0.85,
            edgecolor="black",
            linewidth=0.4,
        )
    ax.set_xlim(0, xmax)
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("mean truncation depth (draft tokens discarded per truncation)")
    ax.set_ylabel("shared-prefix (joint) acceptance")
    ax.set_title("Decision boundary (per batch, SPEC §6)")
    ax.grid(alpha=0.3)
    handles = [_line("firebrick", "--", f"acceptance floor {f:g}") for f in floors]
    handles += [_line("firebrick", ":", f"depth ceiling {d:g}") for d in depths]
    handles += [
        _patch("firebrick", 0.08, "collapse region (raises\nSpeculativePrefixCollapseError)")
    ]
    handles += [_handle(ax, "o", palette[d], f"decision: {d}") for d in decisions]
    handles += [_handle(ax, m, "white", f"policy {p}") for p, m in markers.items()]
    fig.legend(handles=handles, fontsize=8, loc="outside right upper")
    return fig


#: Per-cell metrics the γ and KL-ceiling plots draw, each with its axis label.
_CURVES = {
    "joint_acceptance": ("joint acceptance (shared prefix)", (0, 1.02)),
    "throughput_ratio_vs_single": ("throughput ÷ best single drafter (cost model)", None),
    "consensus_fallback_rate": ("consensus-fallback rate", (0, 1.02)),
}


def figure_policies_vs_gamma(rows: Sequence[Row]):
    """Joint acceptance, modelled throughput and fallback against γ: a panel per metric, a
    line per policy (colour) and drafter temperature (line style); drawn when γ varies."""
    rows = [r for r in rows if is_number(r.get("gamma")) and r.get("policy") is not None]
    if len({r["gamma"] for r in rows}) < 2:
        return None
    keys = [k for k in _CURVES if any(is_number(r.get(k)) for r in rows)]
    if not keys:
        return None
    policies = unique(_policy(r) for r in rows)
    temps = unique(label(r.get("drafter_temperature")) for r in rows)
    colors, styles = _colors(policies), dict(zip(temps, ["-", "--", ":", "-.", (0, (5, 1))] * 4))
    fig, axs = _figure(len(keys), width=4.6, height=3.8)
    for ax, key in zip(axs, keys):
        for policy in policies:
            for temp in temps:
                pts: dict[float, list[float]] = {}
                for r in rows:
                    if _policy(r) == policy and label(r.get("drafter_temperature")) == temp:
                        if is_number(r.get(key)):
                            pts.setdefault(float(r["gamma"]), []).append(float(r[key]))
                if not pts:
                    continue
                xs = sorted(pts)
                ax.errorbar(
                    xs,
                    [statistics.fmean(pts[x]) for x in xs],
                    yerr=[sd(pts[x]) for x in xs],
                    marker="o",
                    markersize=4,
                    capsize=2,
                    color=colors[policy],
                    linestyle=styles[temp],
                )
        ylabel, ylim = _CURVES[key]
        if ylim:
            ax.set_ylim(*ylim)
        elif key == "throughput_ratio_vs_single":
            ax.axhline(1.0, color="black", linewidth=1, linestyle="--")
        ax.set_ylabel(ylabel)
        ax.set_xlabel("γ (draft tokens per round)")
        ax.set_xticks(sorted({r["gamma"] for r in rows}))
        ax.grid(alpha=0.3)
    handles = [_line(colors[p], "-", f"policy {p}") for p in policies]
    handles += (
        [_line("gray", styles[t], f"τ drafter = {t}") for t in temps] if len(temps) > 1 else []
    )
    fig.legend(handles=handles, fontsize=8, loc="outside right upper")
    fig.suptitle("Policies vs γ (mean ± sd over the other axes)")
    return fig


def figure_kl_ceiling(rows: Sequence[Row]):
    """Drawn when the rows ran with two or more KL ceilings. Against the ceiling each row
    ran with (`rows.kl_ceiling`): the largest sharing
    set a step ran (from the rows' ``branch_records``), joint acceptance, modelled
    throughput and fallback; a line per policy family (the policy with its ceiling off,
    `kl_family`), whose ceiling-off row is a dotted horizontal line."""
    rows = [r for r in rows if r.get("policy") is not None]
    on = [r for r in rows if rows_lib.kl_ceiling(r) is not None]
    if len({rows_lib.kl_ceiling(r) for r in on}) < 2:
        return None
    families = unique(kl_family(r) for r in on)
    off = [r for r in rows if rows_lib.kl_ceiling(r) is None and _policy(r) in families]
    panels = ["largest_set"] if any(sharing_sets(r) for r in on) else []
    panels += [k for k in _CURVES if any(is_number(r.get(k)) for r in on)]
    if not panels:
        return None
    colors = _colors(families)
    fig, axs = _figure(len(panels), width=4.4, height=3.8, max_cols=2)
    for ax, key in zip(axs, panels):
        value = (lambda r: largest_set(r)) if key == "largest_set" else (lambda r, k=key: r.get(k))
        for fam in families:
            pts: dict[float, list[float]] = {}
            for r in on:
                if kl_family(r) == fam and is_number(value(r)):
                    pts.setdefault(rows_lib.kl_ceiling(r), []).append(float(value(r)))
            if pts:
                xs = sorted(pts)
                ax.errorbar(
                    xs,
                    [statistics.fmean(pts[x]) for x in xs],
                    yerr=[sd(pts[x]) for x in xs],
                    marker="o",
                    markersize=4,
                    capsize=2,
                    color=colors[fam],
                )
            base = numbers(value(r) for r in off if _policy(r) == fam)
            if base:
                ax.axhline(statistics.fmean(base), color=colors[fam], linestyle=":", linewidth=1.5)
        ax.set_xscale("log")
        ceilings = [rows_lib.kl_ceiling(r) for r in on]
        ax.set_xlim(min(ceilings) / 1.3, max(ceilings) * 1.3)
        ax.set_xticks(sorted(set(ceilings)), [f"{c:g}" for c in sorted(set(ceilings))])
        ax.minorticks_off()
        ax.set_xlabel("KL ceiling (nats)")
        if key == "largest_set":
            ax.set_ylabel("drafters in the largest sharing set")
            ax.set_ylim(0, max([largest_set(r) or 0 for r in rows] + [1]) + 0.5)
        else:
            ylabel, ylim = _CURVES[key]
            ax.set_ylabel(ylabel)
            if ylim:
                ax.set_ylim(*ylim)
        ax.grid(alpha=0.3)
    handles = [_line(colors[f], "-", f"{f}, with the ceiling") for f in families]
    handles += [_line("gray", ":", "the same policy, ceiling off")] if off else []
    fig.legend(handles=handles, fontsize=8, loc="outside lower center", ncols=len(handles))
    fig.suptitle("Which drafters share a prefix, and what it gives, vs the KL ceiling")
    return fig


def kl_family(r: Row) -> str:
    """The row's policy with the KL ceiling switched off (``all_on_kl0.5`` → its family
    ``all_on_minus_kl_ceiling``); a router's or a baseline's name as it is."""
    import dataclasses  # pylint: disable=import-outside-toplevel

    try:
        policy = policy_names.parse(r.get("policy"))
    except ValueError:
        return _policy(r)
    if isinstance(policy, str):
        return policy
    return policy_names.canonical_name(dataclasses.replace(policy, kl_ceiling=None))


def sharing_sets(r: Row) -> dict[str, float]:
    """The sharing sets the row's steps ran (its ``branch_records``: each branch's
    drafters), each with the share of plan steps that ran it: ``{"code+prose": 1.0, ...}``,
    largest first."""
    records = r.get("branch_records")
    if not isinstance(records, list):
        return {}
    steps, seen = set(), {}
    for b in records:
        if not isinstance(b, dict) or not isinstance(b.get("drafters"), list):
            continue
        key = (b.get("step"), b.get("plan"))
        steps.add(key)
        seen.setdefault("+".join(map(str, b["drafters"])), set()).add(key)
    if not steps:
        return {}
    order = sorted(seen, key=lambda s: (-(s.count("+") + 1), -len(seen[s]), s))
    return {s: len(seen[s]) / len(steps) for s in order}


def largest_set(r: Row) -> int | None:
    """The most drafters a sharing set of the row's steps held (None: no branch_records)."""
    sets = sharing_sets(r)
    return max(s.count("+") + 1 for s in sets) if sets else None


def plot_acceptance_vs_gamma(rows: Sequence[Row], path: str | Path) -> bool:
    """Saves `figure_acceptance_vs_gamma` to `path`; False (nothing written) without one."""
    return _save(figure_acceptance_vs_gamma(rows), path)


def plot_joint_vs_per_drafter(rows: Sequence[Row], path: str | Path) -> bool:
    """Saves `figure_joint_vs_per_drafter` to `path`; False (nothing written) without one."""
    return _save(figure_joint_vs_per_drafter(rows), path)


def plot_joint_vs_kl(rows: Sequence[Row], path: str | Path) -> bool:
    """Saves `figure_joint_vs_kl` to `path`; False (nothing written) without one."""
    return _save(figure_joint_vs_kl(rows), path)


def plot_policy_costs(rows: Sequence[Row], path: str | Path) -> bool:
    """Saves `figure_policy_costs` to `path`; False (nothing written) without one."""
    return _save(figure_policy_costs(rows), path)


def plot_decision_boundary(
    rows: Sequence[Row], path: str | Path, config: dict | None = None
) -> bool:
    """Saves `figure_decision_boundary` to `path`; False (nothing written) without one."""
    return _save(figure_decision_boundary(rows, config), path)


def plot_policies_vs_gamma(rows: Sequence[Row], path: str | Path) -> bool:
    """Saves `figure_policies_vs_gamma` to `path`; False (nothing written) without one."""
    return _save(figure_policies_vs_gamma(rows), path)


def plot_kl_ceiling(rows: Sequence[Row], path: str | Path) -> bool:
    """Saves `figure_kl_ceiling` to `path`; False (nothing written) without one."""
    return _save(figure_kl_ceiling(rows), path)


# name -> (title in the report, function, whether it takes the run's config)
PLOTS: dict[str, tuple[str, Callable[..., bool], bool]] = {
    "acceptance_vs_gamma": ("Acceptance vs γ per temperature", plot_acceptance_vs_gamma, False),
    "joint_vs_per_drafter": (
        "Joint vs per-drafter acceptance per pairing",
        plot_joint_vs_per_drafter,
        False,
    ),
    "joint_vs_kl": ("Joint acceptance vs max pairwise KL", plot_joint_vs_kl, False),
    "policy_costs": ("Fallback rate and throughput per policy", plot_policy_costs, False),
    "decision_boundary": ("Decision boundary", plot_decision_boundary, True),
    "policies_vs_gamma": (
        "Joint acceptance, throughput and fallback vs γ per policy",
        plot_policies_vs_gamma,
        False,
    ),
    "kl_ceiling": (
        "Sharing sets, joint acceptance, throughput and fallback vs the KL ceiling",
        plot_kl_ceiling,
        False,
    ),
}
