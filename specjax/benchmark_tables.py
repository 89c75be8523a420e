"""The tables of experiments/benchmark.py: its result on stdout (`print_tables`) and the body
of docs/results/engine_speed.md (`render_page`), every figure the run's own.
"""

from __future__ import annotations


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
    """specjax against transformers' assisted generation on the zoo's weights (`specjax.peer`)."""
    lines = [
        "",
        f"Against transformers' assisted generation on the zoo's own weights "
        f"exported to HF format (`specjax.peer`, drafter {sw['drafter']}, "
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
