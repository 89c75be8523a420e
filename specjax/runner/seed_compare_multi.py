"""The claims' paragraphs on a page of more than two deployments (`runner.seed_compare`:
zoo and each real deployment): each reads every deployment's verdict, every sentence
conditional on the figures (nothing is concluded in advance). The two-deployment page keeps
its zoo-vs-real paragraphs (`seed_compare_claims`).
"""

from __future__ import annotations

from specjax.field_report import FIELD_REPORT_TABLE
from specjax.runner.seed_compare_figures import (
    _PRIMARY,
    _fmt,
    _interval_above,
    _interval_below,
    _ok,
    figure,
)

_ONE = "Only one deployment ran: no difference to read."


def _ran(sides: dict) -> list[tuple[str, dict]]:
    return [(k, s) for k, s in sides.items() if s is not None]


def _label(s: dict | None) -> str:
    return "not run" if s is None else _PRIMARY[s["primary"]][1]


def _listing(vs: dict) -> str:
    return ", ".join(f"{v} ({k})" for k, v in vs.items())


# ----------------------------------------------------------------------------- claims


def para_collapse(sides: dict, fs: list, als: list, verdict) -> str:
    """Claim 1 read on every deployment that ran."""
    ran = _ran(sides)
    if len(ran) < 2:
        return _ONE
    parts = []
    for (k, s), f, a in zip(sides.items(), fs, als):
        if s is None:
            continue
        if f is None or not _ok(f.get("value")) or not a:
            parts.append(f"on {k} no prefix was shared under naive (or α is undefined)")
            continue
        vals = [x["value"] for x in a.values() if _ok(x.get("value"))]
        lo = min(vals) if vals else None
        parts.append(
            f"on {k} naive joint acceptance is {f['value']:.2f} against a lowest α of "
            f"{lo:.2f} ({f['value'] / lo:.0%} of it)"
            if lo
            else f"on {k} naive joint acceptance is {f['value']:.2f}"
        )
    vs = {k: verdict(s) for k, s in ran}
    if set(vs.values()) == {"reproduced"}:
        tail = (
            f"All {len(ran)} deployments give the same verdict (reproduced): the collapse "
            "does not depend on the verifier's size or family, nor on which drafters share "
            "its tokenizer, as the seed's mechanism (the shared block cut at the first "
            "rejection of any chain) predicts."
        )
    else:
        tail = f"The verdicts are {_listing(vs)}" + (
            ": the collapse is a property of the drafter mix, not of the shared block alone."
            if len(set(vs.values())) > 1
            else "."
        )
    band = sorted(FIELD_REPORT_TABLE["per_drafter_acceptance"].values())
    for (k, s), a in zip(sides.items(), als):
        vals = [x["value"] for x in a.values() if _ok(x.get("value"))]
        if s is not None and vals:
            where = (
                "below" if max(vals) < band[0] else "above" if min(vals) > band[-1] else "across"
            )
            tail += (
                f" The {k} drafters' α ({' / '.join(f'{v:.2f}' for v in vals)}) lie {where} "
                f"the seed's {band[0]:g}–{band[-1]:g} band."
            )
    return "; ".join(parts).capitalize() + ". " + tail


def para_truncation(sides: dict, verdict, largest) -> str:
    """Claim 2 read on every deployment that ran."""
    ran = _ran(sides)
    if len(ran) < 2:
        return _ONE
    s = []
    for k, side in ran:
        lg = largest(side, "primary")
        if lg is not None:
            s.append(
                f"on {k} the largest gain from one switch added to naive is {lg[0]}'s "
                f"({lg[1]['value']:+.2f}, "
                f"{'distinguishable' if lg[1]['distinguishable'] else 'not distinguishable'} "
                "from zero)"
            )
    head = "; ".join(s).capitalize() + ". " if s else ""
    vs = {k: verdict(side) for k, side in ran}
    if all(v.startswith("reproduced") for v in vs.values()):
        return head + (
            f"Truncation is the switch that matters on all {len(ran)}: what it buys (not "
            "cutting every chain at another drafter's rejection) does not depend on the "
            "verifier, its family or how throughput is measured."
        )
    if len({v.split(" (")[0] for v in vs.values()}) == 1:
        return head + f"Every deployment gives the same verdict ({'; '.join(vs.values())})."
    return head + (
        f"The deployments disagree ({'; '.join(f'{k}: {v}' for k, v in vs.items())}): which "
        "invariant matters depends on the deployment's drafters and on the throughput "
        "measure, so the seed's single answer does not carry over."
    )


def para_recovery(sides: dict, verdicts: dict) -> str:
    """Claim 3 read on every deployment that ran (`verdicts`: {column: {figure: verdict}})."""
    ran = _ran(sides)
    if len(ran) < 2:
        return _ONE
    out = []
    for k, s in ran:
        a = figure(s, "all_on", "consensus_fallback_rate")
        sd = s["steps"].get("all_on") or {}
        if a is None or not _ok(a.get("value")):
            continue
        line = f"on {k} all-on falls back on {a['value']:.0%} of steps"
        if sd.get("fallback"):
            why = ", ".join(
                f"{x} {n}" for x, n in sorted(sd["fallback_reasons"].items(), key=lambda x: -x[1])
            )
            line += (
                f" ({sd['fallback']} fallen-back steps by the reason their branches gave: {why})"
            )
        out.append(line)
    head = "; ".join(out).capitalize() + ". " if out else ""
    keys = list(verdicts[ran[0][0]])
    diff = [x for x in keys if len({verdicts[k][x] for k, _ in ran}) > 1]
    if not diff:
        return head + (
            f"The verdicts agree on every part across all {len(ran)} deployments: what all-on "
            "does to the step decision follows from the policy and the seed's thresholds, not "
            "from the verifier."
        )
    return head + (
        "The verdicts differ on "
        + "; ".join(
            f"{x.replace('_', ' ')} ({_listing({k: verdicts[k][x] for k, _ in ran})})" for x in diff
        )
        + ": that part of the recovery depends on the deployment (its drafters' divergence "
        "against the KL ceiling, its prices)."
    )


def para_auto(sides: dict, verdict, bound) -> str:
    """Claim 4 read on every deployment that ran."""
    ran = _ran(sides)
    if len(ran) < 2:
        return _ONE
    vs = {k: verdict(s) for k, s in ran}
    out = ""
    for k, s in ran:
        f = figure(s, "auto", "primary")
        if f is not None and _ok(f.get("value")):
            out += (
                f"On {k}, `auto` reaches {f['value']:.2f}× the best single drafter ({_label(s)}). "
            )
        b = bound(s)
        if b and _ok(b.get("value")):
            out += (
                f"Choosing each plan's best drafter in hindsight would reach {_fmt(b)}× there: "
                + (
                    "no router that runs one drafter per plan could reach 1.2×. "
                    if _interval_below(b, 1.2)
                    else "there is room for a router to reach 1.2×. "
                    if _interval_above(b, 1.2)
                    else "whether a router could reach 1.2× is inside the interval. "
                )
            )
    if len(set(vs.values())) == 1:
        return out + (
            f"Same verdict on all {len(ran)} ({next(iter(vs.values()))}): routing's standing "
            "against one drafter does not change with the verifier."
        )
    return out + (
        f"The verdicts differ ({_listing(vs)}): the gain from routing depends on how much a "
        "round of the verifier costs against its drafters and on how alike the drafters are, "
        "which is what the deployments differ in."
    )
