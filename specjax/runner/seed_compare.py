"""The seed's four claims judged on both deployments, side by side: zoo | real | seed.

  python -m specjax.report --workdir=runs/seed_reproduction_real --compare_with=runs/seed_reproduction

Builds one page from two runs' result rows (each through `seed_table.build`, so every
figure is the same ratio of sums with the same bootstrap interval as in that run's own
seed_report.md) and the field report's table (`specjax.field_report`). Each figure names
where it comes from: the policy whose rows it sums, at which γ, and the row fields of the
ratio. A deployment (or a policy) a run did not have reads "not run", never an error.

Which throughput figure is primary depends on the deployment (SPEC §10): on the zoo the
verifier sits in the CPU cache, so wall clock says nothing about the seed's hardware and the
cost model is primary; on a real verifier (`smollm2`, `hf`) wall clock is primary and the
cost model its check. Whether the real run's rounds were memory-bound needs T_score(γ+1) /
T_step; the page reads them from the rows when they carry them and says "not measured"
otherwise.

Every sentence that interprets a figure is conditional on the figures (no conclusion is
written in advance); the held-out prediction for the real deployment is stated as the issue
history gives it, and each of its parts is checked against the rows.
"""

from __future__ import annotations

import collections
import math
from pathlib import Path

from specjax.errors import ConfigError
from specjax.field_report import FIELD_REPORT_TABLE
from specjax.policy import names as policy_names
from specjax.policy.switches import SWITCHES
from specjax.runner.seed_report import WALL_CLOCK_PRIMARY

#: The held-out prediction's "~100%": a fallback rate at or above this reads as "always".
NEAR_ALL = 0.95
#: T_score(γ+1) / T_step at or below this reads as memory-bound (scoring γ+1 tokens costs
#: about one decode step, Leviathan's regime); above it, compute-bound.
MEMORY_BOUND_RATIO = 1.5
#: The held-out prediction for the real deployment, as the issue history states it.
PREDICTION = (
    "naive falls back ~100% by construction (in a naive block s < i); all-on falls back "
    "while the 0.35-nat ceiling isolates drafters; only truncation commits"
)
SIDES = ("zoo", "real")

_PRIMARY = {
    "cost": ("throughput_ratio_vs_single", "cost model (this deployment's c_i)"),
    "wall": ("wallclock_ratio_vs_single", "wall clock (this machine)"),
}
#: How each figure is formed from a policy's rows (its rows at its best γ, summed over seeds).
SOURCES = {
    "joint_acceptance": "Σ per_plan.multi_from_draft / Σ per_plan.multi_reached",
    "consensus_fallback_rate": "Σ per_plan.fallbacks / Σ per_plan.steps",
    "throughput_ratio_vs_single": "(Σ per_plan.tokens / Σ per_plan.cost) ÷ "
    "(Σ baselines.single.<best>.tokens / Σ baselines.single.<best>.cost)",
    "wallclock_ratio_vs_single": "(Σ per_plan.tokens / Σ per_plan.seconds) ÷ "
    "(Σ baselines.single.<best>.tokens / Σ baselines.single.<best>.seconds)",
    "alpha": "Σ per_plan.own_accepted[:, i] / Σ per_plan.own_reached[:, i]",
}
_REASON = {
    True: "True",
    False: "gain ≤ overhead",
    "acceptance_below_floor": "below floor",
    "truncation_thrash": "above depth ceiling",
    "acceptance_out_of_range": "out of range",
}


# ----------------------------------------------------------------------------- inputs


def side(rows: list[dict], config: dict, workdir=None, version=None) -> dict | None:
    """One deployment's column: its seed table (`seed_table.build`), its rows, its settings.
    None when no row is a `plans` row (the deployment reads "not run")."""
    import ml_collections  # pylint: disable=import-outside-toplevel

    from specjax.runner import seed_table  # pylint: disable=import-outside-toplevel

    rows = [r for r in rows if isinstance(r, dict) and "per_plan" in r]
    if not rows:
        return None
    built = seed_table.build(ml_collections.ConfigDict(config or {}), rows)
    if built is None:
        return None
    deployment = (config or {}).get("deployment") or "zoo"
    primary = "wall" if deployment in WALL_CLOCK_PRIMARY else "cost"
    return {
        "summary": built["summary"],
        "markdown": built["markdown"],
        "rows": rows,
        "config": config or {},
        "workdir": str(workdir) if workdir is not None else None,
        "version": version or {},
        "deployment": deployment,
        "primary": primary,
        "steps": {p: _step_breakdown(rows, p, f) for p, f in built["summary"]["policies"].items()},
    }


