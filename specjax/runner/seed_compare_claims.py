"""The seed's four claims as sections of the side-by-side page (`runner.seed_compare`):
for each, its figures table (a column per deployment | seed | source) and the paragraph that
reads it, every sentence conditional on the figures (`seed_compare_figures`). Each section
takes the page's columns ({'zoo': side, 'real': side}, or 'zoo' and one column per real
deployment); the two-deployment page keeps its zoo-vs-real paragraphs, a page of more reads
every deployment's verdict (`seed_compare_multi`).
"""

from __future__ import annotations

from specjax.field_report import FIELD_REPORT_TABLE
from specjax.runner import seed_compare_multi as multi
from specjax.runner.seed_compare_figures import (
    _PRIMARY,
    SIDES,
    SOURCES,
    _alphas,
    _claim_truncation,
    _fmt,
    _interval_above,
    _interval_below,
    _largest,
    _ok,
    _tri,
    _verdict_collapse,
    effect,
    figure,
    legacy,
)


def _table(title: str, rows: list[tuple[str, list, str, str]], cols=SIDES) -> list[str]:
    """rows: (figure, a cell per column of `cols`, seed cell, source)."""
    out = [
        f"### {title}",
        "",
        "| figure | " + " | ".join(cols) + " | seed | source |",
        "| " + " | ".join(["---"] * (len(cols) + 3)) + " |",
    ]
    for label, cells, seed, src in rows:
        out.append(f"| {label} | " + " | ".join(map(str, cells)) + f" | {seed} | {src} |")
    return out + [""]


def _src(sides: dict, figs) -> str:
    parts = []
    for k, f in zip(sides, figs):
        if f is not None and f.get("source"):
            parts.append(f"{k}: {f['source']}")
    return "; ".join(parts) or "—"


def _throughput_title(sides: dict) -> str:
    return (
        "Figures (primary throughput: "
        + ", ".join(f"{k} {_primary_label(s)}" for k, s in sides.items())
        + ")"
    )


def _primary_label(s: dict | None) -> str:
    return "not run" if s is None else _PRIMARY[s["primary"]][1]


def _claim1(sides: dict) -> list[str]:
    seed = FIELD_REPORT_TABLE
    ss = list(sides.values())
    fs = [figure(s, "naive", "joint_acceptance") for s in ss]
    als = [_alphas(s) for s in ss]
    names = list(dict.fromkeys(list(seed["per_drafter_acceptance"]) + [n for a in als for n in a]))

    def alph(a, s):
        if s is None:
            return "not run"
        return " / ".join(_fmt(a[n]) if n in a else "—" for n in names)

    rows = [
        (
            "naive joint acceptance on shared prefixes",
            [_fmt(f) for f in fs],
            f"{seed['joint_acceptance']['naive']:g}",
            _src(sides, fs),
        ),
        (
            f"per-drafter α ({' / '.join(names)}), naive rounds",
            [alph(a, s) for a, s in zip(als, ss)],
            " / ".join(f"{seed['per_drafter_acceptance'].get(n, float('nan')):g}" for n in names),
            "naive rows: " + SOURCES["alpha"],
        ),
        (
            "verdict (naive joint's interval below every α)",
            [_verdict_collapse(s) for s in ss],
            "claimed",
            "summary claims.collapse",
        ),
    ]
    out = ["## Claim 1: the shared prefix collapses (naive joint acceptance below every α)", ""]
    out += _table("Figures", rows, list(sides))
    if legacy(sides):
        para = _para_collapse(*ss, *fs, *als)
    else:
        para = multi.para_collapse(sides, fs, als, _verdict_collapse)
    return out + [para, ""]


