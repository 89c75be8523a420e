"""The seed's four claims judged on each deployment, side by side: zoo | real | seed, or
zoo | each real deployment | seed.

  python -m specjax.report --workdir=runs/seed_reproduction_real --compare_with=runs/seed_reproduction
  python -m specjax.report --workdir=runs/seed_reproduction_gemma3 \
      --compare_with=runs/seed_reproduction,runs/seed_reproduction_real

With one zoo-kind run and one real run the page has the columns zoo and real; with more
than one real deployment ('smollm2', 'gemma3', 'hf') it has 'zoo' and a column per real
deployment, keyed by its kind (`arrange`), the held-out prediction checked on each, and the
section "What real cross-family heterogeneity changes" (`seed_compare_multi`).

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

from specjax.policy import names as policy_names
from specjax.runner import deployments, seed_compare_heterogeneity
from specjax.runner.regime import drift_excessive
from specjax.runner.seed_compare_claims import _claim1, _claim2, _claim3, _claim4
from specjax.runner.seed_compare_figures import (
    _PRIMARY,
    MEMORY_BOUND_RATIO,
    SIDES,
    SOURCES,
    _fmt,
    _interval_below,
    _ok,
    _policy,
    _rows_of,
    _tri,
    arrange,
    effect,
    figure,
    kind,
    legacy,
    pair,
    regime_ratio,
    side,
)

#: The page's API (its inputs and figures live in seed_compare_figures, its claim sections in
#: seed_compare_claims; specjax.report and the tests import them from here).
__all__ = [
    "MEMORY_BOUND_RATIO",
    "NEAR_ALL",
    "PREDICTION",
    "SIDES",
    "SOURCES",
    "arrange",
    "build",
    "build_sides",
    "effect",
    "figure",
    "kind",
    "markdown",
    "pair",
    "prediction_checks",
    "regime",
    "side",
]

#: The held-out prediction's "~100%": a fallback rate at or above this reads as "always".
NEAR_ALL = 0.95
#: T_score(γ+1) / T_step at or below this reads as memory-bound (scoring γ+1 tokens costs
#: about one decode step, Leviathan's regime); above it, compute-bound.
#: The held-out prediction for the real deployment, as the issue history states it.
PREDICTION = (
    "naive falls back ~100% by construction (in a naive block s < i); all-on falls back "
    "while the 0.35-nat ceiling isolates drafters; only truncation commits"
)

# ----------------------------------------------------------------------------- page


def markdown(sides: dict) -> str:
    """The side-by-side page (markdown): `sides` is {'zoo': side, 'real': side} (the
    two-deployment page) or `arrange`'s columns ('zoo', then one per real deployment)."""
    if legacy(sides):
        title, whom = "both deployments", "on the real verifier"
    else:
        title = f"{len(sides)} deployments"
        whom = "on each real verifier (" + ", ".join(k for k in sides if k != "zoo") + ")"
    lines = [
        f"# The seed's four claims on {title}",
        "",
        f"Each claim is judged on the zoo (the seed's deployment in miniature) and {whom}, "
        "beside the field report's figure. Each figure is a ratio of sums over the "
        "named policy's rows of `results.jsonl` at that policy's best γ (summed over seeds), "
        "with its 95% bootstrap interval over plans; the source column names the rows and "
        "fields. 'not run' means the run has no such rows.",
        "",
    ]
    lines += _provenance(sides)
    lines += _settings_table(sides)
    lines += _claim1(sides) + _claim2(sides) + _claim3(sides) + _claim4(sides)
    lines += _steps_section(sides)
    if legacy(sides):
        lines += _prediction(sides["real"])
    else:
        lines += ["## The held-out prediction, checked on each real deployment", ""]
        for k, s in sides.items():
            if k != "zoo":
                lines += _prediction(s, f"### {k}")
        lines += seed_compare_heterogeneity.heterogeneity(sides)
    return "\n".join(lines) + "\n"


def _provenance(sides: dict) -> list[str]:
    out = []
    for k, s in sides.items():
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
    """The run's verifier as its deployment's kind describes it (a kind no longer
    registered: not recorded)."""
    if s["deployment"] not in deployments.known():
        return f"{s['deployment']}'s verifier (not recorded in the rows)"
    inputs = s["rows"][0].get("inputs") or {}
    return deployments.get(s["deployment"]).describe_verifier(s["config"], inputs)


def regime(s: dict | None) -> str:
    """Which regime the rounds ran in, from T_score / T_step when the rows carry them
    (`seed_compare_figures.regime_ratio`)."""
    if s is None:
        return "not run"
    got = regime_ratio(s["rows"])
    if got is None:
        return "not measured (the rows carry no T_score / T_step or machine prices)"
    x, n, batches = got
    which = "memory-bound" if x <= MEMORY_BOUND_RATIO else "compute-bound"
    at = f" at {', '.join(map(str, batches))} padded rows" if batches else ""
    return (
        f"{which}: T_score(γ+1) / T_step = {x:.2f}{at} (mean over {n} rows' "
        f"`regime` or machine prices; memory-bound read as ≤ {MEMORY_BOUND_RATIO:g})"
    )


def _drift_cell(s: dict) -> str:
    """Each drafter's `single:<name>` cell rate ÷ its baseline rate (`regime.wall_drift`):
    1.00 on a steady machine; outside 1 ± WALL_DRIFT_TOLERANCE the cost model is primary."""
    drift = s["summary"]["settings"].get("wall_drift") or {}
    if not drift:
        return "— (no single-drafter cell to check against)"
    verdict = "no: the cost model is primary" if drift_excessive(drift) else "yes"
    body = ", ".join(f"{n} {d:.2f}×" for n, d in sorted(drift.items()))
    return f"{verdict} ({body})"


