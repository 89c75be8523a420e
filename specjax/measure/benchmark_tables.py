"""The tables of experiments/benchmark.py: its result on stdout (`print_tables`) and the body
of docs/results/engine_speed.md (`render_page`); and the body of experiments/benchmark_real.py's
pages (`real_speed_page`). Every figure is the run's own.
"""

from __future__ import annotations

import numpy as np

from specjax.measure.hardware import ratio_tables
from specjax.verify import registry


def print_tables(result: dict) -> None:
    """The run's tables on stdout."""
    per_batch = {r["batch"]: r for r in result["per_batch"]}
    batches, rows, peer = list(per_batch), result["rows"], result["peer"]
    print(
        f"\n{'B':>3} {'AR tok/s':>9} {'decode':>9} {'floor':>9} {'floor/dec':>9} {'peer':>8} "
        f"{'AR/peer':>7}"
    )
    for b in batches:
        r = per_batch[b]
        print(
            f"{b:3d} {r['ar_tokens_per_s']:9.1f} {r['ar_decode_tokens_per_s']:9.1f} "
            f"{r['floor_tokens_per_s']:9.1f} "
            f"{r['decode_over_floor']:9.2f} {r.get('peer_tokens_per_s', float('nan')):8.1f} "
            f"{r.get('ar_over_peer', float('nan')):7.2f}"
        )
    if len(batches) > 1:
        b0, b1 = batches[0], batches[-1]
        r0, r1 = per_batch[b0], per_batch[b1]
        print(
            f"AR scaling B={b1} / B={b0}: "
            f"{r1['ar_tokens_per_s'] / r0['ar_tokens_per_s']:.2f}x "
            f"(floor {r1['floor_tokens_per_s'] / r0['floor_tokens_per_s']:.2f}x)"
        )
    if peer is not None and peer["assisted"]:
        print(
            f"peer assisted (B=1): {peer['assisted'][1]:.1f} tok/s; plain (B=1): "
            f"{peer['plain'].get(1, float('nan')):.1f} tok/s"
        )
    print(
        f"\n{'drafter':9} {'γ':>2} {'B':>2} {'AR tok/s':>9} {'spec tok/s':>10} {'α':>5} "
        f"{'tok/rnd':>7} {'c':>5} {'Tscore/Tstep':>12} {'Leviathan':>9} {'hw-aware':>8} "
        f"{'spec/AR':>7} {'meas/hw':>7}"
    )
    for r in rows:
        print(
            f"{r['drafter']:9} {r['gamma']:2d} {r['batch']:2d} {r['ar_tokens_per_s']:9.1f} "
            f"{r['spec_tokens_per_s']:10.1f} {r['alpha']:5.2f} {r['tokens_per_round']:7.2f} "
            f"{r['c']:5.2f} {r['t_score_over_t_step']:12.2f} {r['leviathan_speedup']:9.2f} "
            f"{r['hardware_aware_speedup']:8.2f} {r['measured_speedup']:7.2f} "
            f"{r['measured_over_hardware_aware']:7.2f}"
        )
    for b in batches if rows else []:
        best = max((r for r in rows if r["batch"] == b), key=lambda r: r["measured_speedup"])
        print(
            f"best at B={b}: {best['drafter']} γ={best['gamma']}: spec/AR "
            f"{best['measured_speedup']:.2f}x, hardware-aware "
            f"{best['hardware_aware_speedup']:.2f}x (ratio "
            f"{best['measured_over_hardware_aware']:.2f}), Leviathan "
            f"{best['leviathan_speedup']:.2f}x"
        )


def _span(values, digits: int = 2) -> str:
    lo, hi = min(values), max(values)
    return (
        f"{lo:.{digits}f}"
        if f"{lo:.{digits}f}" == f"{hi:.{digits}f}"
        else f"{lo:.{digits}f}–{hi:.{digits}f}"
    )


def _line(label, values) -> str:
    """A table row: its label, then one cell per value."""
    return f"| {label} | " + " | ".join(values) + " |"


