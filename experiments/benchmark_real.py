r"""Speed on the real verifier: SmolLM2-135M-Instruct (GGUF, dequantized) on this machine.

  python experiments/benchmark_real.py      # every default: ~80 engine programs, over an hour here
  make benchmark-real-headline              # docs/results/real_speed_headline.md's command
  python experiments/benchmark_real.py --parts ratio --dtypes float32,bfloat16
  python experiments/benchmark_real.py --parts spec --drafters code,lookup --gammas 2,4 --batches 1
  python experiments/benchmark_real.py --parts spec --dtype bfloat16 --drafters lookup,lookup+code+prose

Parts (``--parts``, in this order; one process, nothing timed concurrently):
  machine  CPU model, caches, load; stream bandwidth (a jitted sum over 1 GiB, best of 5).
  ratio    T_step and T_score(k) for k = 1..9 at batch 1 and 8 per dtype (one-token and
           k-token verifier forwards over 100 cached tokens, jitted in a `lax.scan`,
           interleaved, min of 3 runs), against the bandwidth floor (weight bytes read per
           forward ÷ stream bandwidth) and the roofline projection of the same forwards on
           one TPU v5e chip and one H100 (bf16 weights; bytes and FLOPs counted from the
           model).
  spec     per batch, verifier τ, drafter (or '+'-joined drafters: one token tree of their
           chains per row) and γ: AR and speculative tokens/s (the engine's
           compiled programs, compilation and the first run excluded, AR and speculative
           runs alternating, medians of paired ratios), α, tokens per round, c = T_draft /
           T_step, Leviathan's speed-up and the hardware-aware prediction
           E·T_step / (γ·T_draft + T_score(γ+1)), measured ÷ hardware-aware.
  peer     transformers on the same GGUF weights (f32, eager): plain greedy `generate`,
           prompt-lookup decoding (`prompt_lookup_num_tokens`), assisted generation with the
           code drafter exported to an HF folder; greedy tokens identical to specjax's.

Writes ``real_speed.json`` under --out; ``--write_docs`` writes <docs_dir>/<doc_name>.md
(``--docs_dir``, ``--doc_name``) with the command, commit, date and machine on top. The kept
page is docs/results/real_speed_headline.md; other runs are listed in docs/performance.md.
"""

from __future__ import annotations

import itertools
import os
import statistics
import types
from pathlib import Path

import numpy as np
from absl import flags

from specjax import metrics
from specjax.measure import drafter_entries as entries
from specjax.measure.benchmark_tables import real_speed_page
from specjax.measure.hardware import score_ratios, stream_bandwidth
from specjax.measure.timing import forward_timer
from specjax.runner import provenance
from specjax.runner import script_flags as sf
from specjax.verify import registry

#: The one-chain rules (`--chain_rules`).
_ONE_CHAIN = tuple(r.name for r in registry.all_rules() if r.one_chain)

FLAGS = flags.FLAGS
PARTS = ("machine", "ratio", "spec", "peer")
#: The spec and peer parts load the verifier with this context.
MAX_LEN = 2048


