r"""Plan-runner wall clock against the cost model's prediction: are its ratios real here?

  python experiments/benchmark_plans.py --out runs/benchmark_plans
  python experiments/benchmark_plans.py --plans_per_domain 2 --plan_steps 2 --repeats 1
  python experiments/benchmark_plans.py --write_docs    # runs/benchmark_plans/plan_runner.md

The runner reports throughput as tokens per unit of modelled cost (`metrics.itemised_cost`,
in verifier calls: SPEC §7). This script runs the plan runner on the shipped zoo for the
verifier alone, the best single drafter, `naive`, `all_on` and `auto` (coupled rule, τ_v 1,
the runner's defaults), each warm (its programs compiled by a discarded first run; no
shared-call memo), and records per run:

  * wall: seconds of `run_plans` as a user sees them (host work included: tokenisation,
    the step decision, consensus, journaling-free);
  * engine: the compiled programs' seconds (`RunStats.seconds`, what the runner charges),
    warm, and in the first run (compilation excluded, first executions included: what one
    sweep cell measures);
  * cost: the itemised modelled cost, and its items.

One constant converts cost to seconds: the verifier alone's wall seconds per unit of cost
(its cost is verifier calls + prefills, the model's unit). Every other run's prediction is
cost × that constant; `predicted / wall` within [0.8, 1.25] means the model's ratios hold on
this machine. The same with the machine's own prices (`machine / wall`): drafter tokens at
the measured T_draft / T_step, and every draft the verifier scores at the measured
(T_score / T_step − 1) / γ (`itemised_cost(score_cost=...)`; the seed's model scores them
free, as a memory-bound accelerator does). The forwards are timed once after every timed
run and their medians taken, so the prices and the wall clocks share a time window. The
engine seconds per modelled verifier call of each run say where the seed's prices do not
hold: they price a speculative round like one autoregressive step. Prints a table, writes
``benchmark_plans.json`` under --out; ``--write_docs`` writes <docs_dir>/plan_runner.md
(``--docs_dir``, default runs/benchmark_plans: docs/results holds one page per question and
this one has none there; its figures are in docs/performance.md, run plan_runner).
About 4 minutes at the defaults on 2 idle cores (compilation included).
"""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path

import numpy as np
from absl import flags

from specjax.runner import provenance
from specjax.runner import script_flags as sf

FLAGS = flags.FLAGS
PAGE = "plan_runner"
#: Where --write_docs writes PAGE by default: not docs/results (no page of its question there).
DOCS_DIR = "runs/benchmark_plans"


def define_flags():
    """The script's flags (defined only when it runs as a script)."""
    provenance.define_common_flags(
        out="runs/benchmark_plans", repeats=2, page=PAGE, docs_dir=DOCS_DIR
    )
    flags.DEFINE_integer("plans_per_domain", 2, "plan prompts per domain (code, prose, reasoning)")
    flags.DEFINE_integer("plan_steps", 4, "steps per plan")
    flags.DEFINE_integer("max_step_tokens", 32, "token budget of a step")
    flags.DEFINE_integer("gamma", 4, "γ")
    flags.DEFINE_string("zoo", None, "zoo path (default: $SPECJAX_ZOO, else the shipped zoo)")


RUNS = ("verifier", "single", "naive", "all_on", "auto")


def validate() -> None:
    """Every flag, before anything is printed, loaded or written (`sf.run`): a
    `ConfigError` naming the flag, its value and what is allowed."""
    _, manifest = sf.zoo("--zoo", FLAGS.zoo)
    sf.integer("--plans_per_domain", FLAGS.plans_per_domain, 1, 24)
    steps = sf.integer("--plan_steps", FLAGS.plan_steps, 1, 64)
    tokens = sf.integer("--max_step_tokens", FLAGS.max_step_tokens, 1, 256)
    gamma = sf.integer("--gamma", FLAGS.gamma, 1, 64)
    max_len = int(manifest["models"]["verifier"]["config"]["max_len"])
    chains = len(manifest["drafter_order"])
    need = steps * tokens + chains * gamma + 1  # a prompt takes one position at least
    sf.check(
        need <= max_len,
        "--plan_steps / --max_step_tokens / --gamma",
        f"{steps} / {tokens} / {gamma}",
        f"a plan within the verifier's context, {max_len} positions (these need {need}: "
        f"{steps} × {tokens} step tokens, {chains} × {gamma} drafts and a prompt of one "
        "token at least)",
    )