def kind(deployment: str) -> str:
    """'real' for a deployment whose verifier is a pretrained model, else 'zoo'."""
    return "real" if deployment in WALL_CLOCK_PRIMARY else "zoo"


def pair(a: dict | None, b: dict | None) -> dict:
    """{'zoo': side, 'real': side} from two sides of different kinds; ConfigError (naming
    --compare_with) when both are of one kind."""
    out = {"zoo": None, "real": None}
    for s in (a, b):
        if s is None:
            continue
        k = kind(s["deployment"])
        if out[k] is not None:
            raise ConfigError.invalid(
                "--compare_with",
                s["workdir"] or s["deployment"],
                f"a run of the other kind than --workdir's (zoo vs real: "
                f"{', '.join(WALL_CLOCK_PRIMARY)}); both are deployment={s['deployment']!r}",
            )
        out[k] = s
    return out


# ----------------------------------------------------------------------------- figures


def _policy(s: dict | None, name: str) -> dict | None:
    return None if s is None else s["summary"]["policies"].get(name)


def _rows_of(s: dict, name: str) -> str:
    f = _policy(s, name) or {}
    seeds = sorted({r.get("seed", 0) for r in s["rows"] if r.get("policy") == name})
    return f"rows policy={name}, γ={f.get('gamma')}, seeds {seeds}"


