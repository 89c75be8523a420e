"""The seed's table (SPEC §8) beside the measured one, with intervals, the ablation, `auto`.

Written by the `plans` experiment's finalize hook when `config.seed_table` is set:
`summary.json`, `seed_report.md` and `plots/seed_policies.png`.

How the figures are formed (SPEC §7):
  * a *unit* is a plan: its counts are summed over the grid's seeds, and every figure is a
    ratio of sums over units; 95% intervals are percentile bootstraps over units
    (`metrics.bootstrap_ci`), paired across policies (the same resampled plans), so an
    ablation effect has an interval of its own;
  * every policy is reported at its own best γ of the grid (the throughput ratio to the
    best single drafter, cost model with the deployment's c_i, decides), and so is the single-drafter
    baseline; the γ sweep shows the rest;
  * per-drafter α is Leviathan's (each chain tested alone, rule 1's test), measured on the
    naive policy's rounds, where every drafter drafts every plan.
"""

from __future__ import annotations

import collections
import json
import math
from pathlib import Path

import numpy as np

from specjax import metrics
from specjax.field_report import FIELD_REPORT_COSTS, FIELD_REPORT_TABLE
from specjax.policy import names as policy_names
from specjax.policy.counters import RunStats
from specjax.policy.summary import step_decision_figures
from specjax.policy.switches import SWITCHES
from specjax.runner import regime
from specjax.runner import rows as rows_lib

N_BOOT = 1000


def _fmt(x, pct=False, ci=None):
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "—"
    body = f"{100 * x:.0f}%" if pct else f"{x:.2f}"
    if ci and all(v is not None and math.isfinite(v) for v in ci):
        lo, hi = ci
        body += f" [{100 * lo:.0f}, {100 * hi:.0f}]" if pct else f" [{lo:.2f}, {hi:.2f}]"
    return body


def _arr(rows, key, sub=None):
    """A per-plan counter summed over the rows (seeds): f64[P, ...]."""
    out = None
    for r in rows:
        src = r["per_plan"] if sub is None else sub(r)
        x = np.asarray(src[key], np.float64)
        out = x if out is None else out + x
    return out


class _Units:
    """Per-plan sums of one policy at one γ (over seeds), and its baselines at that γ."""

    def __init__(self, rows):
        self.rows = rows
        self.p = {k: _arr(rows, k) for k in rows[0]["per_plan"]}
        names = list(rows[0]["pairing"])
        self.names = names
        self.single = {
            n: {
                k: _arr(rows, k, lambda r, n=n: r["baselines"]["single"][n])
                for k in ("tokens", "seconds", "cost")
                + tuple(k for k in _PRICED if k in rows[0]["baselines"]["single"][n])
            }
            for n in names
        }
        self.gamma = rows[0].get("gamma")

    def rate(self, key, idx=None):
        return metrics.ratio_of_sums(self.p["tokens"], self.p[key], idx)


def _single_rate(u: _Units, name, key, idx=None):
    return metrics.ratio_of_sums(u.single[name]["tokens"], u.single[name][key], idx)