def _run(dep, pcfg, prompts, which, costs, best):
    from specjax.policy.auto import AutoRouter  # pylint: disable=import-outside-toplevel
    from specjax.policy.plan import run_plans  # pylint: disable=import-outside-toplevel
    from specjax.policy.switches import Policy  # pylint: disable=import-outside-toplevel

    if which == "verifier":
        kw = {}
    elif which == "single":
        kw = dict(single=best)
    elif which == "auto":
        kw = dict(
            router=AutoRouter(
                costs, pcfg.gamma, seed=pcfg.seed, gammas=[d.gamma for d in dep.drafters]
            )
        )
    else:
        kw = dict(policy=Policy.from_name(which))
    t0 = time.perf_counter()
    _, stats = run_plans(dep, pcfg, prompts, **kw)
    return time.perf_counter() - t0, stats


def _plan_prompts(plans_per_domain: int) -> list[str]:
    """The first `plans_per_domain` plan prompts of every domain, domains sorted."""
    from specjax.data import load_prompts  # pylint: disable=import-outside-toplevel

    by_domain = {}
    for p in load_prompts():
        by_domain.setdefault(p["domain"], []).append(p["prompt"])
    return [t for dom in sorted(by_domain) for t in by_domain[dom][:plans_per_domain]]


def _price_timers(dep, pcfg, prompts) -> dict:
    """Forward timers at the runs' shapes: T_step ("step"), T_score ("score"), and T_draft of
    each drafter (by index)."""
    from specjax.measure.timing import forward_timer  # pylint: disable=import-outside-toplevel

    plan_steps, max_step_tokens, gamma = pcfg.plan_steps, pcfg.max_step_tokens, pcfg.gamma
    rows = 1 << max(len(prompts) - 1, 0).bit_length()
    width = max(len(dep.encode(t)) for t in prompts)
    cap = width + plan_steps * max_step_tokens + len(dep.drafters) * gamma + 1
    ctx = width + plan_steps * max_step_tokens // 2
    timers = {
        "step": forward_timer(dep.verifier, dep.v_params, rows, 1, ctx, cap),
        "score": forward_timer(dep.verifier, dep.v_params, rows, gamma + 1, ctx, cap),
    }
    for k, (d, dd) in enumerate(zip(dep.drafters, dep.d_data)):
        timers[k] = forward_timer(d.lm, dd.params, rows, 1, ctx, min(d.lm.max_len, cap))
    return timers


def _measure_run(dep, pcfg, prompts, which, repeats, timers, prices) -> dict:
    """One run, warm: wall and engine seconds (medians), first-run engine seconds, tokens and
    modelled cost; each forward timed after every timed run (into `prices`). Printed."""
    from specjax import metrics  # pylint: disable=import-outside-toplevel
    from specjax.metrics import COST_ITEMS  # pylint: disable=import-outside-toplevel

    costs = [d.cost for d in dep.drafters]
    best = int(np.argmin([c for c in costs]))  # the cheapest drafter of the zoo: code
    walls, engines = [], []
    stats = None
    for i in range(repeats + 1):  # the first run compiles
        wall, stats = _run(dep, pcfg, prompts, which, costs, best)
        if i:
            walls.append(wall)
            engines.append(float(stats.counts["seconds"].sum()))
            for k, run in timers.items():
                prices[k].append(run())
        else:  # compilation excluded, but every program's first execution included
            first_engine = float(stats.counts["seconds"].sum())
    counts = {n: stats.counts[n].sum(0) for n in COST_ITEMS}
    items = metrics.itemised_cost(counts, costs, pcfg.consensus_cost)
    row = dict(
        wall_s=statistics.median(walls),
        engine_s=statistics.median(engines),
        first_engine_s=first_engine,
        tokens=int(stats.counts["tokens"].sum()),
        cost=float(items["total"]),
        items={n: float(items[n]) for n in COST_ITEMS},
        counts={n: np.asarray(counts[n]).tolist() for n in COST_ITEMS},
    )
    print(
        f"{which:9s} wall {row['wall_s']:7.3f} s  engine "
        f"{row['engine_s']:7.3f} s  cost {row['cost']:8.1f}  tokens "
        f"{row['tokens']}",
        flush=True,
    )
    return row