def _ok(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _fmt(f, pct=False, signed=False) -> str:
    if f is None:
        return "not run"
    v, ci = (f.get("value"), f.get("ci")) if isinstance(f, dict) else (f, None)
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    if not _ok(v):
        return "—"
    sign = "+" if signed else ""
    body = f"{100 * v:{sign}.0f}%" if pct else f"{v:{sign}.2f}"
    if ci and all(_ok(c) for c in ci):
        body += (
            f" [{100 * ci[0]:{sign}.0f}, {100 * ci[1]:{sign}.0f}]"
            if pct
            else f" [{ci[0]:{sign}.2f}, {ci[1]:{sign}.2f}]"
        )
    return body


def figure(s: dict | None, name: str, key: str) -> dict | None:
    """A policy's figure {'value', 'ci', 'source'} from a side; None when not run. `key`
    'primary' is the side's primary throughput figure."""
    if s is None:
        return None
    if key == "primary":
        key = _PRIMARY[s["primary"]][0]
    f = _policy(s, name)
    if f is None:
        return None
    g = f.get(key) or {"value": None, "ci": None}
    base = key.split(":", 1)[0]
    src = SOURCES.get(base, key)
    if base == "alpha":
        i = list(s["rows"][0]["pairing"]).index(key.split(":", 1)[1])
        src = src.replace("[:, i]", f"[:, {i}]")
    best = (s["summary"].get("best_single") or {}).get("drafter")
    src = src.replace("<best>", str(best))
    return {"value": g.get("value"), "ci": g.get("ci"), "source": f"{_rows_of(s, name)}: {src}"}


def effect(s: dict | None, label: str, key: str) -> dict | None:
    """A paired effect {'value', 'ci', 'distinguishable', 'source'}; None when not run."""
    if s is None:
        return None
    if key == "primary":
        key = _PRIMARY[s["primary"]][0]
    e = (s["summary"].get("effects") or {}).get(label)
    if e is None or e.get(key) is None:
        return None
    a, b = _effect_pair(label)
    return dict(
        e[key],
        source=f"{key} of {_rows_of(s, a)} minus that of {_rows_of(s, b)}, paired bootstrap",
    )


def _effect_pair(label: str) -> tuple[str, str]:
    for sw in SWITCHES:
        if label == f"adding {sw} to naive":
            return f"naive_plus_{sw}", "naive"
        if label == f"removing {sw} from all_on":
            return f"all_on_minus_{sw}", "all_on"
    a, _, b = label.partition(" vs ")
    return a, b


def _step_breakdown(rows: list[dict], name: str, fig: dict) -> dict:
    """A policy's steps at its best γ from the rows' branch_records[].decision: steps
    committed, steps fallen back and, per fallen-back step, the reason every branch gave
    (or 'mixed'); branch decisions by reason; the share of branches with s < i."""
    sel = [r for r in rows if r.get("policy") == name and r.get("gamma") == fig.get("gamma")]
    recs = [(r.get("seed", 0), b) for r in sel for b in r.get("branch_records") or []]
    if not recs:
        return {"router": True, "steps": int(sum(sum(r["per_plan"]["steps"]) for r in sel))}
    by_step = collections.defaultdict(list)
    for seed, b in recs:
        by_step[(seed, b.get("plan"), b.get("step"))].append(b.get("decision"))
    steps = len(by_step)
    commit = sum(any(d is True for d in ds) for ds in by_step.values())
    reasons = collections.Counter()
    for ds in by_step.values():
        if any(d is True for d in ds):
            continue
        kinds = {_REASON.get(d, str(d)) for d in ds}
        reasons[kinds.pop() if len(kinds) == 1 else "mixed"] += 1
    branches = collections.Counter(
        _REASON.get(b.get("decision"), str(b.get("decision"))) for _, b in recs
    )
    si = [(b.get("s"), b.get("i")) for _, b in recs if _ok(b.get("s")) and _ok(b.get("i"))]
    return {
        "router": False,
        "steps": steps,
        "commit": commit,
        "fallback": steps - commit,
        "fallback_reasons": dict(reasons),
        "branches": len(recs),
        "branch_reasons": dict(branches),
        "s_below_i": (sum(s < i for s, i in si) / len(si)) if si else None,
        "s_below_i_n": len(si),
    }


# ----------------------------------------------------------------------------- claims


def _verdict_collapse(s: dict | None) -> str:
    c = None if s is None else s["summary"].get("claims", {}).get("collapse")
    if s is None:
        return "not run"
    if c is None:
        return "undefined"
    return "reproduced" if c["holds"] else "not reproduced"


def _alphas(s: dict | None) -> dict:
    if s is None:
        return {}
    naive = _policy(s, "naive") or {}
    return {k.split(":", 1)[1]: v for k, v in naive.items() if k.startswith("alpha:")}


def _switch_effects(s: dict | None, key: str) -> list[tuple[str, dict]]:
    out = []
    for sw in SWITCHES:
        e = effect(s, f"adding {sw} to naive", key)
        if e is not None and _ok(e.get("value")):
            out.append((sw, e))
    return out


def _largest(s: dict | None, key: str) -> tuple[str, dict] | None:
    effs = _switch_effects(s, key)
    return max(effs, key=lambda x: x[1]["value"]) if effs else None


def _claim_truncation(s: dict | None) -> str:
    """Whether truncate_and_attribute is the switch that matters: adding it to naive is
    distinguishable from zero on the primary throughput and no other switch's addition is
    larger."""
    if s is None:
        return "not run"
    effs = _switch_effects(s, "primary")
    t = dict(effs).get("truncate_and_attribute")
    if t is None:
        return "undefined (naive_plus_truncate_and_attribute or naive not run)"
    best = max(effs, key=lambda x: x[1]["value"])[0]
    if t["distinguishable"] and t["value"] > 0 and best == "truncate_and_attribute":
        return "reproduced"
    if best != "truncate_and_attribute":
        return f"not reproduced (the largest gain is {best}'s)"
    return "not reproduced (its gain is not distinguishable from zero or not positive)"


def _interval_above(f, x) -> bool | None:
    if f is None or not f.get("ci") or not all(_ok(c) for c in f["ci"]):
        return None
    return f["ci"][0] > x


def _interval_below(f, x) -> bool | None:
    if f is None or not f.get("ci") or not all(_ok(c) for c in f["ci"]):
        return None
    return f["ci"][1] < x


def _tri(b: bool | None, yes="reproduced", no="not reproduced", none="undefined") -> str:
    return none if b is None else (yes if b else no)


# ----------------------------------------------------------------------------- page


def markdown(sides: dict) -> str:
    """The side-by-side page (markdown)."""
    z, r = sides.get("zoo"), sides.get("real")
    lines = [
        "# The seed's four claims on both deployments",
        "",
        "Each claim is judged on the zoo (the seed's deployment in miniature) and on the real "
        "verifier, beside the field report's figure. Each figure is a ratio of sums over the "
        "named policy's rows of `results.jsonl` at that policy's best γ (summed over seeds), "
        "with its 95% bootstrap interval over plans; the source column names the rows and "
        "fields. 'not run' means the run has no such rows.",
        "",
    ]
    lines += _provenance(sides)
    lines += _settings_table(sides)
    lines += _claim1(z, r) + _claim2(z, r) + _claim3(z, r) + _claim4(z, r)
    lines += _steps_section(sides)
    lines += _prediction(r)
    return "\n".join(lines) + "\n"


def _provenance(sides: dict) -> list[str]:
    out = []
    for k in SIDES:
        s = sides.get(k)
        if s is None:
            out.append(f"- {k}: not run.")
            continue
        v = s["version"]
        argv = " ".join(v.get("argv") or []) or "(not recorded)"
        commit = str(v.get("git_commit") or "?")[:7] + ("-dirty" if v.get("git_dirty") else "")
        out.append(
            f"- {k}: `{s['workdir']}/results.jsonl` ({len(s['rows'])} rows), run by `{argv}` "
            f"at commit `{commit}`, started {v.get('started_at', '(not recorded)')}."
        )
    return out + [""]


def _verifier(s: dict) -> str:
    cfg, inputs = s["config"], (s["rows"][0].get("inputs") or {})
    if isinstance(cfg.get("verifier"), str):
        return cfg["verifier"]
    if "smollm2" in inputs:
        g = inputs["smollm2"]
        return (
            f"SmolLM2-135M-Instruct, `{Path(str(g.get('gguf'))).name}` (sha256 "
            f"{str(g.get('gguf_sha256'))[:12]}…; rows' inputs.smollm2)"
        )
    if "zoo" in inputs:
        g = inputs["zoo"]
        return (
            f"the zoo's verifier ({g.get('source')} zoo, manifest sha256 "
            f"{str(g.get('manifest_sha256'))[:12]}…; rows' inputs.zoo)"
        )
    return f"{s['deployment']}'s verifier (not recorded in the rows)"


def regime(s: dict | None) -> str:
    """Which regime the rounds ran in, from T_score / T_step when the rows carry them."""
    if s is None:
        return "not run"
    ratios = []
    for row in s["rows"]:
        prices = row.get("prices") if isinstance(row.get("prices"), dict) else row
        ts, tt = prices.get("t_score"), prices.get("t_step")
        if _ok(ts) and _ok(tt) and tt > 0:
            ratios.append(ts / tt)
    if not ratios:
        return "not measured (the rows carry no T_score / T_step)"
    x = sum(ratios) / len(ratios)
    which = "memory-bound" if x <= MEMORY_BOUND_RATIO else "compute-bound"
    return (
        f"{which}: T_score(γ+1) / T_step = {x:.2f} (mean of {len(ratios)} rows' t_score / "
        f"t_step; memory-bound read as ≤ {MEMORY_BOUND_RATIO:g})"
    )


def _settings_table(sides: dict) -> list[str]:
    def cell(s, f):
        return "not run" if s is None else f(s)

    def cfg(key):
        def f(s):
            v = s["config"].get(key)
            return "— (not a field of this deployment)" if v is None else str(v)

        return f

    st = {k: (sides[k]["summary"]["settings"] if sides.get(k) else None) for k in SIDES}
    rows = [
        ("deployment", lambda s: s["deployment"]),
        ("verifier", _verifier),
        ("dtype", cfg("dtype")),
        ("max_len", cfg("max_len")),
        ("drafters", lambda s: " / ".join(s["rows"][0]["pairing"])),
        (
            "plans",
            lambda s: (
                f"{s['summary']['settings']['plans']} (config.plans_per_domain "
                f"{s['config'].get('plans_per_domain')})"
            ),
        ),
        ("steps per plan", cfg("plan_steps")),
        ("tokens per step (≤)", cfg("max_step_tokens")),
        ("seeds", lambda s: str(s["summary"]["settings"]["seeds"])),
        ("γ grid", lambda s: str(s["summary"]["settings"]["gammas"])),
        (
            "rule · verifier τ",
            lambda s: (
                f"{s['summary']['settings'].get('rule')} · "
                f"{s['summary']['settings'].get('verifier_temperature')}"
            ),
        ),
        (
            "step decision · boundary",
            lambda s: (
                f"`{s['config'].get('consensus')}` · {s['summary']['settings'].get('boundary')}"
            ),
        ),
        (
            "best single drafter (by cost model)",
            lambda s: "{drafter} at γ = {gamma}".format(
                **(s["summary"].get("best_single") or {"drafter": "—", "gamma": "—"})
            ),
        ),
        ("primary throughput figure", lambda s: _PRIMARY[s["primary"]][1]),
        (
            "secondary throughput figure",
            lambda s: _PRIMARY["cost" if s["primary"] == "wall" else "wall"][1],
        ),
        ("regime of the rounds", regime),
    ]
    del st
    out = ["## Settings", "", "| setting | zoo | real |", "| --- | --- | --- |"]
    for label, f in rows:
        out.append(f"| {label} | {cell(sides.get('zoo'), f)} | {cell(sides.get('real'), f)} |")
    return out + [""]


def _table(title: str, rows: list[tuple[str, object, object, str, str]]) -> list[str]:
    """rows: (figure, zoo cell, real cell, seed cell, source)."""
    out = [
        f"### {title}",
        "",
        "| figure | zoo | real | seed | source |",
        "| --- | --- | --- | --- | --- |",
    ]
    for label, zc, rc, seed, src in rows:
        out.append(f"| {label} | {zc} | {rc} | {seed} | {src} |")
    return out + [""]


def _src(*figs) -> str:
    parts = []
    for k, f in zip(SIDES, figs):
        if f is not None and f.get("source"):
            parts.append(f"{k}: {f['source']}")
    return "; ".join(parts) or "—"


def _primary_label(s: dict | None) -> str:
    return "not run" if s is None else _PRIMARY[s["primary"]][1]


def _claim1(z, r) -> list[str]:
    seed = FIELD_REPORT_TABLE
    fz, fr = figure(z, "naive", "joint_acceptance"), figure(r, "naive", "joint_acceptance")
    az, ar = _alphas(z), _alphas(r)
    names = list(dict.fromkeys(list(seed["per_drafter_acceptance"]) + list(az) + list(ar)))

    def alph(a, s):
        if s is None:
            return "not run"
        return " / ".join(_fmt(a[n]) if n in a else "—" for n in names)

    rows = [
        (
            "naive joint acceptance on shared prefixes",
            _fmt(fz),
            _fmt(fr),
            f"{seed['joint_acceptance']['naive']:g}",
            _src(fz, fr),
        ),
        (
            f"per-drafter α ({' / '.join(names)}), naive rounds",
            alph(az, z),
            alph(ar, r),
            " / ".join(f"{seed['per_drafter_acceptance'].get(n, float('nan')):g}" for n in names),
            "naive rows: " + SOURCES["alpha"],
        ),
        (
            "verdict (naive joint's interval below every α)",
            _verdict_collapse(z),
            _verdict_collapse(r),
            "claimed",
            "summary claims.collapse",
        ),
    ]
    out = ["## Claim 1: the shared prefix collapses (naive joint acceptance below every α)", ""]
    out += _table("Figures", rows)
    out += [_para_collapse(z, r, fz, fr, az, ar), ""]
    return out


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


def _claim2(z, r) -> list[str]:
    lab = "adding truncate_and_attribute to naive"
    rows = []
    for key, name, pct in (
        ("primary", "Δ primary throughput vs best single", False),
        ("consensus_fallback_rate", "Δ fallback rate", True),
        ("joint_acceptance", "Δ joint acceptance", False),
    ):
        ez, er = effect(z, lab, key), effect(r, lab, key)
        rows.append(
            (
                f"{name}, {lab}",
                _fmt(ez, pct, True),
                _fmt(er, pct, True),
                "— (\"the decisive change\")",
                _src(ez, er),
            )
        )
    for key in ("primary",):
        lz, lr = _largest(z, key), _largest(r, key)

        def cell(l, s):
            if s is None:
                return "not run"
            return "—" if l is None else f"{l[0]} ({l[1]['value']:+.2f})"

        rows.append(
            (
                "switch whose addition to naive gains most (primary throughput)",
                cell(lz, z),
                cell(lr, r),
                "truncate_and_attribute",
                "summary effects 'adding <switch> to naive'",
            )
        )
    rows.append(
        (
            "verdict",
            _claim_truncation(z),
            _claim_truncation(r),
            "claimed",
            "Δ primary throughput distinguishable, > 0 and the largest",
        )
    )
    out = ["## Claim 2: truncate-and-attribute is the invariant that matters", ""]
    out += _table(
        "Figures (primary throughput: zoo "
        + _primary_label(z)
        + ", real "
        + _primary_label(r)
        + ")",
        rows,
    )
    out += [_para_truncation(z, r), ""]
    return out


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


def _claim3(z, r) -> list[str]:
    seed = FIELD_REPORT_TABLE
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
            fz, fr = figure(z, pol, key), figure(r, pol, key)
            seed_cell = f"~{100 * sv[pol]:.0f}%" if pct else f"{sv[pol]:g}"
            rows.append((f"{label}, {pol}", _fmt(fz, pct), _fmt(fr, pct), seed_cell, _src(fz, fr)))
        for k, s in (("zoo", z), ("real", r)):
            verdicts.setdefault(k, {})[key] = _recovery(s, key)
    for key, label in (
        ("joint_acceptance", "joint rises"),
        ("consensus_fallback_rate", "fallback drops"),
        ("primary", "throughput > 1× and above naive"),
    ):
        rows.append(
            (
                f"verdict: {label}",
                verdicts["zoo"][key],
                verdicts["real"][key],
                "claimed",
                "intervals of the two rows above",
            )
        )
    out = ["## Claim 3: the seed's recovery (naive → all on)", ""]
    out += _table(
        "Figures (primary throughput: zoo "
        + _primary_label(z)
        + ", real "
        + _primary_label(r)
        + ")",
        rows,
    )
    out += [_para_recovery(z, r, verdicts), ""]
    return out


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


def _claim4(z, r) -> list[str]:
    rows = []
    for pol in ("auto", "oracle", "all_on"):
        fz, fr = figure(z, pol, "primary"), figure(r, pol, "primary")
        seed = (
            f"{FIELD_REPORT_TABLE['throughput_ratio_vs_single']['all_on']:g} (all on)"
            if pol == "all_on"
            else "—"
        )
        rows.append(
            (f"{pol}: primary throughput vs best single", _fmt(fz), _fmt(fr), seed, _src(fz, fr))
        )
    ez, er = effect(z, "auto vs oracle", "primary"), effect(r, "auto vs oracle", "primary")
    rows.append(
        ("auto − oracle (paired)", _fmt(ez, signed=True), _fmt(er, signed=True), "—", _src(ez, er))
    )
    rows.append(
        (
            "verdict: auto beats the best single drafter",
            _auto_verdict(z),
            _auto_verdict(r),
            "1.7× claimed (for all on)",
            "auto's interval vs 1",
        )
    )
    out = ["## Claim 4: routing (`auto`) vs the best single drafter", ""]
    out += _table(
        "Figures (primary throughput: zoo "
        + _primary_label(z)
        + ", real "
        + _primary_label(r)
        + ")",
        rows,
    )
    out += [_para_auto(z, r), ""]
    return out


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


def _steps_section(sides) -> list[str]:
    out = [
        "## The step decisions, per deployment",
        "",
        "From the rows' `branch_records[].decision` (the decision the run made), grouped by "
        "(seed, plan, step) at each policy's best γ: a step commits when some branch decided "
        "True; a fallen-back step is listed under the reason all its branches gave ('mixed' "
        "when they differ). Routers (`auto`, `oracle`) make no step decision.",
        "",
    ]
    for k in SIDES:
        s = sides.get(k)
        out += [f"### {k}" + ("" if s is None else f" ({s['deployment']})"), ""]
        if s is None:
            out += ["not run", ""]
            continue
        out += [
            "| policy | steps | commit | fall back | of which: below floor / above depth "
            "ceiling / gain ≤ overhead / mixed | branch decisions: True / gain ≤ overhead / "
            "below floor / above depth ceiling | branches with s < i |",
            "| --- | --- | --- | --- | --- | --- | --- |",
        ]
        for name, sd in s["steps"].items():
            if sd.get("router"):
                what = "router" if policy_names.is_router(name) else "no branch records"
                out.append(f"| {name} | {sd['steps']} | {what} | — | — | — | — |")
                continue
            fr, br, n = sd["fallback_reasons"], sd["branch_reasons"], sd["steps"]
            sb = sd["s_below_i"]
            out.append(
                f"| {name} | {n} | {sd['commit']} ({sd['commit'] / n:.0%}) | {sd['fallback']} "
                f"({sd['fallback'] / n:.0%}) | "
                + " / ".join(
                    str(fr.get(x, 0))
                    for x in ("below floor", "above depth ceiling", "gain ≤ overhead", "mixed")
                )
                + " | "
                + " / ".join(
                    str(br.get(x, 0))
                    for x in ("True", "gain ≤ overhead", "below floor", "above depth ceiling")
                )
                + " | "
                + ("—" if sb is None else f"{sb:.0%} of {sd['s_below_i_n']}")
                + " |"
            )
        out.append("")
    return out


# ----------------------------------------------------------------------------- prediction


def prediction_checks(s: dict | None) -> list[dict]:
    """The held-out prediction's parts, each {'part', 'predicted', 'measured', 'agree'}
    (agree: True / False / None when the rows cannot decide it)."""
    if s is None:
        return []
    out = []
    st = s["steps"]

    def fb(name):
        f = figure(s, name, "consensus_fallback_rate")
        return None if f is None or not _ok(f.get("value")) else f

    f = fb("naive")
    out.append(
        {
            "part": "naive falls back ~100%",
            "predicted": f"fallback rate ≥ {NEAR_ALL:.0%}",
            "measured": "not run" if f is None else _fmt(f, True) + f" ({_rows_of(s, 'naive')})",
            "agree": None if f is None else f["value"] >= NEAR_ALL,
        }
    )
    sd = st.get("naive") or {}
    sb = sd.get("s_below_i")
    br = sd.get("branch_reasons") or {}
    out.append(
        {
            "part": "by construction: in a naive block s < i",
            "predicted": f"s < i on ≥ {NEAR_ALL:.0%} of naive branches",
            "measured": "not run"
            if sb is None
            else f"s < i on {sb:.0%} of {sd['s_below_i_n']} branches; their recorded decisions: "
            + ", ".join(f"{k} {v}" for k, v in sorted(br.items())),
            "agree": None if sb is None else sb >= NEAR_ALL,
        }
    )
    f = fb("all_on")
    a = _policy(s, "all_on") or {}
    shared = a.get("shared_rounds")
    out.append(
        {
            "part": "all-on falls back while the 0.35-nat ceiling isolates drafters",
            "predicted": f"all_on: no shared round and fallback rate ≥ {NEAR_ALL:.0%}",
            "measured": "not run"
            if f is None
            else f"shared rounds {shared}, KL max {_fmt(a.get('kl_max'))} vs ceiling "
            f"{a.get('kl_ceiling')}; fallback {_fmt(f, True)}",
            "agree": None if f is None else (shared == 0 and f["value"] >= NEAR_ALL),
        }
    )
    switch_pols = [
        n
        for n in s["summary"]["policies"]
        if not policy_names.is_router(n) and policy_names.single_drafter(n) is None
    ]
    predicted, commits, falls, open_ = set(), set(), set(), set()
    for n in switch_pols:
        p = policy_names.parse(n)
        if p.truncate_and_attribute and p.kl_ceiling is None:
            predicted.add(n)
        f = fb(n)
        if f is None:
            continue
        steps = (st.get(n) or {}).get("steps")
        if f["value"] >= NEAR_ALL:
            falls.add(n)
        elif _interval_below(f, NEAR_ALL):
            commits.add(n)
        else:
            open_.add(f"{n} ({_fmt(f, True)} fallback, {steps} steps)")
    extra, missing = sorted(commits - predicted), sorted(predicted & falls)
    decided = not open_ and predicted <= commits
    undecided = (
        f"; not decided at this sample size (interval reaches {NEAR_ALL:.0%}): "
        + ", ".join(sorted(open_))
        if open_
        else ""
    )
    agree = False if extra or missing else (True if decided else None)
    out.append(
        {
            "part": "only truncation commits",
            "predicted": "the policies that commit (fallback < "
            f"{NEAR_ALL:.0%}) are those with truncate_and_attribute on and no KL ceiling: "
            + (", ".join(sorted(predicted)) or "none run"),
            "measured": f"commit (interval below {NEAR_ALL:.0%}): "
            + (", ".join(sorted(commits)) or "none")
            + undecided,
            "agree": None if not switch_pols else agree,
            "extra": extra,
            "missing": missing,
        }
    )
    return out


def _prediction(r) -> list[str]:
    out = ["## The held-out prediction, checked on the real deployment", ""]
    if r is None:
        return out + ["not run (no real deployment's rows)", ""]
    out += [
        f"Prediction (issue history, made before the run): \"{PREDICTION}\". Read as the "
        f"parts below, with \"~100%\" as ≥ {NEAR_ALL:.0%} (`seed_compare.NEAR_ALL`).",
        "",
        "| part | predicted | measured | agree |",
        "| --- | --- | --- | --- |",
    ]
    checks = prediction_checks(r)
    for c in checks:
        out.append(
            f"| {c['part']} | {c['predicted']} | {c['measured']} | "
            f"{_tri(c['agree'], 'yes', 'no', 'undecided')} |"
        )
    out.append("")
    wrong = [c for c in checks if c["agree"] is False]
    if not wrong:
        out.append("Every part the rows can decide agrees with the prediction.")
    for c in wrong:
        why = ""
        if c.get("extra") or c.get("missing"):
            why = (
                f" (commits although not predicted to: {', '.join(c['extra']) or 'none'}; "
                f"predicted to commit but falls back: {', '.join(c['missing']) or 'none'})"
            )
        out.append(
            f"- **{c['part']}**: the rows record {c['measured']}{why}. The rows are the "
            "measurement, so on this part the prediction is wrong (for this run's plans and "
            "seeds; the step counts say how many steps it rests on)."
        )
    n = r["steps"].get("naive") or {}
    nb = n.get("branch_reasons") or {}
    if nb and checks and checks[1]["agree"] and nb.get("gain ≤ overhead", 0) < sum(nb.values()):
        top = max(nb.items(), key=lambda x: x[1])
        out.append(
            f"- The mechanism differs in detail: s < i holds, but the decision the seed's "
            f"function records for most naive branches is '{top[0]}' ({top[1]} of "
            f"{sum(nb.values())}), since its floor and depth checks raise before the gain "
            "is compared."
        )
    return out + [""]


# ----------------------------------------------------------------------------- build


def build(zoo: dict | None, real: dict | None, single_markdown: str | None = None) -> str:
    """The page; `single_markdown` (the --workdir run's own seed_report.md) follows it,
    its headings one level down, so one seed_report.md holds both."""
    page = markdown({"zoo": zoo, "real": real})
    if single_markdown:
        lines = single_markdown.splitlines()
        title = lines[0].lstrip("# ") if lines and lines[0].startswith("# ") else ""
        body = ["#" + ln if ln.startswith("#") else ln for ln in lines[1:]]
        page += (
            "\n## This run's own table"
            + (f": {title}" if title else "")
            + "\n"
            + "\n".join(body)
            + "\n"
        )
    return page
