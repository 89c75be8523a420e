r"""The room routing has: each drafter's teacher-forced α on the verifier's own plan replies,
and the hindsight per-plan and per-step best single drafter against the best fixed one.

  python experiments/routing_room.py --deployment=zoo                      # the zoo, 24 plans
  python experiments/routing_room.py --deployment=smollm2 --plans_per_domain=6
  python experiments/routing_room.py --deployment=zoo --plans_per_domain=1 --plan_steps=2 \
      --max_step_tokens=12 --n_boot=200                                    # a check, minutes

Per deployment (``zoo``: the tiny zoo's code, prose and reasoning drafters and prompt
lookup; ``smollm2``: SmolLM2-135M-Instruct's distilled code and prose drafters, the zoo's
reasoning drafter, prompt lookup and the feature drafter eagle), on ``--plans_per_domain``
shipped held-out plan prompts of each of ``--domains`` (default the three domains and
``edit``: steps that copy their context with small edits, specjax/data/edit.py) with
``--plan_steps`` steps of at most ``--max_step_tokens`` tokens: for each verifier τ of
``--taus`` the verifier writes every plan alone (τ 1 sampled, τ 0 greedy; the plan runner's
steps), then every drafter is scored teacher forced at every reply position
(`specjax.measure.routing_room`: τ 1 Σ min(p, q) and the accept probability of the
committed token, τ 0 argmax agreement). From these, for each (drafter, γ) option of
``--gammas``, `specjax.measure.loop_law` gives every step's expected rounds, priced by the
cost model (a round: 1 + γ·c_i verifier calls). The page reports, with 95 % bootstrap
intervals over plans (``--n_boot`` resamples), on the pure workload (the three domains),
the ``edit`` plans and all of them mixed: each drafter's mean α, the best fixed option,
the hindsight per-plan and per-step best options' expected tokens per round and predicted
speed-ups over the verifier alone, and their ratio to the best fixed option — the room
routing has before anything is paid for choosing.

Writes ``routing_room.json`` (every figure; each plan's α per drafter, ``plan_alpha``; each
step's Σ α, positions and every option's expected rounds, ``per_step``) and
``routing_room.md`` under --out. Sizes and times: docs of the run; on 2 loaded
CPU cores the check above takes a few minutes, the zoo's default (24 plans of each of 4
sets would be 96; the default is 6 per set, 24 plans × 4 steps × ≤ 32 tokens) about
10-20 minutes, SmolLM2's (6 per set) about 30-60 minutes.
"""

from __future__ import annotations

from pathlib import Path

from absl import flags

from specjax.runner import provenance
from specjax.runner import script_flags as sf

FLAGS = flags.FLAGS
#: Each deployment's drafters, in priority order.
DRAFTERS = {
    "zoo": ("code", "prose", "reasoning", "lookup"),
    "smollm2": ("code", "prose", "reasoning", "lookup", "eagle"),
}
PROMPT_SETS = ("code", "edit", "prose", "reasoning")
#: The corpus domains: the pure workload.
PURE = ("code", "prose", "reasoning")


def define_flags():
    """The script's flags (defined only when it runs as a script)."""
    provenance.define_common_flags(out="runs/routing_room")
    flags.DEFINE_enum("deployment", "zoo", sorted(DRAFTERS), "the deployment")
    flags.DEFINE_list("drafters", [], "drafters (default: the deployment's, DRAFTERS)")
    flags.DEFINE_list("domains", list(PROMPT_SETS), "shipped prompt sets mixed")
    flags.DEFINE_integer("plans_per_domain", 6, "plans of each prompt set", lower_bound=1)
    flags.DEFINE_integer("plan_steps", 4, "steps per plan", lower_bound=1)
    flags.DEFINE_integer("max_step_tokens", 32, "token budget of one step", lower_bound=1)
    flags.DEFINE_list("gammas", ["1", "2", "3", "4"], "γ of each option")
    flags.DEFINE_list("taus", ["1", "0"], "verifier temperatures: 1 (sampled) and/or 0 (greedy)")
    flags.DEFINE_integer("seed", 0, "the replies' PRNG seed and the bootstrap's")
    flags.DEFINE_integer("n_boot", 2000, "bootstrap resamples over plans", lower_bound=10)
    flags.DEFINE_integer("batch", 0, "plans per teacher-forced pass (0: 8 zoo, 2 smollm2)")
    flags.DEFINE_string("dtype", "float32", "smollm2: the verifier's and drafters' dtype")


