"""The section "What real cross-family heterogeneity changes" of the side-by-side page with
more than one real deployment (`runner.seed_compare`): per deployment, its drafters' KL on
the common support (the rows' `kl_max`, `kl_mean`, `kl_outside_mass`), the KL ceiling's
effect (all_on vs all_on_minus_kl_ceiling, naive_plus_kl_ceiling vs naive: throughput,
fallback, and which drafter pairs share a set only without the ceiling, from
`branch_records[].drafters`) and which drafter sets shared a prefix, with the joint
acceptance of the policies where two or more did.

Every sentence is conditional on the figures (nothing is concluded in advance); a figure the
rows do not carry reads "not recorded", with the field that is missing.
"""

from __future__ import annotations

import math

from specjax.policy import names as policy_names
from specjax.runner.seed_compare_figures import (
    SOURCES,
    _effect_pair,
    _fmt,
    _ok,
    _policy,
    effect,
    figure,
)

#: The seed's KL ceiling switch and the two comparisons that isolate it: (the policy with
#: the ceiling, the policy without, the paired effect's label in `summary.effects`).
CEILING_PAIRS = (
    ("all_on", "all_on_minus_kl_ceiling", "removing kl_ceiling from all_on"),
    ("naive_plus_kl_ceiling", "naive", "adding kl_ceiling to naive"),
)


def _best_rows(s: dict, name: str) -> list[dict]:
    """Policy `name`'s rows at its best γ (every seed)."""
    g = (_policy(s, name) or {}).get("gamma")
    return [r for r in s["rows"] if r.get("policy") == name and r.get("gamma") == g]


def sharing_sets(s: dict, name: str) -> dict[tuple, int] | None:
    """The drafter sets policy `name`'s branches ran at its best γ ({set: branch-steps}),
    from the rows' branch_records[].drafters; None where its rows carry no branch records."""
    recs = [b for r in _best_rows(s, name) for b in r.get("branch_records") or []]
    recs = [b for b in recs if isinstance(b, dict) and isinstance(b.get("drafters"), list)]
    if not recs:
        return None
    out: dict[tuple, int] = {}
    for b in recs:
        key = tuple(map(str, b["drafters"]))
        out[key] = out.get(key, 0) + 1
    return out


def _pairs(sets: dict) -> set:
    return {(a, b) for st in sets for i, a in enumerate(st) for b in st[i + 1 :]}


def separated_pairs(s: dict, with_: str, without: str) -> list | str:
    """The drafter pairs that share a set on some step under `without` but on no step under
    `with_` (kept apart by the ceiling, or by the decision boundary's split, which the rows do
    not tell apart), or why that cannot be read from the rows."""
    if _policy(s, with_) is None or _policy(s, without) is None:
        return f"not run ({with_ if _policy(s, with_) is None else without} has no rows)"
    a, b = sharing_sets(s, with_), sharing_sets(s, without)
    if a is None or b is None:
        return f"not recorded (no branch_records[].drafters in {with_ if a is None else without}'s rows)"
    return sorted(_pairs(b) - _pairs(a))


def kl_figures(s: dict) -> dict:
    """The rows' pairwise KL on the common support: the largest (`kl_max`), the mean over
    ordered pairs (`kl_mean`), the largest mass outside the common support
    (`kl_outside_mass`), over every row that carries them; the ceiling (all_on's
    `kl_ceiling`)."""
    rows = s["rows"]

    def vals(key):
        return [r[key] for r in rows if _ok(r.get(key))]

    mx, mn, out = vals("kl_max"), vals("kl_mean"), vals("kl_outside_mass")
    ceiling = next(
        (r["kl_ceiling"] for r in rows if r.get("policy") == "all_on" and _ok(r.get("kl_ceiling"))),
        None,
    )
    if ceiling is None:
        ceiling = next((r["kl_ceiling"] for r in rows if _ok(r.get("kl_ceiling"))), None)
    return {
        "kl_max": max(mx) if mx else None,
        "kl_mean": sum(mn) / len(mn) if mn else None,
        "kl_outside_mass": max(out) if out else None,
        "n": len(mx),
        "ceiling": ceiling,
    }