def _figures(u: _Units, best_single: dict, k: int) -> dict:
    """Point estimates and bootstrap intervals of one policy's headline figures."""
    p, names = u.p, u.names

    def alpha(i):
        return lambda idx=None: metrics.ratio_of_sums(
            np.asarray(p["own_accepted"])[:, i], np.asarray(p["own_reached"])[:, i], idx
        )

    stats = {
        "joint_acceptance": (
            lambda idx=None: metrics.ratio_of_sums(p["multi_from_draft"], p["multi_reached"], idx)
        )
        if p["multi_reached"].sum()
        else None,
        "consensus_fallback_rate": lambda idx=None: metrics.ratio_of_sums(
            p["fallbacks"], p["steps"], idx
        ),
        "throughput_ratio_vs_single": lambda idx=None: _div(
            u.rate("cost", idx),
            _single_rate(best_single["cost"][0], best_single["cost"][1], "cost", idx),
        ),
        "wallclock_ratio_vs_single": lambda idx=None: _div(
            u.rate("seconds", idx),
            _single_rate(*_wall_best(best_single), "seconds", idx),
        ),
    }
    if "cost_seed" in p and best_single.get("cost_seed"):
        stats["throughput_ratio_vs_single_at_seed_sizes"] = lambda idx=None: _div(
            u.rate("cost_seed", idx),
            _single_rate(
                best_single["cost_seed"][0], best_single["cost_seed"][1], "cost_seed", idx
            ),
        )
    for i, n in enumerate(names):
        if np.asarray(p["own_reached"])[:, i].sum():
            stats[f"alpha:{n}"] = alpha(i)
    units = len(p["tokens"])
    out = {}
    for key, f in stats.items():
        if f is None:
            out[key] = {"value": None, "ci": None}
            continue
        out[key] = {"value": f(), "ci": metrics.bootstrap_ci(units, f, N_BOOT, seed=k)}
    out["gamma"] = u.gamma
    return out, stats


def _div(a: float, b: float) -> float:
    """a / b in IEEE arithmetic: a baseline rate of 0 gives inf (or nan for 0 / 0), never
    an error; a non-finite figure is reported as such."""
    with np.errstate(all="ignore"):
        return float(np.divide(np.float64(a), np.float64(b)))


def _wall_best(best_single: dict) -> tuple:
    """(units, drafter) of the best single drafter by wall clock (rows written before the
    seconds were kept per drafter fall back to the best by cost)."""
    return best_single.get("seconds") or best_single["cost"]


def _best_single(by_gamma: dict, keys=("cost", "cost_seed", "seconds")) -> dict:
    """The best single drafter over the γ grid, by cost (the deployment's c_i), by cost
    (seed sizes) and by wall clock (``seconds``: the wall-clock ratios' denominator)."""
    out = {}
    for key in keys:
        best, best_v = None, -math.inf
        for u in by_gamma.values():
            for n in u.names:
                if key not in u.single[n]:
                    continue
                v = _single_rate(u, n, key)
                if math.isfinite(v) and v > best_v:
                    best, best_v = (u, n), v
        if best is not None:
            out[key] = best
    return out


def _router_bound(best_single: dict, pools: dict | None = None) -> dict:
    """The best single drafter chosen per plan in hindsight, over the best single drafter
    for all plans: the most any router that runs one drafter per plan can gain, since it
    cannot know more than hindsight does. A plan's choice ranges over every (drafter, γ) in
    ``pools[key]`` ({γ: units}, the γ grid's) — else over the best single's γ alone — so a
    router that also picks γ is held to a bound that does too. Per throughput measure
    ('cost', 'seconds'): {'value', 'ci' (bootstrap over plans), 'choice' (what each plan
    took: the drafter, ``@γ`` when the grid has several), 'source'}; a plan's choice is its
    argmax of tokens per unit, fixed before resampling."""
    out = {}
    for key in ("cost", "seconds"):
        best = best_single.get(key)
        if best is None:
            continue
        u, name = best
        pool = (pools or {}).get(key) or {u.gamma: u}
        cands = [
            (g, n, v)
            for g, v in sorted(pool.items(), key=lambda x: (x[0] is None, x[0]))
            for n in v.names
            if key in v.single[n]
        ]
        tok = np.stack([np.asarray(v.single[n]["tokens"], np.float64) for _, n, v in cands])
        den = np.stack([np.asarray(v.single[n][key], np.float64) for _, n, v in cands])
        pick = np.argmax(tok / np.maximum(den, 1e-300), axis=0)  # [P] over the candidates
        cols = np.arange(tok.shape[1])
        t_pick, d_pick = tok[pick, cols], den[pick, cols]
        several = len({g for g, _, _ in cands}) > 1

        def f(idx=None, t_pick=t_pick, d_pick=d_pick, u=u, name=name, key=key):
            return _div(metrics.ratio_of_sums(t_pick, d_pick, idx), _single_rate(u, name, key, idx))

        unit = "baselines.single" if pools is None or key == "cost" else "single:<drafter> cells"
        out[key] = {
            "value": f(),
            "ci": metrics.bootstrap_ci(len(t_pick), f, N_BOOT, seed=7),
            "choice": [f"{cands[i][1]}@{cands[i][0]}" if several else cands[i][1] for i in pick],
            "versus": name,
            "gamma": u.gamma,
            "gammas": sorted({g for g, _, _ in cands}, key=lambda g: (g is None, g)),
            "source": f"Σ over plans of {unit}.<argmax per plan over drafter and γ>.tokens / "
            f".{key} ÷ the same of {name} (γ={u.gamma})",
        }
    return out