def _para_collapse(z, r, fz, fr, az, ar) -> str:
    if z is None or r is None:
        return "Only one deployment ran: no difference to read."
    parts = []
    for k, f, a in (("zoo", fz, az), ("real", fr, ar)):
        if f is None or not _ok(f.get("value")) or not a:
            parts.append(
                f"on the {k} deployment no prefix was shared under naive (or α is undefined)"
            )
            continue
        lo = min(x["value"] for x in a.values() if _ok(x.get("value")))
        parts.append(
            f"on the {k} deployment naive joint acceptance is {f['value']:.2f} against a "
            f"lowest α of {lo:.2f} ({f['value'] / lo:.0%} of it)"
            if lo
            else f"on the {k} deployment naive joint acceptance is {f['value']:.2f}"
        )
    vz, vr = _verdict_collapse(z), _verdict_collapse(r)
    same = vz == vr
    tail = (
        f"Both deployments give the same verdict ({vz}): the collapse does not depend on the "
        "verifier's size or on which drafters share its tokenizer, as the seed's mechanism (the "
        "shared block cut at the first rejection of any chain) predicts."
        if same and vz == "reproduced"
        else f"The verdicts are {vz} (zoo) and {vr} (real)"
        + (
            ": the collapse is a property of the drafter mix, not of the shared block alone."
            if not same
            else "."
        )
    )
    band = sorted(FIELD_REPORT_TABLE["per_drafter_acceptance"].values())
    for k, a in (("zoo", az), ("real", ar)):
        vals = [x["value"] for x in a.values() if _ok(x.get("value"))]
        if vals:
            where = (
                "below" if max(vals) < band[0] else "above" if min(vals) > band[-1] else "across"
            )
            tail += (
                f" The {k} drafters' α ({' / '.join(f'{v:.2f}' for v in vals)}) lie {where} "
                f"the seed's {band[0]:g}–{band[-1]:g} band."
            )
    return "; ".join(parts).capitalize() + ". " + tail


def _claim2(sides: dict) -> list[str]:
    lab = "adding truncate_and_attribute to naive"
    ss = list(sides.values())
    rows = []
    for key, name, pct in (
        ("primary", "Δ primary throughput vs best single", False),
        ("consensus_fallback_rate", "Δ fallback rate", True),
        ("joint_acceptance", "Δ joint acceptance", False),
    ):
        es = [effect(s, lab, key) for s in ss]
        rows.append(
            (
                f"{name}, {lab}",
                [_fmt(e, pct, True) for e in es],
                "— (\"the decisive change\")",
                _src(sides, es),
            )
        )

    def cell(l, s):
        if s is None:
            return "not run"
        return "—" if l is None else f"{l[0]} ({l[1]['value']:+.2f})"

    rows.append(
        (
            "switch whose addition to naive gains most (primary throughput)",
            [cell(_largest(s, "primary"), s) for s in ss],
            "truncate_and_attribute",
            "summary effects 'adding <switch> to naive'",
        )
    )
    rows.append(
        (
            "verdict",
            [_claim_truncation(s) for s in ss],
            "claimed",
            "Δ primary throughput distinguishable, > 0 and the largest",
        )
    )
    out = ["## Claim 2: truncate-and-attribute is the invariant that matters", ""]
    out += _table(_throughput_title(sides), rows, list(sides))
    if legacy(sides):
        para = _para_truncation(*ss)
    else:
        para = multi.para_truncation(sides, _claim_truncation, _largest)
    return out + [para, ""]


def _para_truncation(z, r) -> str:
    if z is None or r is None:
        return "Only one deployment ran: no difference to read."
    vz, vr = _claim_truncation(z), _claim_truncation(r)
    lz, lr = _largest(z, "primary"), _largest(r, "primary")
    s = []
    for k, l in (("zoo", lz), ("real", lr)):
        if l is not None:
            s.append(
                f"on the {k} deployment the largest gain from one switch added to naive is "
                f"{l[0]}'s ({l[1]['value']:+.2f}, "
                f"{'distinguishable' if l[1]['distinguishable'] else 'not distinguishable'} "
                "from zero)"
            )
    head = "; ".join(s).capitalize() + ". " if s else ""
    if vz.startswith("reproduced") and vr.startswith("reproduced"):
        return head + (
            "Truncation is the switch that matters on both: what it buys (not cutting "
            "every chain at another drafter's rejection) does not depend on the "
            "verifier or on how throughput is measured."
        )
    if vz.split(" (")[0] == vr.split(" (")[0]:
        return head + f"Both deployments give the same verdict ({vz}; {vr})."
    return head + (
        f"The deployments disagree (zoo: {vz}; real: {vr}): which invariant matters "
        "depends on the deployment's drafters and on the throughput measure, so the "
        "seed's single answer does not carry over."
    )