def _num(x, unit="") -> str:
    return "not recorded" if x is None or not math.isfinite(x) else f"{x:.2f}{unit}"


def _kl_lines(s: dict) -> list[str]:
    kl = kl_figures(s)
    drafters = list(s["rows"][0].get("pairing") or [])
    out = [
        f"Drafters: {' / '.join(drafters) or 'not recorded'}.",
        "",
        "- Pairwise KL(q_i ‖ q_j) on the common support (each pair's distributions restricted "
        "to the tokens both can propose and renormalised, mean over the last positions of "
        f"each plan's prefix): largest {_num(kl['kl_max'], ' nats')}, mean over ordered pairs "
        f"{_num(kl['kl_mean'], ' nats')}; the most probability mass one drafter of a pair puts "
        f"outside the pair's common support (mean over those positions): "
        f"{_num(kl['kl_outside_mass'])} (over {kl['n']} rows' `kl_max`, `kl_mean`, "
        "`kl_outside_mass`, every policy and seed).",
    ]
    if len(drafters) == 2:
        out.append(
            f"- With two drafters the largest is the one pair's ({drafters[0]}, {drafters[1]}), "
            "the larger of its two directions."
        )
    else:
        out.append(
            "- KL per drafter pair: not recorded (the rows carry only the max and mean over "
            "ordered pairs, `kl_max` and `kl_mean`, not each pair's KL); which pairs the "
            "ceiling keeps apart is read from the sharing sets below."
        )
    c, mx = kl["ceiling"], kl["kl_max"]
    if c is None or mx is None:
        out.append(
            "- Against the ceiling: not recorded ("
            + ("no row carries `kl_ceiling`" if c is None else "no row carries `kl_max`")
            + ")."
        )
    elif mx > c:
        out.append(
            f"- The largest KL is above the {c:g}-nat ceiling: on at least one step some pair "
            "was above it, and the ceiling splits such a pair wherever the pair would otherwise "
            "share a set (under prefix partitioning, only a pair of one tokenizer group)."
        )
    else:
        out.append(
            f"- The largest KL is at or below the {c:g}-nat ceiling: the ceiling had no pair "
            "to split on any step, so adding or removing it can change only the KL pass's "
            "cost and, through it, the rounds that follow."
        )
    return out + [""]