#: Per-plan totals a row may carry beside ``cost``: the seed sizes' and a `reprice`'s.
_PRICED = ("cost_seed", "cost_repriced")


class _Cells:
    """The `single:<drafter>` cells of one γ in `_Units`' shape (``names``, ``single``,
    ``gamma``): each drafter's per-plan tokens and seconds summed over seeds, as its cell
    measured them."""

    def __init__(self, gamma, rows_by_name: dict):
        self.gamma = gamma
        self.names = list(rows_by_name)
        self.single = {
            n: {k: _arr(rows, k) for k in ("tokens", "seconds")} for n, rows in rows_by_name.items()
        }


def _single_cells(groups) -> dict:
    """{γ: _Cells} of the run's single-drafter cells (empty when it has none)."""
    out = collections.defaultdict(dict)
    for name, per_gamma in groups.items():
        d = policy_names.single_drafter(name)
        if d is None:
            continue
        for g, rows in per_gamma.items():
            out[g][d] = rows
    return {g: _Cells(g, by) for g, by in out.items()}


def _group(results):
    """{policy: {γ: [rows over seeds]}} for the rows of the seed pairing."""
    groups = collections.defaultdict(lambda: collections.defaultdict(list))
    for r in results:
        groups[r["policy"]][r.get("gamma")].append(r)
    return groups


def write(config, workdir: Path, results: list[dict]) -> dict:
    """Builds summary.json, seed_report.md and the plot from the run's result rows."""
    built = build(config, results)
    if built is None:
        return {}
    commit(workdir, built)
    print(built["markdown"])
    return built["summary"]


def build(config, results: list[dict]) -> dict | None:
    """The seed table's files, in memory: {'summary', 'markdown', 'plot' (PNG bytes)}; None
    when no row is a `plans` row. Nothing is written, so a caller can build every output
    before it writes any (`specjax.report`)."""
    results = [r for r in results if isinstance(r, dict) and "per_plan" in r]
    if not results:
        return None
    groups = _group(results)
    baselines = _baselines(groups)
    best_single = _best_single(baselines)
    # Wall clock: where the run has `single:<drafter>` cells, the denominator is the best of
    # those (timed like every other cell, in turn), not the baselines (timed first, with
    # the first cell: a process's first runs of its programs and any load it started under).
    single_cells = _single_cells(groups)
    cells = _best_single(single_cells, keys=("seconds",))
    if cells:
        best_single["seconds"] = cells["seconds"]
    pools = {"cost": baselines, "seconds": single_cells if cells else baselines}
    # Each policy is reported at its best γ by the run's primary figure (wall clock where
    # the rounds were measured memory-bound on a steady machine, else the cost model), as
    # the best single drafter is by each measure: a router and the singles compared alike.
    primary = regime.primary_figure(
        config.get("deployment"), regime.regime_ratio(results), regime.wall_drift(results)
    )
    by = "wallclock_ratio_vs_single" if primary == "wall" else "throughput_ratio_vs_single"
    policies, fns = {}, {}
    ordered = sorted(groups.items(), key=lambda x: policy_names.order_key(x[0]))
    for k, (name, per_gamma) in enumerate(ordered):
        policies[name], fns[name] = _policy_figures(config, per_gamma, best_single, k, by)
    effects = _effects(policies, fns)
    bs = best_single.get("cost")
    bw = best_single.get("seconds")
    summary = {
        "seed": FIELD_REPORT_TABLE,
        "seed_costs": FIELD_REPORT_COSTS,
        "policies": policies,
        "effects": effects,
        "best_single": {"drafter": bs[1], "gamma": bs[0].gamma} if bs else None,
        "best_single_wall": (
            {"drafter": bw[1], "gamma": bw[0].gamma, "from": "cells" if cells else "baselines"}
            if bw
            else None
        ),
        "router_bound": _router_bound(best_single, pools),
        "claims": _claims(policies),
        "settings": _settings(config, results),
    }
    from specjax.runner import seed_report  # pylint: disable=import-outside-toplevel

    return {
        "summary": summary,
        "summary_json": json.dumps(summary, indent=2, default=_json) + "\n",
        "markdown": seed_report.markdown(summary),
        "plot": seed_report.render(policies),
    }