def _claim3(sides: dict) -> list[str]:
    seed = FIELD_REPORT_TABLE
    ss = list(sides.values())
    rows = []
    verdicts = {}
    for key, label, pct, sv in (
        ("joint_acceptance", "joint acceptance", False, seed["joint_acceptance"]),
        (
            "consensus_fallback_rate",
            "consensus-fallback rate",
            True,
            seed["consensus_fallback_rate"],
        ),
        ("primary", "primary throughput vs best single", False, seed["throughput_ratio_vs_single"]),
    ):
        for pol in ("naive", "all_on"):
            fs = [figure(s, pol, key) for s in ss]
            seed_cell = f"~{100 * sv[pol]:.0f}%" if pct else f"{sv[pol]:g}"
            rows.append((f"{label}, {pol}", [_fmt(f, pct) for f in fs], seed_cell, _src(sides, fs)))
        for k, s in sides.items():
            verdicts.setdefault(k, {})[key] = _recovery(s, key)
    for key, label in (
        ("joint_acceptance", "joint rises"),
        ("consensus_fallback_rate", "fallback drops"),
        ("primary", "throughput > 1× and above naive"),
    ):
        rows.append(
            (
                f"verdict: {label}",
                [verdicts[k][key] for k in sides],
                "claimed",
                "intervals of the two rows above",
            )
        )
    out = ["## Claim 3: the seed's recovery (naive → all on)", ""]
    out += _table(_throughput_title(sides), rows, list(sides))
    if legacy(sides):
        para = _para_recovery(*ss, verdicts)
    else:
        para = multi.para_recovery(sides, verdicts)
    return out + [para, ""]


def _recovery(s, key) -> str:
    if s is None:
        return "not run"
    n, a = figure(s, "naive", key), figure(s, "all_on", key)
    if n is None or a is None:
        return "not run (naive or all_on missing)"
    if not _ok(a.get("value")) or not _ok(n.get("value")):
        return "undefined (no shared prefix)" if key == "joint_acceptance" else "undefined"
    if key == "joint_acceptance":
        return _tri(_interval_above(a, n["ci"][1]) if n.get("ci") else None)
    if key == "consensus_fallback_rate":
        return _tri(_interval_below(a, n["ci"][0]) if n.get("ci") else None)
    above = _interval_above(a, 1.0)
    return _tri(None if above is None else (above and a["value"] > n["value"]))


def _para_recovery(z, r, verdicts) -> str:
    if z is None or r is None:
        return "Only one deployment ran: no difference to read."
    out = []
    for k, s in (("zoo", z), ("real", r)):
        a = figure(s, "all_on", "consensus_fallback_rate")
        sd = s["steps"].get("all_on") or {}
        if a is None or not _ok(a.get("value")):
            continue
        if sd.get("fallback"):
            why = ", ".join(
                f"{r} {n}" for r, n in sorted(sd["fallback_reasons"].items(), key=lambda x: -x[1])
            )
            out.append(
                f"on the {k} deployment all-on falls back on {a['value']:.0%} of steps "
                f"({sd['fallback']} fallen-back steps by the reason their branches gave: {why})"
            )
        else:
            out.append(f"on the {k} deployment all-on falls back on {a['value']:.0%} of steps")
    same = all(verdicts["zoo"][k] == verdicts["real"][k] for k in verdicts["zoo"])
    head = "; ".join(out).capitalize() + ". " if out else ""
    if same:
        return head + (
            "The verdicts agree on every part: what all-on does to the step decision "
            "is the same on both verifiers, so it follows from the policy and the "
            "seed's thresholds, not from the verifier."
        )
    diff = [k for k in verdicts["zoo"] if verdicts["zoo"][k] != verdicts["real"][k]]
    return head + (
        "The verdicts differ on "
        + ", ".join(k.replace("_", " ") for k in diff)
        + ": that part of the recovery depends on the deployment (its drafters' "
        "divergence against the KL ceiling, its prices)."
    )