def _batch_lines(result: dict) -> list[str]:
    """The page's opening sentence and the per-batch table's AR, prefill, floor and peer rows."""
    per_batch, rows = result["per_batch"], result["rows"]
    batches = [r["batch"] for r in per_batch]
    names = list(dict.fromkeys(r["drafter"] for r in rows))
    lines = [
        f"Drafter(s) {', '.join(names)}, rule 1, τ = {result['verifier_temperature']:g}, "
        f"{result['new_tokens']} new tokens per row; AR and speculative runs alternating, "
        f"medians of {result['repeats']} (spec ÷ AR: median of the paired ratios); "
        "prompts padded to "
        + ", ".join(f"{r['width']} tokens at batch {r['batch']}" for r in per_batch)
        + " (the peer's prompts are as wide).",
        "",
        "| | " + " | ".join(f"batch {b}" for b in batches) + " |",
        "| --- |" + " --- |" * len(batches),
        _line("AR tok/s, prefill included", [f"{r['ar_tokens_per_s']:,.0f}" for r in per_batch]),
        _line(
            "prefill of the batch's prompts, ms", [f"{1e3 * r['t_prefill']:.1f}" for r in per_batch]
        ),
        _line(
            "AR decode tok/s / matmul floor tok/s",
            [
                f"{r['ar_decode_tokens_per_s']:,.0f} / {r['floor_tokens_per_s']:,.0f}"
                for r in per_batch
            ],
        ),
        _line("decode time ÷ floor time", [f"{r['decode_over_floor']:.2f}" for r in per_batch]),
    ]
    if all("peer_tokens_per_s" in r for r in per_batch):
        peer = result["peer"]
        lines += [
            _line(
                f"transformers (PyTorch eager, {peer['threads']} threads), plain generation tok/s",
                [f"{r['peer_tokens_per_s']:,.0f}" for r in per_batch],
            ),
            _line("AR ÷ transformers", [f"{r['ar_over_peer']:.2f}" for r in per_batch]),
        ]
    return lines


def _speedup_lines(rows: list[dict], batches: list[int]) -> list[str]:
    """The per-batch table's speculative ÷ AR rows (a drafter each, γ in turn) and the spans of
    T_score ÷ T_step and measured ÷ hardware-aware."""
    names = list(dict.fromkeys(r["drafter"] for r in rows))
    gammas = list(dict.fromkeys(r["gamma"] for r in rows))
    lines = []
    for name in names:
        lines.append(
            _line(
                f"speculative ÷ AR ({name}), γ = " + " / ".join(map(str, gammas)),
                [
                    " / ".join(
                        f"{r['measured_speedup']:.2f}"
                        for r in rows
                        if r["batch"] == b and r["drafter"] == name
                    )
                    for b in batches
                ],
            )
        )
    if rows:
        lines += [
            _line(
                "T_score ÷ T_step",
                [
                    _span([r["t_score_over_t_step"] for r in rows if r["batch"] == b])
                    for b in batches
                ],
            ),
            _line(
                "measured ÷ hardware-aware prediction",
                [
                    _span([r["measured_over_hardware_aware"] for r in rows if r["batch"] == b])
                    for b in batches
                ],
            ),
        ]
    return lines


def _rows_table(rows: list[dict]) -> list[str]:
    """The table of every drafter × γ × batch row."""
    return [
        "",
        "Per drafter × γ × batch:",
        "",
        "| drafter | γ | B | AR tok/s | spec tok/s | α | tokens / round | c | "
        "T_score ÷ T_step | Leviathan | hardware-aware | spec ÷ AR | "
        "measured ÷ hardware-aware |",
        "|---" * 13 + "|",
    ] + [
        f"| {r['drafter']} | {r['gamma']} | {r['batch']} | "
        f"{r['ar_tokens_per_s']:,.0f} | {r['spec_tokens_per_s']:,.0f} | "
        f"{r['alpha']:.3f} | {r['tokens_per_round']:.2f} | {r['c']:.3f} | "
        f"{r['t_score_over_t_step']:.2f} | {r['leviathan_speedup']:.2f} | "
        f"{r['hardware_aware_speedup']:.2f} | {r['measured_speedup']:.2f} | "
        f"{r['measured_over_hardware_aware']:.2f} |"
        for r in rows
    ]


def _same_weights_table(sw: dict) -> list[str]:
    """specjax against transformers' assisted generation on the zoo's weights
    (`specjax.measure.peer`)."""
    lines = [
        "",
        f"Against transformers' assisted generation on the zoo's own weights "
        f"exported to HF format (`specjax.measure.peer`, drafter {sw['drafter']}, "
        f"γ = {sw['gamma']}, batch 1, {sw['prompts']} prompts × {sw['new_tokens']} "
        "tokens):",
        "",
        "| mode | specjax tok/s | α | transformers tok/s | α | specjax ÷ transformers "
        "| identical outputs |",
        "|---|---|---|---|---|---|---|",
    ]
    for label, r in sw["rows"].items():
        s, p = r["specjax"], r["transformers"]
        lines.append(
            f"| {label} | {s['tokens_per_s']:,.1f} | {s['acceptance']:.3f} | "
            f"{p['tokens_per_s']:,.1f} | {p['acceptance']:.3f} | "
            f"{r['ratio_tokens_per_s']:.2f} | {r.get('same_outputs', '—')} |"
        )
    return lines