def _baselines(groups: dict) -> dict:
    """γ -> the single-drafter baselines' units (the same in every policy's rows)."""
    by_gamma = {g: _Units(rows) for g, rows in next(iter(groups.values())).items()}
    # Baselines of every γ are the same in every policy's rows: take them from any policy.
    for pol in groups.values():
        for g, rows in pol.items():
            by_gamma.setdefault(g, _Units(rows))
    return by_gamma


def _policy_figures(
    config, per_gamma: dict, best_single: dict, k: int, by: str = "throughput_ratio_vs_single"
) -> tuple[dict, tuple]:
    """A policy's figures at its best γ by figure ``by``, and (its per-plan figures, plans)
    for the effects."""
    cands = {g: _Units(rows) for g, rows in per_gamma.items()}
    scored = {g: _figures(u, best_single, k) for g, u in cands.items()}
    g_best = max(scored, key=lambda g: _nan_low(scored[g][0][by]["value"]))
    fig, fn = scored[g_best]
    fig["by_gamma"] = {
        str(g): scored[g][0]["throughput_ratio_vs_single"]["value"] for g in sorted(scored)
    }
    fig["by_gamma_wall"] = {
        str(g): scored[g][0]["wallclock_ratio_vs_single"]["value"] for g in sorted(scored)
    }
    fig["gamma_chosen_by"] = by
    fig.update(_decision_figures(config, cands[g_best].rows))
    fig.update(_row_figures(cands[g_best].rows))
    return fig, (fn, len(cands[g_best].p["tokens"]))


def _decision_figures(config, rows: list[dict]) -> dict:
    """The step decisions replayed, the quorum's fallback rate and the thresholds of rows."""
    recs = []
    for r in rows:
        recs += [dict(b, seed=r.get("seed", 0)) for b in r.get("branch_records", [])]
    st = RunStats(k=1, gamma=1)
    st.branch_records = recs
    st.step_records = [s for r in rows for s in r.get("step_records", [])]
    thresholds = rows_lib.thresholds(rows[0], config)
    fig = {}
    try:
        fig["step_decision"] = step_decision_figures(st, thresholds)
    except (ValueError, TypeError, KeyError) as e:
        # Records the boundary cannot replay (a non-finite s_b or d_b): the figures
        # are left out, and why is in summary.json.
        fig["step_decision"] = {"not_replayable": " ".join(str(e).split())[:300]}
    sup = [s["quorum_support"] for s in st.step_records]
    fig["fallback_rate_quorum"] = (
        float(np.mean(np.asarray(sup) < config.get("consensus_threshold", 0.5))) if sup else None
    )
    fig["kl_ceiling"] = rows_lib.kl_ceiling(rows[0])
    fig["thresholds"] = thresholds.kwargs()
    return fig