def define_flags():
    """The script's flags (defined only when it runs as a script)."""
    provenance.define_common_flags(out="runs/benchmark_real", repeats=3, page="real_speed")
    flags.DEFINE_string(
        "doc_name",
        "real_speed",
        "name of the results page --write_docs writes (<docs_dir>/<doc_name>.md)",
    )
    flags.DEFINE_list("parts", ["machine", "ratio", "spec", "peer"], "parts to run")
    flags.DEFINE_list(
        "dtypes",
        ["float32:tied", "float32", "bfloat16"],
        "verifier layouts for the ratio part: dtype[:token+token] (gguf.LAYOUT_TOKENS: "
        "'tied' keeps the file's tied head, read as the table's transpose, instead of a "
        "[D, V] copy; 'fused' q/k/v and gate/up tables; 'out_first' weights stored "
        "[out, in])",
    )
    flags.DEFINE_list("ks", [str(k) for k in range(1, 10)], "block widths k (ratio part)")
    flags.DEFINE_list("ratio_batches", ["1", "8"], "batch sizes (ratio part)")
    flags.DEFINE_string(
        "dtype",
        "float32",
        "verifier dtype[:token+token] for the spec and peer parts (tokens as --dtypes')",
    )
    flags.DEFINE_string(
        "ar_reference",
        "",
        "another verifier dtype[:tokens] whose autoregressive decoding is timed in the same paired "
        "rounds (spec part), e.g. float32 beside a bfloat16 run: the model's plain decoding "
        "at the other precision (its own target numerics), which may be faster on this "
        "machine; rows then also give spec / reference AR",
    )
    flags.DEFINE_list(
        "drafters",
        ["code", "prose", "lookup", "reasoning"],
        "drafters (spec part); names joined by '+' (e.g. lookup+code+prose) share each "
        "row as one token tree: one chain per drafter, scored in one (S·γ+1)-token "
        "forward and verified by --tree_rule; NAME*COUNT names a drafter COUNT times "
        "(twins: COUNT chains drafted in one pass, under token_tree their first drafts "
        "drawn without replacement)",
    )
    flags.DEFINE_enum(
        "tree_rule",
        "token_tree",
        [r.name for r in registry.all_rules() if r.allows_slots(2)],
        "verification rule of the '+' setups (one-drafter setups use rule 1, rejection)",
    )
    flags.DEFINE_list(
        "chain_rules",
        ["rejection"],
        "verification rules of the one-drafter setups, one setup each: rejection (rule 1) "
        "and/or block_verification (the chain verified as a block, Sun et al. 2025)",
    )
    flags.DEFINE_enum(
        "q_layout",
        "dense",
        ["dense", "sparse"],
        "how drafts' laws reach the rule (EngineConfig.q_layout; sparse: on the drafters' "
        "ids where each has a known set, e.g. eagle's head and prompt lookup)",
    )
    flags.DEFINE_list("gammas", ["2", "3", "4", "6", "8"], "γ values (spec part)")
    flags.DEFINE_list("batches", ["1", "8"], "batch sizes (spec part)")
    flags.DEFINE_list("taus", ["1.0", "0.0"], "verifier temperatures (spec part)")
    flags.DEFINE_bool(
        "greedy_drafters",
        True,
        "at verifier τ = 0 the drafters draft greedily "
        "too (τ_i = 0; lossless either way); else at their own τ_i",
    )
    flags.DEFINE_integer("new_tokens", 64, "tokens generated per row")
    flags.DEFINE_integer(
        "prompts_per_domain",
        1,
        "plan prompts per domain at batch 1 (rows cycle through the domains at larger batches)",
    )
    flags.DEFINE_string("drafter_dir", "", "folder of drafter_{code,prose}.npz (default: shipped)")
    flags.DEFINE_string(
        "eagle",
        "",
        "a feature drafter file (train_eagle.py's eagle*.npz) for 'eagle' (default: shipped)",
    )


def load_verifier(spec: str, max_len: int, field: str = "--dtype"):
    """SmolLM2 in the layout ``spec`` names (`specjax.models.gguf.parse_layout`)."""
    from specjax.models.gguf import smollm2_layout  # pylint: disable=import-outside-toplevel

    return smollm2_layout(spec, max_len=max_len, field=field)


def _validator(name: str):
    def valid(specs) -> bool:
        from specjax.models.gguf import parse_layout  # pylint: disable=import-outside-toplevel

        for spec in [specs] if isinstance(specs, str) else specs:
            if spec:
                try:
                    parse_layout(spec, f"--{name}")
                except ValueError as e:
                    raise flags.ValidationError(str(e)) from None
        return True

    return valid