def render_page(result: dict) -> list[str]:
    """docs/results/engine_speed.md's body (below the provenance header), every figure the
    run's own."""
    rows = result["rows"]
    batches = [r["batch"] for r in result["per_batch"]]
    lines = _batch_lines(result) + _speedup_lines(rows, batches)
    if rows:
        lines += _rows_table(rows)
    sw = result.get("same_weights")
    if sw:
        lines += _same_weights_table(sw)
    return lines


def _interval(x: dict) -> str:
    """' (lo–hi)': a row's bootstrap interval of spec / AR over its calls, where it has one."""
    lo, hi = x.get("speedup_interval", (float("nan"),) * 2)
    return f" ({lo:.2f}–{hi:.2f})" if np.isfinite(lo) and np.isfinite(hi) else ""


def _use(row: dict) -> str:
    u = row.get("row_use")  # absent from results written before it was measured
    return "—" if u is None else f"{u:.2f}"


def ratio_disagreements(r: dict, tol: float = 0.15) -> list[dict] | None:
    """The spec rows whose own T_score / T_step (timed with their setup) differs by more
    than ``tol`` (relative) from the ratio table's figure for the same layout and batch at
    the same block width k = S·γ + 1 (linear between the measured widths; outside them the
    row is not compared). ``None`` when the run has no ratio table for its spec layout:
    there is nothing to compare with. A disagreement means load moved between the two
    timings, or one of them was not warm: the row's prediction used its own figure."""
    layout = r.get("layout")
    table = {x["batch"]: x for x in r.get("ratio") or () if x.get("dtype") == layout}
    if not layout or not table or not r.get("spec"):
        return None
    out = []
    for x in r["spec"]:
        t = table.get(x["batch"])
        if t is None:
            continue
        k = x.get("slots", 1) * x["gamma"] + 1
        ratio = {int(j): v for j, v in t["ratio"].items()}  # int keys, or str from JSON
        ks = sorted(ratio)
        if not ks[0] <= k <= ks[-1]:
            continue
        expect = float(np.interp(k, ks, [ratio[j] for j in ks]))
        got = x["t_score_over_t_step"]
        if abs(got / expect - 1) > tol:
            out.append(dict(row=x, k=k, table=expect, spec=got))
    return out


def _agreement_lines(r: dict, tol: float = 0.15) -> list[str]:
    bad = ratio_disagreements(r, tol)
    if bad is None:
        return []
    if not bad:
        return [
            f"Every row's T_score / T_step is within {tol:.0%} of the ratio table's at the "
            "same k, layout and batch.",
            "",
        ]
    lines = [
        f"**Check:** these rows' T_score / T_step differs by more than {tol:.0%} from the ratio "
        "table's at the same k, layout and batch (load moved between the two timings; each "
        "row's prediction uses its own figure):",
        "",
    ]
    lines += [
        f"- B {b['row']['batch']}, τ {b['row']['tau']:g}, {b['row']['drafter']}, γ "
        f"{b['row']['gamma']}: k {b['k']}, {b['spec']:.2f} here against {b['table']:.2f}"
        for b in bad
    ]
    return lines + [""]


def real_speed_page(r: dict) -> list[str]:
    """The body (below the provenance header) of experiments/benchmark_real.py's pages,
    docs/results/real_speed_headline.md among them, from one run's result (every figure is
    the run's)."""
    lines = [f"Stream bandwidth {r['stream_bytes_per_s'] / 1e9:.1f} GB/s.", ""]
    if r.get("ratio"):
        lines += ratio_tables(r["ratio"])
    if r.get("spec"):
        lines += _spec_table(r)
        lines += _agreement_lines(r)
        lines += _tree_alphas(r["spec"])
        lines += _block_against_rule1(r["spec"])
        lines += _against_reference(r)
    if r.get("peer"):
        lines += _peer_lines(r)
    return lines


