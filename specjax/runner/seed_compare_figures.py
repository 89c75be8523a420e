"""The side-by-side page's inputs and figures (`runner.seed_compare`): one deployment's
column (`side`, `pair`), each figure and paired effect with the rows it comes from
(`figure`, `effect`), the step decisions per policy, and the verdicts the claims are read
with. `seed_compare` builds the page from them; its names are importable from there.
"""

from __future__ import annotations

import collections
import math

from specjax.errors import ConfigError
from specjax.policy.switches import SWITCHES
from specjax.runner.regime import (  # noqa: F401  (re-exported)
    MEMORY_BOUND_RATIO,
    WALL_CLOCK_PRIMARY,
    primary_figure,
    regime_ratio,
    wall_drift,
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
    primary = primary_figure(deployment, regime_ratio(rows), wall_drift(rows))
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


def arrange(given: list[dict | None]) -> dict:
    """The page's columns from the runs in the order given (--workdir's first, then each
    --compare_with): {'zoo': side, 'real': side} (`pair`) when they are at most one zoo-kind
    and one real run, else 'zoo' (the zoo-kind run, or None) first and then one column per
    real deployment, keyed by its kind (`smollm2`, `gemma3`, `hf`), in the order given.
    ConfigError (naming --compare_with and the run) for two zoo-kind runs or two runs of
    one real deployment."""
    runs = [s for s in given if s is not None]
    real = [s for s in runs if kind(s["deployment"]) == "real"]
    if len(real) <= 1:
        return pair(*(runs + [None, None])[:2]) if len(runs) <= 2 else _dup_zoo(runs)
    zoo = [s for s in runs if kind(s["deployment"]) == "zoo"]
    if len(zoo) > 1:
        _dup_zoo(runs)
    out = {"zoo": zoo[0] if zoo else None}
    for s in real:
        if s["deployment"] in out:
            raise ConfigError.invalid(
                "--compare_with",
                s["workdir"] or s["deployment"],
                "runs of different deployments (one column each: zoo, "
                f"{', '.join(WALL_CLOCK_PRIMARY)}); two are deployment={s['deployment']!r}",
            )
        out[s["deployment"]] = s
    return out


def _dup_zoo(runs: list[dict]):
    zoo = [s for s in runs if kind(s["deployment"]) == "zoo"]
    s = zoo[-1]
    raise ConfigError.invalid(
        "--compare_with",
        s["workdir"] or s["deployment"],
        "at most one run on a zoo-kind deployment (not "
        f"{', '.join(WALL_CLOCK_PRIMARY)}); "
        f"{len(zoo)} are: {', '.join(repr(z['deployment']) for z in zoo)}",
    )


def legacy(sides: dict) -> bool:
    """Whether `sides` is the two-deployment page (zoo | real)."""
    return list(sides) == list(SIDES)


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