def _predict(out: dict, c_measured, score_cost: float, consensus_cost) -> float:
    """Adds each run's predictions (seed prices and the machine's, scaled by the verifier
    alone's seconds per cost unit) and engine ms per verifier call; returns the seed unit."""
    from specjax import metrics  # pylint: disable=import-outside-toplevel

    unit = out["verifier"]["wall_s"] / out["verifier"]["cost"]
    for r in out.values():
        r["predicted_s"] = r["cost"] * unit
        r["predicted_over_wall"] = r["predicted_s"] / r["wall_s"]
        r["tokens_per_wall_s"] = r["tokens"] / r["wall_s"]
        r["tokens_per_cost"] = r["tokens"] / r["cost"]
        r["cost_machine"] = float(
            metrics.itemised_cost(
                {n: np.asarray(v) for n, v in r["counts"].items()},
                c_measured,
                consensus_cost,
                score_cost=score_cost,
            )["total"]
        )
    unit_m = out["verifier"]["wall_s"] / out["verifier"]["cost_machine"]
    for r in out.values():
        r["predicted_machine_s"] = r["cost_machine"] * unit_m
        r["predicted_machine_over_wall"] = r["predicted_machine_s"] / r["wall_s"]
    for r in out.values():
        calls = r["counts"]["verifier_calls"]
        r["engine_ms_per_verifier_call"] = 1e3 * r["engine_s"] / max(calls, 1)
    return unit


def measure(
    zoo=None, *, plans_per_domain=2, plan_steps=4, max_step_tokens=32, gamma=4, repeats=2, runs=RUNS
) -> dict:
    """Wall clock, engine seconds and modelled cost of each run (see the module docstring)."""
    from specjax.engine.deployment import from_zoo  # pylint: disable=import-outside-toplevel
    from specjax.models.zoo import load_zoo  # pylint: disable=import-outside-toplevel
    from specjax.policy.plan_config import PlanConfig  # pylint: disable=import-outside-toplevel

    zoo = load_zoo(zoo) if zoo is None or isinstance(zoo, (str, os.PathLike)) else zoo
    dep = from_zoo(zoo)
    costs = [d.cost for d in dep.drafters]
    prompts = _plan_prompts(plans_per_domain)
    pcfg = PlanConfig(
        gamma=gamma,
        verifier_temperature=1.0,
        plan_steps=plan_steps,
        max_step_tokens=max_step_tokens,
        rule="coupled",
    )
    # The machine's prices, measured at the runs' shapes and in the runs' time window (each
    # forward timed once after every timed run, medians; this machine's speed drifts): a
    # drafter token is T_draft / T_step verifier calls, a scored draft
    # (T_score − T_step) / (γ · T_step).
    timers = _price_timers(dep, pcfg, prompts)
    prices = {k: [] for k in timers}
    out = {
        which: _measure_run(dep, pcfg, prompts, which, repeats, timers, prices) for which in runs
    }
    t_step, t_score = (statistics.median(prices[k]) for k in ("step", "score"))
    score_cost = max(t_score / t_step - 1.0, 0.0) / gamma
    c_measured = [statistics.median(prices[k]) / t_step for k in range(len(dep.drafters))]
    unit = _predict(out, c_measured, score_cost, pcfg.consensus_cost)
    return {
        "runs": out,
        "seconds_per_cost_unit": unit,
        "t_step": t_step,
        "t_score": t_score,
        "score_cost": score_cost,
        "c_model": costs,
        "c_measured": c_measured,
        "plans": len(prompts),
        "plan_steps": plan_steps,
        "max_step_tokens": max_step_tokens,
        "gamma": gamma,
        "repeats": repeats,
        "load_average": list(os.getloadavg()),
    }