def _claim4(sides: dict) -> list[str]:
    ss = list(sides.values())
    rows = []
    for pol in ("auto", "oracle", "all_on"):
        fs = [figure(s, pol, "primary") for s in ss]
        seed = (
            f"{FIELD_REPORT_TABLE['throughput_ratio_vs_single']['all_on']:g} (all on)"
            if pol == "all_on"
            else "—"
        )
        rows.append(
            (
                f"{pol}: primary throughput vs best single",
                [_fmt(f) for f in fs],
                seed,
                _src(sides, fs),
            )
        )
    bs = [router_bound(s) for s in ss]
    rows.append(
        (
            "best single drafter per plan in hindsight (the most any one-drafter router gains)",
            [_fmt(b) for b in bs],
            "—",
            _src(sides, bs),
        )
    )
    es = [effect(s, "auto vs oracle", "primary") for s in ss]
    rows.append(
        ("auto − oracle (paired)", [_fmt(e, signed=True) for e in es], "—", _src(sides, es))
    )
    rows.append(
        (
            "verdict: auto beats the best single drafter",
            [_auto_verdict(s) for s in ss],
            "1.7× claimed (for all on)",
            "auto's interval vs 1",
        )
    )
    out = ["## Claim 4: routing (`auto`) vs the best single drafter", ""]
    out += _table(_throughput_title(sides), rows, list(sides))
    if legacy(sides):
        para = _para_auto(*ss)
    else:
        para = multi.para_auto(sides, _auto_verdict, router_bound)
    return out + [para, ""]


def router_bound(s) -> dict | None:
    """The side's hindsight per-plan best single drafter over the best single drafter, in
    its primary throughput measure (`seed_table._router_bound`); None when not run."""
    if s is None:
        return None
    b = (s["summary"].get("router_bound") or {}).get(
        "seconds" if s["primary"] == "wall" else "cost"
    )
    if not b:
        return None
    return {"value": b["value"], "ci": b["ci"], "source": b["source"]}


def _auto_verdict(s) -> str:
    if s is None:
        return "not run"
    f = figure(s, "auto", "primary")
    if f is None:
        return "not run (no auto rows)"
    if _interval_above(f, 1.0):
        return "beats it"
    if _interval_below(f, 1.0):
        return "loses to it"
    return "indistinguishable" if f.get("ci") else "undefined"


def _para_auto(z, r) -> str:
    if z is None or r is None:
        return "Only one deployment ran: no difference to read."
    vz, vr = _auto_verdict(z), _auto_verdict(r)
    fz, fr = figure(z, "auto", "primary"), figure(r, "auto", "primary")
    if fz is None or fr is None or not _ok(fz.get("value")) or not _ok(fr.get("value")):
        return f"auto: {vz} (zoo), {vr} (real)."
    s = (
        f"`auto` reaches {fz['value']:.2f}× the best single drafter on the zoo "
        f"({_primary_label(z)}) and {fr['value']:.2f}× on the real verifier "
        f"({_primary_label(r)}). "
    )
    for name, side in (("zoo", z), ("real verifier", r)):
        b = router_bound(side)
        if b and _ok(b.get("value")):
            s += (
                f"On the {name}, choosing each plan's best drafter in hindsight would reach "
                f"{_fmt(b)}× the best single drafter: "
                + (
                    "no router that runs one drafter per plan could reach 1.2× there. "
                    if _interval_below(b, 1.2)
                    else "there is room for a router to reach 1.2×. "
                    if _interval_above(b, 1.2)
                    else "whether a router could reach 1.2× is inside the interval. "
                )
            )
    if vz == vr:
        return (
            s + f"Same verdict on both ({vz}): routing's standing against one drafter does not "
            "change with the verifier."
        )
    return s + (
        f"The verdicts differ ({vz} vs {vr}): the gain from routing depends on how "
        "much a round of the verifier costs against its drafters, which is what the two "
        "deployments (and their throughput measures) differ in."
    )