def _row_figures(rows: list[dict]) -> dict:
    """The rows' worst KL and TV, mean truncation depth, coupled match rate, shared rounds."""
    shared = sum(_numbers(r.get("shared_rounds", 0) for r in rows))
    return {
        "kl_max": _max(r.get("kl_max") for r in rows),
        "kl_outside_mass": _max(r.get("kl_outside_mass") for r in rows),
        "mean_truncation_depth": _mean(r.get("mean_truncation_depth") for r in rows),
        "tv_distance": _max(r.get("tv_distance") for r in rows),
        "coupled_match_rate": rows[0].get("coupled_match_rate"),
        "shared_rounds": int(shared) if math.isfinite(shared) else shared,
    }


def _settings(config, results: list[dict]) -> dict:
    """The run's settings that the seed table reports next to its figures."""
    return {
        "seeds": sorted({r.get("seed", 0) for r in results}),
        "plans": len(results[0]["per_plan"]["tokens"]),
        **{
            k: config.get(k)
            for k in (
                "deployment",
                "dtype",
                "max_len",
                "plans_per_domain",
                "plan_steps",
                "max_step_tokens",
                "consensus",
                "consensus_threshold",
                "consensus_cost",
                "share_verifier_call",
            )
        },
        "boundary": rows_lib.thresholds(results[0], config).kwargs(),
        "gammas": sorted({r.get("gamma") for r in results}),
        "verifier_temperature": results[0].get("verifier_temperature"),
        "rule": results[0].get("rule"),
        "drafter_temperatures": results[0].get("drafter_temperatures"),
        "drafter_costs": results[0].get("drafter_costs"),
        "regime": regime.regime_ratio(results),  # (T_score(γ+1)/T_step, rows, padded rows)
        "wall_drift": regime.wall_drift(results),  # drafter → own cell's rate ÷ baseline's
    }


def commit(workdir: Path, built: dict) -> None:
    """Writes what `build` made: summary.json, seed_report.md, plots/seed_policies.png."""
    workdir = Path(workdir)
    _atomic(workdir / "summary.json", built["summary_json"])
    _atomic(workdir / "seed_report.md", built["markdown"])
    (workdir / "plots").mkdir(exist_ok=True)
    _atomic(workdir / "plots" / "seed_policies.png", built["plot"])


def _json(x):
    if isinstance(x, (np.floating, np.integer)):
        return x.item()
    return str(x)


def _nan_low(x):
    return x if x is not None and math.isfinite(x) else -math.inf


def _numbers(xs) -> list[float]:
    """The numbers among `xs` as floats, finite or not (a non-finite figure is reported
    as such: nan / inf in summary.json and seed_report.md)."""
    out = []
    for x in xs:
        if isinstance(x, (int, float)) and not isinstance(x, bool):
            try:
                out.append(float(x))
            except OverflowError:
                out.append(math.inf if x > 0 else -math.inf)
    return out


def _max(xs):
    xs = _numbers(xs)
    if any(math.isnan(x) for x in xs):
        return math.nan
    return max(xs) if xs else None


def _mean(xs):
    xs = _numbers(xs)
    return sum(xs) / len(xs) if xs else None


def _effects(policies, fns) -> dict:
    """Each invariant's effect (removed from all-on; added to naive) on the headline figures,
    with paired bootstrap intervals (same resampled plans for both policies)."""
    out = {}
    pairs = {}
    for s in SWITCHES:
        pairs[f"removing {s} from all_on"] = (f"all_on_minus_{s}", "all_on")
        pairs[f"adding {s} to naive"] = (f"naive_plus_{s}", "naive")
    autos = [r for r in policy_names.ROUTERS if r.startswith("auto")]
    for a in autos:
        pairs[f"{a} vs all_on"] = (a, "all_on")
        pairs[f"{a} vs oracle"] = (a, "oracle")
    # Teacher-forced scores against exploration (issue 52): the same router, scored two ways.
    pairs["auto:teacher_forced vs auto:own"] = ("auto:teacher_forced", "auto:own")
    for label, (a, b) in pairs.items():
        if a not in fns or b not in fns or fns[a][1] != fns[b][1]:
            continue
        fa, fb = fns[a][0], fns[b][0]
        units = fns[a][1]
        eff = {}
        for key in (
            "throughput_ratio_vs_single",
            "wallclock_ratio_vs_single",
            "consensus_fallback_rate",
            "joint_acceptance",
        ):
            if fa.get(key) is None or fb.get(key) is None:
                continue

            def d(idx=None, ka=fa[key], kb=fb[key]):
                return ka(idx) - kb(idx)

            v = d()
            ci = metrics.bootstrap_ci(units, d, N_BOOT, seed=17)
            eff[key] = {
                "value": v,
                "ci": ci,
                "distinguishable": bool(ci[0] > 0 or ci[1] < 0)
                if all(math.isfinite(c) for c in ci)
                else False,
            }
        out[label] = eff
    return out