def validate() -> None:
    """Every flag, before anything is printed, loaded or written (`sf.run`): a
    `ConfigError` naming the flag, its value and what is allowed."""
    from specjax.models.gguf import parse_layout  # pylint: disable=import-outside-toplevel
    from specjax.runner.deployments.smollm2 import (  # pylint: disable=import-outside-toplevel
        SMOLLM2_DRAFTERS,
        SMOLLM2_EXTRA,
    )

    parts = sf.names("--parts", FLAGS.parts, PARTS)
    for spec in FLAGS.dtypes:
        parse_layout(spec, "--dtypes")
    parse_layout(FLAGS.dtype, "--dtype")
    if FLAGS.ar_reference:
        parse_layout(FLAGS.ar_reference, "--ar_reference")
    if "ratio" in parts:
        sf.check(FLAGS.dtypes, "--dtypes", "", "one or more layouts with --parts=ratio")
        sf.integers("--ks", FLAGS.ks, 1, 64)
        sf.integers("--ratio_batches", FLAGS.ratio_batches, 1, 1024)
    known = (*SMOLLM2_DRAFTERS, *SMOLLM2_EXTRA)
    allowed = (
        f"entries NAME, NAME*COUNT (COUNT >= 1, twins) or such parts joined by '+', "
        f"NAME one of {', '.join(known)}"
    )
    text = ",".join(FLAGS.drafters)
    sf.check(FLAGS.drafters or "spec" not in parts, "--drafters", text, allowed)
    for e in FLAGS.drafters:
        sf.check(entries.entry_ok(e), "--drafters", text, f"{allowed} ({e!r} does not parse)")
        bad = [n for n in entries.members(e) if n not in known]
        sf.check(
            not bad, "--drafters", text, f"{allowed} ({bad[0] if bad else ''!r} is not one of them)"
        )
    gammas = sf.integers("--gammas", FLAGS.gammas, 1, 64)
    sf.integers("--batches", FLAGS.batches, 1, 1024)
    sf.numbers("--taus", FLAGS.taus, 0.0)
    sf.integer("--new_tokens", FLAGS.new_tokens, 1, MAX_LEN // 2)
    sf.integer("--prompts_per_domain", FLAGS.prompts_per_domain, 1, 24)
    widest = max([len(entries.members(e)) for e in FLAGS.drafters] or [1]) * max(gammas) + 1
    sf.check(
        widest <= 256,
        "--drafters / --gammas",
        f"{text} / {','.join(FLAGS.gammas)}",
        f"blocks of at most 256 tokens (chains × γ + 1; this is {widest})",
    )
    sf.check(
        FLAGS.doc_name and "/" not in FLAGS.doc_name and FLAGS.doc_name not in (".", ".."),
        "--doc_name",
        FLAGS.doc_name,
        "a file name (no '/')",
    )
    used = set(_drafter_names()) | ({"code"} if "peer" in parts else set())
    if FLAGS.drafter_dir:
        folder = sf.in_dir(
            "--drafter_dir", FLAGS.drafter_dir, "a folder holding drafter_code.npz / .json"
        )
        wanted = sorted(used & {"code", "prose"})
        sf.check(
            any((folder / f"drafter_{n}.npz").exists() for n in wanted) or not wanted,
            "--drafter_dir",
            FLAGS.drafter_dir,
            f"a folder holding drafter_{{{','.join(wanted)}}}.npz (none of them is there)",
        )
        for n in wanted:
            f = folder / f"drafter_{n}.npz"
            if f.exists() or f.is_symlink():
                sf.drafter_file("--drafter_dir", f, shown=FLAGS.drafter_dir)
    if FLAGS.eagle:
        sf.drafter_file("--eagle", FLAGS.eagle, feature=True)


def part_ratio(result: dict, bw: float) -> None:
    rows = []
    for spec in FLAGS.dtypes:
        m = load_verifier(spec, 512, "--dtypes")
        for row in score_ratios(spec, m.lm, m.params, FLAGS.ratio_batches, FLAGS.ks, bw):
            rows.append(row)
            print(
                f"{spec:13} B={row['batch']}: T_step {1e3 * row['t_step']:7.2f} ms (floor "
                f"{1e3 * row['floor_s']:6.2f} ms, {row['t_step'] / row['floor_s']:.2f}x); "
                "T_score(k)/T_step " + " ".join(f"{k}:{v:.2f}" for k, v in row["ratio"].items()),
                flush=True,
            )
        del m
    result["ratio"] = rows


def _drafter_files() -> dict:
    d = Path(FLAGS.drafter_dir)
    files = {n: d / f"drafter_{n}.npz" for n in ("code", "prose")} if FLAGS.drafter_dir else {}
    out = {n: str(f) for n, f in files.items() if f.exists()}
    if FLAGS.eagle:
        out["eagle"] = FLAGS.eagle
    return out


def _plan_texts() -> list[str]:
    """--prompts_per_domain plan prompts, interleaved across the sorted domains."""
    from specjax.data import load_prompts  # pylint: disable=import-outside-toplevel

    by_domain = {}
    for p in load_prompts():
        by_domain.setdefault(p["domain"], []).append(p["prompt"])
    return [
        t
        for i in range(FLAGS.prompts_per_domain)
        for d in sorted(by_domain)
        for t in by_domain[d][i : i + 1]
    ]


def _drafter_names() -> list[str]:
    """Every drafter any --drafters entry names, once, in order."""
    return list(dict.fromkeys(n for e in FLAGS.drafters for n in entries.members(e)))


def _forward_times(dep, batch: int, context: int, capacity: int) -> tuple:
    """T_step, T_score(k) per block width k = S·γ + 1 (S chains of γ: one per drafter of an
    entry) and T_draft per drafter (seconds, the min of 3 rounds at this shape). The shapes
    are timed interleaved, round by round, so that a burst of load on the machine lands on
    all of them rather than on one ratio's numerator or denominator."""
    v = dep.verifier
    widths = sorted(
        {len(entries.members(e)) * int(g) + 1 for e in FLAGS.drafters for g in FLAGS.gammas}
    )
    timers = {
        ("verifier", k): forward_timer(v, dep.v_params, batch, k, context, capacity, 16)
        for k in [1, *widths]
    }
    passes = dict.fromkeys(p for e in FLAGS.drafters for p in entries.twin_counts(e).items())
    for name, m in passes:
        sub = dep.subset([name])
        timers[("drafter", name, m)] = forward_timer(
            sub.drafters[0].lm,
            sub.d_data[0].params,
            batch * m,
            1,
            context,
            min(sub.drafters[0].lm.max_len, capacity),
            16,
        )
    best = {key: float("inf") for key in timers}
    for _ in range(3):
        for key, timer in timers.items():
            best[key] = min(best[key], timer())
    t_score = {k: best[("verifier", k)] for k in widths}
    t_draft = {p: best[("drafter", *p)] for p in passes}
    return best[("verifier", 1)], t_score, t_draft


def _spec_setups(dep, calls, tau: float) -> list[dict]:
    """One setup per --drafters entry × γ at verifier τ: its deployment (an entry's
    drafters in its order: the tree's slots), engine config, drafter prompts, and empty
    lists for its runs."""
    from specjax.engine.spec import EngineConfig  # pylint: disable=import-outside-toplevel

    setups = []
    for name in FLAGS.drafters:
        members = entries.members(name)
        sub = dep.subset(members)
        if tau == 0.0 and FLAGS.greedy_drafters:
            sub = sub.with_temperatures([0.0] * len(members))
        d_calls = [[[enc(t) for t in c] for enc in sub.drafter_encode] for c in calls]
        rules = FLAGS.chain_rules if len(members) == 1 else [FLAGS.tree_rule]
        for g, rule in itertools.product([int(x) for x in FLAGS.gammas], rules):
            cfg = EngineConfig(
                gamma=g,
                rule=rule,
                verifier_temperature=tau,
                max_new_tokens=FLAGS.new_tokens,
                n_slots=len(members),
                q_layout=FLAGS.q_layout,
            )
            setups.append(
                dict(
                    name=name,
                    gamma=g,
                    sub=sub,
                    cfg=cfg,
                    d_calls=d_calls,
                    tps=[],
                    ratio=[],
                    counters=[],
                )
            )
    return setups


def _run_ar(dep, v_calls, tau: float) -> tuple:
    """Tokens/s of autoregressive decoding over every call, and each call's (tokens,
    seconds)."""
    from specjax.engine.autoregressive import (  # pylint: disable=import-outside-toplevel
        autoregressive_generate,
    )
    from specjax.engine.generate import (  # pylint: disable=import-outside-toplevel
        row_keys_for,
    )

    per_call = []
    for vc in v_calls:
        r = autoregressive_generate(
            dep.verifier,
            dep.v_params,
            vc,
            row_keys_for(0, len(vc)),
            temperature=tau,
            max_new_tokens=FLAGS.new_tokens,
            bucket=64,
        )
        per_call.append((float((r.length - r.start).sum()), r.seconds))
    return _rate(per_call), per_call


def _rate(per_call) -> float:
    """Tokens/s over calls of (tokens, seconds)."""
    return sum(n for n, _ in per_call) / sum(s for _, s in per_call)


def _run_spec(dep, v_calls, d: dict) -> tuple:
    """Tokens/s of one setup's speculative decoding over every call, its counters, and
    each call's (tokens, seconds)."""
    from specjax.engine.generate import (  # pylint: disable=import-outside-toplevel
        row_keys_for,
        speculative_generate,
    )

    per_call, counters = [], []
    for vc, dc in zip(v_calls, d["d_calls"]):
        r = speculative_generate(
            d["cfg"],
            dep.verifier,
            dep.v_params,
            d["sub"].drafters,
            d["sub"].d_data,
            vc,
            dc,
            row_keys_for(0, len(vc)),
            bucket=64,
        )
        per_call.append((float((r.length - r.start).sum()), r.seconds))
        counters.append(r.counters)
    return _rate(per_call), counters, per_call


def _paired_runs(dep, v_calls, setups, tau: float, ref=None) -> tuple:
    """AR (and the reference dtype's AR, ``ref``) and every setup's speculative runs
    alternating (the first round discarded); fills each setup's runs and its per-call
    (tokens, seconds) summed over the repeats (``calls``), and returns AR's and the
    reference AR's tokens/s per repeat and AR's per-call sums."""
    ar, ref_ar = [], []
    ar_calls = np.zeros((len(v_calls), 2))
    for d in setups:
        d["calls"] = np.zeros((len(v_calls), 2))
    for i in range(FLAGS.repeats + 1):
        a, a_calls = _run_ar(dep, v_calls, tau)
        r = _run_ar(ref, v_calls, tau)[0] if ref is not None else None
        if i:
            ar.append(a)
            ar_calls += np.asarray(a_calls)
            if r is not None:
                ref_ar.append(r)
        for d in setups:
            tps, counters, calls = _run_spec(dep, v_calls, d)
            if i:
                d["tps"].append(tps)
                d["ratio"].append(tps / a)
                d["calls"] += np.asarray(calls)
            d["counters"] = counters
    return ar, ref_ar, ar_calls


def _spec_row(d: dict, batch: int, tau: float, ar_tps: float, t_step, t_draft, t_score) -> dict:
    """One setup's result row (α, tokens per round, c, predictions, measured speed-up); printed."""
    acc = sum(float(c.own_accepted_at.sum()) for c in d["counters"])
    reach = sum(float(c.own_reached_at.sum()) for c in d["counters"])
    alpha = acc / max(reach, 1.0)
    by_k = [
        sum(np.asarray(c.own_accepted_at).sum(axis=(0, 2)) for c in d["counters"]),
        sum(np.asarray(c.own_reached_at).sum(axis=(0, 2)) for c in d["counters"]),
    ]
    per_round = sum(float(c.committed.sum()) for c in d["counters"]) / max(
        sum(float(c.rounds.sum()) for c in d["counters"]), 1.0
    )
    # A call runs until its slowest row is done: the rows' rounds ÷ (B × the call's rounds).
    rounds = [np.asarray(c.rounds) for c in d["counters"]]
    row_use = sum(float(r.sum()) for r in rounds) / max(
        sum(float(r.max()) * r.size for r in rounds), 1.0
    )
    members = entries.members(d["name"])
    g = d["gamma"]
    # A tree's drafters draft one after another (a drafter named m times: one pass at
    # batch m·B): γ · ΣT_draft, then one (S·γ+1)-token score.
    td = sum(t_draft[p] for p in entries.twin_counts(d["name"]).items())
    ts = t_score[len(members) * g + 1]
    hw = float(metrics.hardware_aware_speedup(per_round, t_step, td, ts, g))
    measured = statistics.median(d["ratio"])
    # Leviathan's formula is for one chain; a tree's pooled α does not enter it.
    lev = float(metrics.leviathan_speedup(alpha, g, td / t_step)) if len(members) == 1 else None
    kept, kept1 = metrics.kept_per_round(d["counters"])  # the rule and rule 1, same blocks
    row = dict(
        drafter=d["name"],
        rule=d["cfg"].rule,
        slots=len(members),
        gamma=g,
        batch=batch,
        tau=tau,
        drafter_tau=float(d["sub"].drafters[0].temperature),
        ar_tokens_per_s=ar_tps,
        spec_tokens_per_s=statistics.median(d["tps"]),
        alpha=alpha,
        alpha_by_drafter={
            n: float(a) / max(float(r), 1.0)
            for n, a, r in zip(entries.labels(members), by_k[0], by_k[1])
        },
        tokens_per_round=per_round,
        kept_per_round=kept,
        kept_per_round_rule1=kept1,
        row_use=row_use,
        c=td / t_step,
        t_step=t_step,
        t_draft=td,
        t_score=ts,
        t_score_over_t_step=ts / t_step,
        leviathan_speedup=lev,
        hardware_aware_speedup=hw,
        measured_speedup=measured,
        measured_over_hardware_aware=measured / hw,
        spec_runs=d["tps"],
        load_average=list(os.getloadavg()),
    )
    print(
        f"  {d['name']:9} γ={g}: spec {row['spec_tokens_per_s']:6.1f} tok/s, "
        f"x{measured:.2f} AR (hw-aware {hw:.2f}, meas/hw {measured / hw:.2f}); "
        f"α {alpha:.2f}, tok/round {per_round:.2f}, row use {row_use:.2f}, c {td / t_step:.3f}, "
        f"T_score/T_step {ts / t_step:.2f}, rule {d['cfg'].rule}"
        + (f", drafts kept {kept:.3f} (rule 1 {kept1:.3f})" if kept is not None else ""),
        flush=True,
    )
    return row


def part_spec(result: dict, model, dep, ref=None) -> None:
    """Speculative vs AR per batch × verifier τ × drafter × γ, with the forward times
    (``ref``: the `--ar_reference` verifier, its AR timed in the same rounds)."""
    texts_all = _plan_texts()
    rows, per_batch = [], []
    for batch in [int(b) for b in FLAGS.batches]:
        texts = (texts_all * batch)[: max(batch, len(texts_all))]
        calls = [texts[i : i + batch] for i in range(0, len(texts), batch)]
        v_calls = [[dep.encode(t) for t in c] for c in calls]
        width = max(len(p) for c in v_calls for p in c)
        capacity = -(-width // 64) * 64 + FLAGS.new_tokens + 16
        context = int(np.mean([len(p) for c in v_calls for p in c])) + FLAGS.new_tokens // 2
        t_step, t_score, t_draft = _forward_times(dep, batch, context, capacity)
        for tau in [float(t) for t in FLAGS.taus]:
            setups = _spec_setups(dep, calls, tau)
            ar, ref_ar, ar_calls = _paired_runs(dep, v_calls, setups, tau, ref)
            ar_tps = statistics.median(ar)
            per_batch.append(
                dict(
                    batch=batch,
                    tau=tau,
                    ar_tokens_per_s=ar_tps,
                    t_step=t_step,
                    ar_runs=ar,
                    reference_ar_runs=ref_ar,
                    reference_dtype=FLAGS.ar_reference if ref_ar else None,
                    context=context,
                    capacity=capacity,
                )
            )
            print(
                f"B={batch} τ={tau}: AR {ar_tps:.1f} tok/s; T_step {1e3 * t_step:.2f} ms",
                flush=True,
            )
            if ref_ar:
                print(
                    f"  reference AR ({FLAGS.ar_reference}) {statistics.median(ref_ar):.1f} tok/s"
                )
            for d in setups:
                row = _spec_row(d, batch, tau, ar_tps, t_step, t_draft, t_score)
                row["speedup_interval"] = list(metrics.speedup_interval(d["calls"], ar_calls))
                row["interval_calls"] = len(v_calls)
                print(
                    f"    spec / AR 95% interval over {len(v_calls)} calls: "
                    f"[{row['speedup_interval'][0]:.2f}, {row['speedup_interval'][1]:.2f}]",
                    flush=True,
                )
                if ref_ar:
                    row["reference_ar_tokens_per_s"] = statistics.median(ref_ar)
                    row["spec_over_reference_ar"] = statistics.median(
                        [t / r for t, r in zip(d["tps"], ref_ar)]
                    )
                rows.append(row)
    result["spec"] = rows
    result["ar"] = per_batch
    del model


def part_peer(result: dict, dep, f32) -> None:
    """transformers on the same weights: plain, prompt lookup, assisted (code drafter);
    greedy identity against ``f32`` (the verifier in f32: ``verifier``, ``v_params``)."""
    import importlib.util  # pylint: disable=import-outside-toplevel

    missing = [m for m in ("torch", "transformers") if importlib.util.find_spec(m) is None]
    if missing:
        print(f"peer skipped: {', '.join(missing)} not installed")
        return
    from specjax.data import load_prompts  # pylint: disable=import-outside-toplevel
    from specjax.measure import peer_real  # pylint: disable=import-outside-toplevel

    prompts = {}
    for q in load_prompts():
        prompts.setdefault(q["domain"], q["prompt"])
    peer = peer_real.run(
        dep,
        f32,
        [prompts[d] for d in sorted(prompts)],
        FLAGS.new_tokens,
        FLAGS.repeats,
        drafter=_drafter_files().get("code", "code") if "code" in dep.names else None,
        out_dir=FLAGS.out,
    )
    print(
        "peer (transformers, same weights, f32, B=1, greedy): "
        + ", ".join(f"{k} {v:.1f} tok/s" for k, v in peer.items() if k != "greedy_identical"),
        flush=True,
    )
    result["peer"] = peer


def main(argv):
    del argv
    from specjax.runner.deployments.smollm2 import from_smollm2  # pylint: disable=import-outside-toplevel

    prov = provenance.provenance()
    m = prov["machine"]
    result = {
        "new_tokens": FLAGS.new_tokens,
        "repeats": FLAGS.repeats,
        "prompts_per_domain": FLAGS.prompts_per_domain,
        "layout": FLAGS.dtype,
    }
    bw = stream_bandwidth()
    result["stream_bytes_per_s"] = bw
    print(
        f"machine: {m.get('Model name')}, L2 {m.get('L2 cache')}, L3 {m.get('L3 cache')}, "
        f"load {os.getloadavg()[0]:.2f}; stream {bw / 1e9:.1f} GB/s",
        flush=True,
    )
    if "ratio" in FLAGS.parts:
        part_ratio(result, bw)
    if "spec" in FLAGS.parts or "peer" in FLAGS.parts:
        model = load_verifier(FLAGS.dtype, 2048)
        names = list(dict.fromkeys(_drafter_names() + (["code"] if "peer" in FLAGS.parts else [])))
        dt = FLAGS.dtype.partition(":")[0]  # the distilled drafters' dtype
        dep = from_smollm2(names, dtype=dt, drafters=_drafter_files(), verifier=model)
        ref = None
        if "spec" in FLAGS.parts and FLAGS.ar_reference and FLAGS.ar_reference != FLAGS.dtype:
            r = load_verifier(FLAGS.ar_reference, 2048, "--ar_reference")
            ref = types.SimpleNamespace(verifier=r.lm, v_params=r.params)
        if "spec" in FLAGS.parts:
            part_spec(result, model, dep, ref)
        if "peer" in FLAGS.parts:
            # transformers runs the file in f32: its greedy tokens are compared with
            # specjax's f32 model (the reference's, or one loaded for it).
            f32 = dep if dt == "float32" else ref
            if dt != "float32" and (ref is None or not FLAGS.ar_reference.startswith("float32")):
                r = load_verifier("float32", 2048)
                f32 = types.SimpleNamespace(verifier=r.lm, v_params=r.params)
            part_peer(result, dep, f32)
    path = provenance.write_json(Path(FLAGS.out) / "real_speed.json", result, prov)
    print(f"wrote {path}")
    if FLAGS.write_docs:
        page = provenance.write_page(
            FLAGS.doc_name,
            "Speed on the real verifier (SmolLM2-135M-Instruct)",
            real_speed_page(result),
            prov,
            FLAGS.docs_dir,
        )
        print(f"wrote {page}")


if __name__ == "__main__":
    define_flags()
    for _name in ("dtypes", "dtype", "ar_reference"):
        flags.register_validator(_name, _validator(_name))
    flags.register_validator(
        "drafters",
        lambda v: all(entries.entry_ok(e) for e in v),
        "--drafters: entries NAME, NAME*COUNT (COUNT ≥ 1, twins) or such parts joined by '+'",
    )
    flags.register_validator(
        "chain_rules",
        lambda v: bool(v) and all(r in _ONE_CHAIN for r in v),
        f"--chain_rules: one or more of {', '.join(_ONE_CHAIN)}",
    )
    flags.register_validator(
        "eagle",
        lambda v: not v or (Path(v).suffix == ".npz" and Path(v).is_file()),
        "--eagle: an existing feature drafter .npz file (train_eagle.py's eagle*.npz)",
    )
    sf.run(main, validate, "benchmark_real")