def _drafters() -> list[str]:
    return list(FLAGS.drafters) or list(DRAFTERS[FLAGS.deployment])


def validate() -> None:
    """Every flag, before anything is printed, loaded or written (`sf.run`)."""
    allowed = DRAFTERS[FLAGS.deployment]
    if FLAGS.deployment == "zoo":
        allowed = allowed + ("prose512",)
    sf.names("--drafters", FLAGS.drafters, allowed, empty=True)
    sf.names("--domains", FLAGS.domains, PROMPT_SETS)
    sf.integer("--plans_per_domain", FLAGS.plans_per_domain, 1, 24)
    sf.integer("--plan_steps", FLAGS.plan_steps, 1, 16)
    sf.integer("--max_step_tokens", FLAGS.max_step_tokens, 1, 128)
    sf.integers("--gammas", FLAGS.gammas, 1, 16)
    sf.names("--taus", FLAGS.taus, ("0", "1"))
    sf.integer("--batch", FLAGS.batch, 0, 256)
    sf.dtype("--dtype", FLAGS.dtype)


def _config():
    from specjax.configs.common import plans_defaults  # pylint: disable=import-outside-toplevel

    c = plans_defaults()
    c.deployment = FLAGS.deployment
    if FLAGS.deployment == "smollm2":
        c.dtype = FLAGS.dtype
        c.max_len = 1024
    c.prompt_domains = list(FLAGS.domains)
    c.plans_per_domain = FLAGS.plans_per_domain
    c.plan_steps = FLAGS.plan_steps
    c.max_step_tokens = FLAGS.max_step_tokens
    c.machine_prices = False
    return c


def _fmt(x, ci) -> str:
    return f"{x:.3f} [{ci[0]:.3f}, {ci[1]:.3f}]"