def _spec_table(r: dict) -> list[str]:
    """The speculative ÷ autoregressive table: one row per spec row of the run, its
    heading and how to read it."""
    lines = [
        f"## Speculative vs autoregressive ({r.get('new_tokens')} new tokens, "
        f"{r.get('prompts_per_domain')} plan prompt(s) per domain in the chat template, "
        f"medians of {r.get('repeats')} paired runs)",
        "",
        "One drafter: rule 1 (rejection) unless another is named beside it. "
        "Drafters joined by `+`: one token tree per row, "
        "a chain of γ from each drafter, scored in one (S·γ+1)-token forward (the "
        "T_score column) and verified by the rule named beside it; α is then the "
        "drafters' own α pooled (each chain tested alone), per drafter below the "
        "table, and the hardware-aware prediction is E·T_step / (γ·ΣT_draft + "
        "T_score(S·γ+1)). Row use: the rows' rounds ÷ (B × the call's rounds) — a call "
        "runs until its slowest row is done, while the prediction counts every row busy. "
        "Spec / AR: the median of the paired runs' ratios and, in parentheses, a 95% "
        "bootstrap interval over the calls (each prompt a call at batch 1; the repeats "
        "pooled): which prompts, and which sample paths, were measured.",
        "",
        "| B | τ | drafter (τ_i) | γ | AR tok/s | spec tok/s | spec / AR | hw-aware | "
        "measured / hw-aware | α | tokens / round | row use | c | T_score / T_step |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for x in r["spec"]:
        tree = f", {x['rule']}" if x.get("slots", 1) > 1 or not _rule(x).rule1 else ""
        lines.append(
            f"| {x['batch']} | {x['tau']:g} | {x['drafter']} "
            f"({x.get('drafter_tau', float('nan')):g}{tree}) | {x['gamma']} | "
            f"{x['ar_tokens_per_s']:.1f} | {x['spec_tokens_per_s']:.1f} | "
            f"{x['measured_speedup']:.2f}{_interval(x)} | "
            f"{x['hardware_aware_speedup']:.2f} | "
            f"{x['measured_over_hardware_aware']:.2f} | {x['alpha']:.2f} | "
            f"{x['tokens_per_round']:.2f} | {_use(x)} | {x['c']:.3f} | "
            f"{x['t_score_over_t_step']:.2f} |"
        )
    lines.append("")
    return lines


def _tree_alphas(spec: list[dict]) -> list[str]:
    """Each tree row's per-drafter α (each chain tested alone); none without trees."""
    trees = [x for x in spec if x.get("slots", 1) > 1]
    if not trees:
        return []
    lines = ["Per-drafter α in the trees (each chain tested alone):", ""]
    lines += [
        f"- B {x['batch']}, τ {x['tau']:g}, {x['drafter']}, γ {x['gamma']}: "
        + ", ".join(f"{n} {a:.2f}" for n, a in x["alpha_by_drafter"].items())
        for x in trees
    ]
    lines.append("")
    return lines


def _block_against_rule1(spec: list[dict]) -> list[str]:
    """One-chain rules other than rule 1: their kept drafts per round against rule 1's on
    the same blocks; none without such rows."""
    blocks = [x for x in spec if _rule(x).one_chain and not _rule(x).rule1]
    if not blocks:
        return []
    lines = [
        "Block verification against rule 1 on the same blocks (each round's expected "
        "drafts kept given its drafts, p and q, under both rules; the accept draws' "
        "noise paired out, the paths' not):",
        "",
    ]
    lines += [
        f"- B {x['batch']}, τ {x['tau']:g}, {x['drafter']}, γ {x['gamma']}: "
        f"{x['kept_per_round']:.3f} against {x['kept_per_round_rule1']:.3f} drafts kept "
        f"per round ({x['kept_per_round'] / x['kept_per_round_rule1'] - 1:+.1%})"
        for x in blocks
        if x.get("kept_per_round_rule1")
    ]
    lines.append("")
    return lines


def _against_reference(r: dict) -> list[str]:
    """The spec rows timed against plain decoding in the reference dtype (the model's own
    numerics); none without such rows."""
    refs = [x for x in r["spec"] if "spec_over_reference_ar" in x]
    if not refs:
        return []
    ref_dtype = next(a["reference_dtype"] for a in r["ar"] if a.get("reference_dtype"))
    lines = [
        f"Against plain decoding of the same model in {ref_dtype} (its own numerics), "
        "timed in the same paired rounds (median of the per-round ratios):",
        "",
        f"| B | τ | drafter | γ | spec tok/s | AR ({ref_dtype}) tok/s | spec / AR ({ref_dtype}) |",
        "|---|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {x['batch']} | {x['tau']:g} | {x['drafter']} | {x['gamma']} | "
        f"{x['spec_tokens_per_s']:.1f} | {x['reference_ar_tokens_per_s']:.1f} | "
        f"{x['spec_over_reference_ar']:.2f} |"
        for x in refs
    ]
    lines.append("")
    return lines


def _peer_lines(r: dict) -> list[str]:
    """transformers on the same weights: its greedy agreement and speeds."""
    p = r["peer"]
    lines = [
        "## transformers on the same weights (f32, eager, batch 1, greedy)",
        "",
        f"Greedy tokens identical to specjax's for {r.get('new_tokens')} tokens on the "
        f"three prompts: {p['greedy_identical']}.",
        "",
        "| transformers | tok/s |",
        "|---|---|",
    ]
    lines += [f"| {k} | {v:.1f} |" for k, v in p.items() if k != "greedy_identical"]
    lines.append("")
    return lines


def _rule(row: dict):
    """The registered rule of a speed row (`specjax.verify.registry`; no rule: rule 1's)."""
    return registry.get(row.get("rule") or registry.call_rule(None, 1).name)