def _settings_table(sides: dict) -> list[str]:
    def cell(s, f):
        return "not run" if s is None else f(s)

    def cfg(key):
        def f(s):
            v = s["config"].get(key)
            return "— (not a field of this deployment)" if v is None else str(v)

        return f

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
        (
            "best single drafter (by wall clock)",
            lambda s: "{drafter} at γ = {gamma}".format(
                **(s["summary"].get("best_single_wall") or {"drafter": "—", "gamma": "—"})
            ),
        ),
        ("primary throughput figure", lambda s: _PRIMARY[s["primary"]][1]),
        (
            "secondary throughput figure",
            lambda s: _PRIMARY["cost" if s["primary"] == "wall" else "wall"][1],
        ),
        ("regime of the rounds", regime),
        ("wall clock steady over the run", _drift_cell),
    ]
    out = [
        "## Settings",
        "",
        "| setting | " + " | ".join(sides) + " |",
        "| " + " | ".join(["---"] * (len(sides) + 1)) + " |",
    ]
    for label, f in rows:
        out.append(f"| {label} | " + " | ".join(cell(s, f) for s in sides.values()) + " |")
    return out + [""]


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
    for k, s in sides.items():
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
    return [
        _naive_falls_back(s),
        _naive_s_below_i(s),
        _all_on_isolates(s),
        _only_truncation_commits(s),
    ]


def _fallback(s: dict, name: str):
    """Policy ``name``'s consensus fallback rate figure, or None where it has none."""
    f = figure(s, name, "consensus_fallback_rate")
    return None if f is None or not _ok(f.get("value")) else f


def _naive_falls_back(s: dict) -> dict:
    f = _fallback(s, "naive")
    return {
        "part": "naive falls back ~100%",
        "predicted": f"fallback rate ≥ {NEAR_ALL:.0%}",
        "measured": "not run" if f is None else _fmt(f, True) + f" ({_rows_of(s, 'naive')})",
        "agree": None if f is None else f["value"] >= NEAR_ALL,
    }


def _naive_s_below_i(s: dict) -> dict:
    sd = s["steps"].get("naive") or {}
    sb = sd.get("s_below_i")
    br = sd.get("branch_reasons") or {}
    return {
        "part": "by construction: in a naive block s < i",
        "predicted": f"s < i on ≥ {NEAR_ALL:.0%} of naive branches",
        "measured": "not run"
        if sb is None
        else f"s < i on {sb:.0%} of {sd['s_below_i_n']} branches; their recorded decisions: "
        + ", ".join(f"{k} {v}" for k, v in sorted(br.items())),
        "agree": None if sb is None else sb >= NEAR_ALL,
    }


def _all_on_isolates(s: dict) -> dict:
    f = _fallback(s, "all_on")
    a = _policy(s, "all_on") or {}
    shared = a.get("shared_rounds")
    return {
        "part": "all-on falls back while the 0.35-nat ceiling isolates drafters",
        "predicted": f"all_on: no shared round and fallback rate ≥ {NEAR_ALL:.0%}",
        "measured": "not run"
        if f is None
        else f"shared rounds {shared}, KL max {_fmt(a.get('kl_max'))} vs ceiling "
        f"{a.get('kl_ceiling')}; fallback {_fmt(f, True)}",
        "agree": None if f is None else (shared == 0 and f["value"] >= NEAR_ALL),
    }


def _commit_sets(s: dict, switch_pols: list[str]) -> tuple:
    """Of the switch policies run: those predicted to commit (truncation on, no KL
    ceiling), those that commit, those that fall back, and those not decided."""
    st = s["steps"]
    predicted, commits, falls, open_ = set(), set(), set(), set()
    for n in switch_pols:
        p = policy_names.parse(n)
        if p.truncate_and_attribute and p.kl_ceiling is None:
            predicted.add(n)
        f = _fallback(s, n)
        if f is None:
            continue
        steps = (st.get(n) or {}).get("steps")
        if f["value"] >= NEAR_ALL:
            falls.add(n)
        elif _interval_below(f, NEAR_ALL):
            commits.add(n)
        else:
            open_.add(f"{n} ({_fmt(f, True)} fallback, {steps} steps)")
    return predicted, commits, falls, open_


def _only_truncation_commits(s: dict) -> dict:
    switch_pols = [n for n in s["summary"]["policies"] if policy_names.is_switch_policy(n)]
    predicted, commits, falls, open_ = _commit_sets(s, switch_pols)
    extra, missing = sorted(commits - predicted), sorted(predicted & falls)
    decided = not open_ and predicted <= commits
    undecided = (
        f"; not decided at this sample size (interval reaches {NEAR_ALL:.0%}): "
        + ", ".join(sorted(open_))
        if open_
        else ""
    )
    agree = False if extra or missing else (True if decided else None)
    return {
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


def _prediction(r, heading="## The held-out prediction, checked on the real deployment"):
    out = [heading, ""]
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
    """The two-deployment page (zoo | real); `single_markdown` as in `build_sides`."""
    return build_sides({"zoo": zoo, "real": real}, single_markdown)


def build_sides(sides: dict, single_markdown: str | None = None) -> str:
    """The page of `sides` (`pair`'s or `arrange`'s columns); `single_markdown` (the
    --workdir run's own seed_report.md) follows it, its headings one level down, so one
    seed_report.md holds both."""
    page = markdown(sides)
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