def print_result(res: dict) -> None:
    print(
        f"\nplan runner, {res['plans']} plans x {res['plan_steps']} steps x ≤ "
        f"{res['max_step_tokens']} tokens, γ {res['gamma']}; one cost unit = "
        f"{1e3 * res['seconds_per_cost_unit']:.3f} ms (the verifier alone's wall / cost); "
        f"load {res['load_average'][0]:.1f}"
    )
    print(
        f"machine prices: T_step {1e3 * res['t_step']:.3f} ms, T_score "
        f"{1e3 * res['t_score']:.3f} ms → score_cost {res['score_cost']:.3f} per draft "
        f"scored; c measured {[round(c, 3) for c in res['c_measured']]} (model "
        f"{[round(c, 3) for c in res['c_model']]})"
    )
    print(
        f"{'run':9s} {'wall s':>7s} {'engine s':>8s} {'host %':>6s} {'cost':>8s} "
        f"{'predicted s':>11s} {'pred/wall':>9s} {'machine/wall':>12s} {'tok/wall-s':>10s} "
        f"{'tok/cost':>8s}"
    )
    for w, r in res["runs"].items():
        print(
            f"{w:9s} {r['wall_s']:7.3f} {r['engine_s']:8.3f} "
            f"{100 * (1 - r['engine_s'] / r['wall_s']):6.1f} {r['cost']:8.1f} "
            f"{r['predicted_s']:11.3f} {r['predicted_over_wall']:9.2f} "
            f"{r['predicted_machine_over_wall']:12.2f} "
            f"{r['tokens_per_wall_s']:10.1f} {r['tokens_per_cost']:8.3f}"
        )
    ratios = {
        w: (
            r["tokens_per_wall_s"] / res["runs"]["single"]["tokens_per_wall_s"],
            r["tokens_per_cost"] / res["runs"]["single"]["tokens_per_cost"],
        )
        for w, r in res["runs"].items()
        if "single" in res["runs"]
    }
    if ratios:
        print(
            "throughput vs the single drafter, wall clock / cost model: "
            + ", ".join(f"{w} {a:.2f}/{b:.2f}" for w, (a, b) in ratios.items())
        )
    print(
        "first run's engine seconds ÷ warm (compilation excluded; first executions, as a "
        "sweep cell times them): "
        + ", ".join(
            f"{w} {r['first_engine_s'] / r['engine_s']:.2f}" for w, r in res["runs"].items()
        )
    )
    print(
        "engine ms per modelled verifier call (the model prices every call alike): "
        + ", ".join(f"{w} {r['engine_ms_per_verifier_call']:.3f}" for w, r in res["runs"].items())
    )


def render_page(res: dict) -> list[str]:
    """The plan_runner page's body (below the provenance header), every figure the
    run's own."""
    runs = res["runs"]
    single = runs.get("single")
    lines = [
        f"{res['plans']} plans × {res['plan_steps']} steps × ≤ {res['max_step_tokens']} "
        f"tokens, γ = {res['gamma']}, coupled rule, warm programs (medians of "
        f"{res['repeats']} after a discarded first run); one cost unit = the verifier "
        f"alone's wall clock per modelled call, {1e3 * res['seconds_per_cost_unit']:.3f} ms.",
        "",
        "| run | wall s | engine s | modelled cost | predicted ÷ wall | same, machine prices "
        "| thr. vs single: wall / model | first run's engine s ÷ warm |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, r in runs.items():
        vs = (
            f"{r['tokens_per_wall_s'] / single['tokens_per_wall_s']:.2f} / "
            f"{r['tokens_per_cost'] / single['tokens_per_cost']:.2f}"
            if single
            else "—"
        )
        lines.append(
            f"| {name} | {r['wall_s']:.3f} | {r['engine_s']:.3f} | {r['cost']:,.1f} | "
            f"{r['predicted_over_wall']:.2f} | {r['predicted_machine_over_wall']:.2f} | "
            f"{vs} | {r['first_engine_s'] / r['engine_s']:.2f} |"
        )
    lines += [
        "",
        "Engine ms per modelled verifier call (the seed's prices charge every call "
        "alike): "
        + ", ".join(f"{name} {r['engine_ms_per_verifier_call']:.2f}" for name, r in runs.items())
        + ".",
        "",
        f"The machine's prices (timed after every timed run, medians): T_step "
        f"{1e3 * res['t_step']:.3f} ms, T_score(γ + 1) {1e3 * res['t_score']:.3f} ms "
        f"(T_score ÷ T_step {res['t_score'] / res['t_step']:.2f}), so a scored draft costs "
        f"{res['score_cost']:.2f} of a step; c measured "
        + " / ".join(f"{c:.2f}" for c in res["c_measured"])
        + " (the model's "
        + " / ".join(f"{c:.3f}" for c in res["c_model"])
        + ").",
    ]
    return lines


def main(argv):
    del argv
    prov = provenance.provenance()
    res = measure(
        FLAGS.zoo,
        plans_per_domain=FLAGS.plans_per_domain,
        plan_steps=FLAGS.plan_steps,
        max_step_tokens=FLAGS.max_step_tokens,
        gamma=FLAGS.gamma,
        repeats=FLAGS.repeats,
    )
    print_result(res)
    provenance.write_outputs(
        Path(FLAGS.out) / "benchmark_plans.json",
        res,
        prov,
        page=PAGE if FLAGS.write_docs else None,
        title="Plan-runner wall clock against the cost model (experiments/benchmark_plans.py)",
        body=render_page,
        docs_dir=FLAGS.docs_dir,
    )


if __name__ == "__main__":
    define_flags()
    sf.run(main, validate, "benchmark_plans")