def _val(policies, name, key):
    f = policies.get(name, {}).get(key)
    return None if f is None else f.get("value")


def _ci(policies, name, key):
    f = policies.get(name, {}).get(key)
    return None if f is None else f.get("ci")


def _claims(policies) -> dict:
    """The seed's four claims, each judged from the intervals of this run."""
    out = {}
    n, a = policies.get("naive"), policies.get("all_on")
    if not n or not a:
        return out
    alphas = [v["value"] for k, v in n.items() if k.startswith("alpha:") and v["value"]]
    j_n, j_n_ci = (
        _val(policies, "naive", "joint_acceptance"),
        _ci(policies, "naive", "joint_acceptance"),
    )
    if j_n is not None and alphas:
        out["collapse"] = {
            "holds": bool(j_n_ci and j_n_ci[1] < min(alphas)),
            "text": f"naive joint acceptance {j_n:.2f} [{j_n_ci[0]:.2f}, {j_n_ci[1]:.2f}] vs "
            f"per-drafter α {' / '.join(f'{x:.2f}' for x in alphas)} (product "
            f"{float(np.prod(alphas)):.3f})",
        }
    j_a, j_a_ci = (
        _val(policies, "all_on", "joint_acceptance"),
        _ci(policies, "all_on", "joint_acceptance"),
    )
    if j_a is None:
        out["joint_recovery"] = {
            "holds": None,
            "text": "all-on shares no prefix (every "
            "sharing set has one drafter): joint acceptance is undefined",
        }
    elif j_n is not None:
        out["joint_recovery"] = {
            "holds": bool(j_a_ci[0] > j_n_ci[1]),
            "text": f"all-on {j_a:.2f} [{j_a_ci[0]:.2f}, {j_a_ci[1]:.2f}] vs naive {j_n:.2f}",
        }
    f_n, f_a = (_val(policies, x, "consensus_fallback_rate") for x in ("naive", "all_on"))
    c_n, c_a = (_ci(policies, x, "consensus_fallback_rate") for x in ("naive", "all_on"))
    if f_n is not None and f_a is not None:
        out["fallback_drop"] = {
            "holds": bool(c_a[1] < c_n[0]),
            "text": f"fallback naive {100 * f_n:.0f}% → all-on {100 * f_a:.0f}%",
        }
    t_n, t_a = (_val(policies, x, "throughput_ratio_vs_single") for x in ("naive", "all_on"))
    c_ta = _ci(policies, "all_on", "throughput_ratio_vs_single")
    if t_n is not None and t_a is not None:
        out["throughput"] = {
            "holds": bool(c_ta[0] > 1.0 and t_a > t_n),
            "text": f"throughput vs best single: naive {t_n:.2f}×, all-on "
            f"{t_a:.2f}× [{c_ta[0]:.2f}, {c_ta[1]:.2f}]",
        }
    return out


def _atomic(path: Path, data: str | bytes) -> None:
    """`data` into `path` atomically (`specjax.runner.results`: a temporary file beside it,
    then a rename)."""
    from specjax.runner import results  # pylint: disable=import-outside-toplevel

    if isinstance(data, bytes):
        results.atomic_write_bytes(path, data)
    else:
        results.atomic_write_text(path, data)