def _page(result: dict) -> str:
    lines = [
        "# The room routing has",
        "",
        f"Deployment `{result['deployment']}`, drafters {', '.join(result['drafters'])}; "
        f"{result['plans']} plans ({', '.join(result['domains'])}), ≤ {result['plan_steps']} "
        f"steps of ≤ {result['max_step_tokens']} tokens; options (drafter, γ) for γ in "
        f"{result['gammas']}; cost model c = {result['costs']} (a round: 1 + γ·c_i verifier "
        "calls). 95 % bootstrap intervals over plans. Speed-ups are over the verifier alone, "
        "predicted from teacher-forced acceptance (`specjax.measure.routing_room`).",
        "",
    ]
    for tau, by_set in result["taus"].items():
        lines += [f"## Verifier τ {tau}", ""]
        names = result["drafters"]
        lines += ["| plans | " + " | ".join(f"α {n}" for n in names) + " |"]
        lines += ["|---|" + "---|" * len(names)]
        for label, r in by_set.items():
            cells = [_fmt(r["alpha"][n], r["alpha_ci"][n]) for n in names]
            lines.append(f"| {label} ({r['plans']}) | " + " | ".join(cells) + " |")
        lines += [
            "",
            "| plans | best fixed | its speed-up | per-plan best | per-step best | room per plan "
            "| room per step | tokens/round fixed / per plan / per step |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for label, r in by_set.items():
            f = r["fixed"]
            lines.append(
                f"| {label} | {f['drafter']}@{f['gamma']} ({r['fixed_share']:.0%} of resamples) "
                f"| {_fmt(r['speedup_fixed'], r['speedup_fixed_ci'])} "
                f"| {_fmt(r['speedup_per_plan'], r['speedup_per_plan_ci'])} "
                f"| {_fmt(r['speedup_per_step'], r['speedup_per_step_ci'])} "
                f"| {_fmt(r['room_per_plan'], r['room_per_plan_ci'])} "
                f"| {_fmt(r['room_per_step'], r['room_per_step_ci'])} "
                f"| {r['tokens_per_round_fixed']:.2f} / {r['tokens_per_round_per_plan']:.2f} / "
                f"{r['tokens_per_round_per_step']:.2f} |"
            )
        lines.append("")
    return "\n".join(lines)


def main(argv):
    del argv
    import numpy as np  # pylint: disable=import-outside-toplevel

    from specjax.measure import routing_room as rr  # pylint: disable=import-outside-toplevel
    from specjax.runner import plans_setup  # pylint: disable=import-outside-toplevel

    prov = provenance.provenance()
    config = _config()
    names = _drafters()
    gammas = [int(g) for g in FLAGS.gammas]
    cell = {"pairing": names, "gamma": max(gammas), "seed": FLAGS.seed}
    dep = plans_setup.cell_deployment(config, cell)
    prompts, ids = plans_setup.plan_prompts(config)
    domains = plans_setup.plan_domains(config, ids)
    costs = [float(d.cost) for d in dep.drafters]
    batch = FLAGS.batch or (8 if FLAGS.deployment == "zoo" else 2)
    sets = {"mixed": None}
    if set(domains) - set(PURE) and set(domains) & set(PURE):
        sets["pure"] = [i for i, d in enumerate(domains) if d in PURE]
    for d in sorted(set(domains)):
        sets[d] = [i for i, x in enumerate(domains) if x == d]
    result = {
        "deployment": FLAGS.deployment,
        "drafters": list(dep.names),
        "costs": costs,
        "domains": list(FLAGS.domains),
        "plans": len(prompts),
        "plan_ids": ids,
        "plan_domains": domains,
        "plan_steps": FLAGS.plan_steps,
        "max_step_tokens": FLAGS.max_step_tokens,
        "gammas": gammas,
        "taus": {},
        "per_step": {},
    }
    for tau in sorted({float(t) for t in FLAGS.taus}, reverse=True):
        cell_t = {**cell, "verifier_temperature": tau}
        pcfg = plans_setup.plan_config(config, cell_t)
        replies = rr.verifier_replies(dep, pcfg, prompts, ids)
        scores = rr.teacher_forced(dep, replies, batch=batch)
        rounds = rr.option_rounds(scores, tau, gammas)
        by_set = {}
        for label, plans in sets.items():
            r = rr.room(rounds, costs, dep.names, plans, n_boot=FLAGS.n_boot, seed=FLAGS.seed)
            by_set[label] = r
            print(
                f"τ {tau:g} {label:9} ({r['plans']:3d} plans) fixed "
                f"{r['fixed']['drafter']}@{r['fixed']['gamma']} "
                f"{r['speedup_fixed']:.3f}x  per plan {r['speedup_per_plan']:.3f}x "
                f"(room {r['room_per_plan']:.3f} {r['room_per_plan_ci']})  per step "
                f"{r['speedup_per_step']:.3f}x (room {r['room_per_step']:.3f})  α "
                + " ".join(f"{n} {a:.3f}" for n, a in r["alpha"].items()),
                flush=True,
            )
        result["taus"][f"{tau:g}"] = by_set
        a, _ = scores.law(tau)
        plan_sum = np.zeros((len(dep.names), len(prompts)))
        plan_pos = np.zeros(len(prompts))
        np.add.at(plan_sum.T, rounds["plan"], rounds["alpha_sum"].T)
        np.add.at(plan_pos, rounds["plan"], rounds["positions"])
        result.setdefault("plan_alpha", {})[f"{tau:g}"] = {
            pid: {n: float(plan_sum[k, p] / max(plan_pos[p], 1)) for k, n in enumerate(dep.names)}
            for p, pid in enumerate(ids)
        }
        result["per_step"][f"{tau:g}"] = {
            "plan": rounds["plan"].tolist(),
            "step": rounds["step"].tolist(),
            "positions": rounds["positions"].tolist(),
            "alpha_sum": np.round(rounds["alpha_sum"], 6).tolist(),
            "rounds": np.round(rounds["rounds"], 6).tolist(),
            "reply_tokens": int(sum(map(sum, replies.step_len))),
            "alpha_positions": int((scores.step >= 0).sum()),
            "alpha_mean": float(a[:, scores.step >= 0].mean()) if a.size else 0.0,
        }
    flags_rec = {
        k: FLAGS[k].value
        for k in (
            "deployment",
            "drafters",
            "domains",
            "plans_per_domain",
            "plan_steps",
            "max_step_tokens",
            "gammas",
            "taus",
            "seed",
            "n_boot",
            "batch",
            "dtype",
        )
    }
    result["flags"] = flags_rec
    out = Path(FLAGS.out)
    path = provenance.write_json(out / "routing_room.json", result, prov)
    (out / "routing_room.md").write_text(_page(result) + "\n")
    print(f"wrote {path} and {out / 'routing_room.md'}")


if __name__ == "__main__":
    define_flags()
    sf.run(main, validate, "routing_room")