def _ceiling_lines(s: dict) -> list[str]:
    out = [
        "| comparison | primary throughput vs best single (with / without ceiling) | paired Δ "
        "primary | fallback rate (with / without) | paired Δ fallback | shared rounds (with / "
        "without) | pairs apart only with the ceiling |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    notes = []
    for with_, without, label in CEILING_PAIRS:
        a, b = _effect_pair(label)
        fw, fo = figure(s, with_, "primary"), figure(s, without, "primary")
        bw, bo = (
            figure(s, with_, "consensus_fallback_rate"),
            figure(s, without, "consensus_fallback_rate"),
        )
        ep, ef = effect(s, label, "primary"), effect(s, label, "consensus_fallback_rate")
        sr = [(_policy(s, n) or {}).get("shared_rounds") for n in (with_, without)]
        sep = separated_pairs(s, with_, without)
        sep_cell = _pairs_cell(sep, s, without)
        out.append(
            f"| {with_} vs {without} | {_fmt(fw)} / {_fmt(fo)} | "
            f"{_fmt(ep, signed=True) if ep else 'not run'} ({a} − {b}) | "
            f"{_fmt(bw, True)} / {_fmt(bo, True)} | "
            f"{_fmt(ef, True, True) if ef else 'not run'} | "
            f"{' / '.join('not run' if x is None else str(x) for x in sr)} | {sep_cell} |"
        )
        if ep is not None and _ok(ep.get("value")):
            v = ep["value"]
            tiny = abs(v) < 0.005  # would print as ±0.00: say how small, not just the sign
            notes.append(
                f"- {label}: primary throughput moves by "
                f"{f'{v:+.4f}' if tiny else f'{v:+.2f}'} ({a} − {b}), "
                + (
                    ("distinguishable from zero" + (" but under 0.005" if tiny else ""))
                    if ep.get("distinguishable")
                    else "not distinguishable from zero"
                )
                + _sep_sentence(sep, sep_cell)
            )
        else:
            notes.append(f"- {label}: not run ({with_} or {without} has no rows).")
    notes.append(
        "- A pair apart only with the ceiling shares a set on some step without it and on no "
        "step with it (`branch_records[].drafters`); the decision boundary can also send a set "
        "to independent branches, and the rows do not record which of the two split a step's "
        "set."
    )
    return out + [""] + notes + [""]


def _shared_lines(s: dict) -> list[str]:
    out = [
        "| policy | drafter sets of ≥ 2 that shared a prefix (branch-steps) | joint acceptance "
        "(pooled over the policy's shared rounds) | shared rounds |",
        "| --- | --- | --- | --- |",
    ]
    alone, unrecorded = [], []
    for name in s["summary"]["policies"]:
        if not policy_names.is_switch_policy(name):
            continue
        sets = sharing_sets(s, name)
        if sets is None:
            unrecorded.append(name)
            continue
        multi = {k: n for k, n in sets.items() if len(k) >= 2}
        if not multi:
            alone.append(name)
            continue
        f = figure(s, name, "joint_acceptance")
        out.append(
            f"| {name} | "
            + ", ".join(f"{'+'.join(k)} ({n})" for k, n in sorted(multi.items()))
            + f" | {_fmt(f)} | {(_policy(s, name) or {}).get('shared_rounds')} |"
        )
    if len(out) == 2:
        out = ["No set of two or more drafters shared a prefix under any switch policy."]
    out.append("")
    if alone:
        out.append(f"Every drafter ran alone under: {', '.join(alone)}.")
    if unrecorded:
        out.append(
            f"Sharing sets not recorded (no branch_records[].drafters) for: {', '.join(unrecorded)}."
        )
    if alone or unrecorded:
        out.append("")
    out.append(
        "Sets from the rows' branch_records[].drafters at each policy's best γ; joint "
        f"acceptance {SOURCES['joint_acceptance']} over the policy's rows (95% interval over "
        "plans), pooled over its shared sets where it ran more than one."
    )
    return out + [""]


def _sep_sentence(sep, cell: str) -> str:
    if isinstance(sep, str):
        return f"; which pairs it keeps apart: {cell}."
    if sep:
        return f"; the pairs that share a set without the ceiling but never with it: {cell}."
    if cell.startswith("none ("):
        return f"; {cell[len('none (') : -1]}, so the ceiling had no pair to keep apart."
    return "; every pair that shares a set without the ceiling shares one with it."


def _pairs_cell(sep, s: dict | None = None, without: str | None = None) -> str:
    if isinstance(sep, str):
        return sep
    if not sep and s is not None and not _pairs(sharing_sets(s, without) or {}):
        return f"none (no pair shares a set under {without} either)"
    return ", ".join("–".join(p) for p in sep) or "none"


def _summary_lines(sides: dict) -> list[str]:
    """One line per deployment and the conditional reading across them."""
    out = [
        "| deployment | drafters | KL max (common support, nats) | mass outside the common "
        "support | ceiling | pairs sharing a set only without the ceiling: all_on vs "
        "all_on_minus_kl_ceiling | … naive_plus_kl_ceiling vs naive | policies where ≥ 2 "
        "drafters shared a prefix |",
        "| " + " | ".join(["---"] * 8) + " |",
    ]
    kls = {}
    for k, s in sides.items():
        if s is None:
            out.append(f"| {k} | " + " | ".join(["not run"] * 7) + " |")
            continue
        kls[k] = kl = kl_figures(s)
        shared = [
            n
            for n in s["summary"]["policies"]
            if any(len(x) >= 2 for x in (sharing_sets(s, n) or {}))
        ]
        out.append(
            f"| {k} ({s['deployment']}) | {' / '.join(s['rows'][0].get('pairing') or [])} | "
            f"{_num(kl['kl_max'])} | {_num(kl['kl_outside_mass'])} | {_num(kl['ceiling'])} | "
            + " | ".join(_pairs_cell(separated_pairs(s, a, b), s, b) for a, b, _ in CEILING_PAIRS)
            + f" | {', '.join(shared) or 'none'} |"
        )
    return out + [""] + _across(kls) + [""]


def _across(kls: dict) -> list[str]:
    """Conditional sentences across the deployments' KL figures."""
    above = {
        k: kl["kl_max"] > kl["ceiling"]
        for k, kl in kls.items()
        if kl["kl_max"] is not None and kl["ceiling"] is not None
    }
    out = []
    hi = [k for k, v in above.items() if v]
    lo = [k for k, v in above.items() if not v]
    if hi and lo:
        out.append(
            f"The drafters' largest KL exceeds the ceiling on {', '.join(hi)} and not on "
            f"{', '.join(lo)}: where it does not, the ceiling cannot change which drafters "
            "share a prefix, so a difference in the ceiling's effect between these deployments "
            "follows the drafters' divergence."
        )
    elif hi:
        out.append(
            "The drafters' largest KL exceeds the ceiling on every deployment that records it "
            "(on at least one step each); the columns above say which pairs were apart only "
            "with the ceiling."
        )
    elif lo:
        out.append(
            "The drafters' largest KL stays at or below the ceiling on every deployment that "
            "records it: on these prefixes the ceiling keeps no pair apart anywhere."
        )
    z, real = kls.get("zoo"), [k for k in kls if k != "zoo"]
    if z is None or not real:
        return [" ".join(out)] if out else []
    out.append(
        "If a drafter of another family and tokenizer makes a deployment's drafters more "
        "heterogeneous than the zoo's, its largest KL and its mass outside the common support "
        "both lie above the zoo's (at two decimals)."
    )
    both = []
    for k in real:
        parts, ups = [], 0
        for key, what in (("kl_max", "largest KL"), ("kl_outside_mass", "mass outside")):
            a, b = kls[k][key], z[key]
            if a is None or b is None:
                parts.append(f"the {what}: not recorded on {k} or the zoo (`{key}`)")
                continue
            a, b = round(a, 2), round(b, 2)
            rel = "above" if a > b else "below" if a < b else "equal to"
            ups += rel == "above"
            parts.append(f"the {what} ({a:.2f}) is {rel} the zoo's ({b:.2f})")
        out.append(f"On {k} " + " and ".join(parts) + ".")
        if ups == 2:
            both.append(k)
    out.append(
        f"Both lie above the zoo's on {', '.join(both)}."
        if both
        else "On no real deployment do both lie above the zoo's."
    )
    return [" ".join(out)]


def heterogeneity(sides: dict) -> list[str]:
    """The section "What real cross-family heterogeneity changes"."""
    out = [
        "## What real cross-family heterogeneity changes",
        "",
        "Per deployment, from its rows only: how far apart its drafters' distributions are "
        "(KL on the common support), what the KL ceiling (switch 4) does to "
        "throughput, fallback and which drafters share a prefix, and which drafter sets did "
        "share one. Each policy's figures are at its best γ; 'not recorded' names the field "
        "the rows lack.",
        "",
    ]
    out += _summary_lines(sides)
    for k, s in sides.items():
        out += [f"### {k}" + ("" if s is None else f" ({s['deployment']})"), ""]
        if s is None:
            out += ["not run", ""]
            continue
        out += _kl_lines(s)
        out += ["#### The KL ceiling's effect", ""] + _ceiling_lines(s)
        out += ["#### Drafter sets that shared a prefix", ""] + _shared_lines(s)
    return out
