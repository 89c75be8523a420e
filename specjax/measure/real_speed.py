"""Speed on a real verifier (SmolLM2-135M-Instruct, Gemma-3-270M): the measurement of
experiments/benchmark_real.py, which holds its flags, their checks and the page's write.

`measure(settings, machine, target)` runs the parts `Settings.parts` names, in order, in
one process (nothing timed concurrently) and returns the result the script writes as JSON:

  machine  CPU model, caches, load; stream bandwidth (`hardware.stream_bandwidth`).
  ratio    T_step and T_score(k) per layout and batch against the bandwidth floor and the
           rooflines (`hardware.score_ratios`).
  spec     per batch, verifier τ, drafter entry and γ: AR and speculative tokens/s (the
           engine's compiled programs, AR and speculative runs alternating, medians of
           paired ratios), α, tokens per round, c, Leviathan's and the hardware-aware
           prediction (`part_spec`); AR against its bandwidth floor (the bytes a decode
           step must read ÷ the stream bandwidth: `hardware.step_floor`).
  peer     transformers on the same GGUF file (`specjax.measure.peer_real`).

``target`` (a `Target`) is the deployment measured: its verifier's loader, its deployment's
builder, its GGUF file. A deployment kind of the runner makes it (``real_speed_target()``
of the smollm2 and gemma3 kinds), and the script passes it in: this module sits below the
runner. `page` is the results page's body.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import itertools
import os
import statistics
import types
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np

from specjax import metrics
from specjax.data import load_prompts
from specjax.engine.autoregressive import autoregressive_generate
from specjax.engine.generate import row_keys_for, speculative_generate
from specjax.engine.spec import EngineConfig
from specjax.measure import drafter_entries as entries
from specjax.measure import peer_real
from specjax.measure.benchmark_tables import real_speed_page
from specjax.measure.hardware import score_ratios, step_floor, stream_bandwidth
from specjax.measure.timing import forward_timer
from specjax.models.gguf import load_gguf_model, parse_layout

__all__ = ["MAX_LEN", "PARTS", "Settings", "Target", "gguf_layout", "measure", "page"]

PARTS = ("machine", "ratio", "spec", "peer")
#: The spec and peer parts load the verifier with this context.
MAX_LEN = 2048


@dataclasses.dataclass(frozen=True, kw_only=True)
class Target:
    """A real deployment as benchmark_real.py measures it (its kind's ``real_speed_target()``).

    Attributes:
        name: the deployment kind (``--deployment``).
        model: the verifier's name (the page's title).
        load_verifier: ``(layout, max_len, field) -> GGUFModel``: the verifier in the layout
            a ``--dtype`` value names (`specjax.models.gguf.parse_layout`; a `ConfigError`
            naming ``field``).
        build: ``(names, *, dtype, max_len, drafters, verifier) -> Deployment``: the
            deployment with the drafters ``names`` on the loaded ``verifier`` (``drafters``:
            name -> file overriding a shipped drafter, where the kind has such drafters).
        gguf: ``() -> Path``: the verifier's GGUF file (transformers loads it: the peer).
        drafters: the drafter names a ``--drafters`` entry may use.
        chat: plan prompts go through the model's chat template (else: the text itself).
        peer_drafter: the drafter exported for transformers' assisted generation (None:
            none of the kind's drafters shares the verifier's tokenizer and runs in
            transformers).
    """

    name: str
    model: str
    load_verifier: Callable
    build: Callable
    gguf: Callable
    drafters: tuple[str, ...]
    chat: bool
    peer_drafter: str | None


def gguf_layout(path, spec: str, max_len: int, field: str):
    """The GGUF file ``path``'s model in the layout ``spec`` names (`gguf.parse_layout`, a
    `ConfigError` naming ``field``; as `gguf.smollm2_layout`: without ``tied`` a tied head
    is stored as its own ``[D, V]`` copy)."""
    dt, tokens = parse_layout(spec, field)
    return load_gguf_model(
        path,
        max_len=max_len,
        dtype=dt,
        untie_head="tied" not in tokens,
        fuse_projections="fused" in tokens,
        out_first="out_first" in tokens,
    )


@dataclasses.dataclass(frozen=True, kw_only=True)
class Settings:
    """What one run measures (experiments/benchmark_real.py's flags, checked)."""

    parts: tuple[str, ...]
    dtypes: tuple[str, ...]
    ks: tuple[str, ...]
    ratio_batches: tuple[str, ...]
    dtype: str
    ar_reference: str
    drafters: tuple[str, ...]
    tree_rule: str
    chain_rules: tuple[str, ...]
    q_layout: str
    gammas: tuple[str, ...]
    batches: tuple[str, ...]
    taus: tuple[str, ...]
    greedy_drafters: bool
    new_tokens: int
    prompts_per_domain: int
    drafter_dir: str
    eagle: str
    repeats: int
    out: str

    @classmethod
    def from_values(cls, values: Mapping) -> Settings:
        """The settings among ``values`` (e.g. `absl.flags.FLAGS.flag_values_dict()`)."""
        seq = {f.name for f in dataclasses.fields(cls) if f.type.startswith("tuple")}
        return cls(
            **{
                f.name: tuple(values[f.name]) if f.name in seq else values[f.name]
                for f in dataclasses.fields(cls)
            }
        )

    def drafter_names(self) -> list[str]:
        """Every drafter any --drafters entry names, once, in order."""
        return list(dict.fromkeys(n for e in self.drafters for n in entries.members(e)))

    def drafter_files(self) -> dict:
        """The distilled drafters' and eagle's files where --drafter_dir / --eagle name them."""
        d = Path(self.drafter_dir)
        files = {n: d / f"drafter_{n}.npz" for n in ("code", "prose")} if self.drafter_dir else {}
        out = {n: str(f) for n, f in files.items() if f.exists()}
        if self.eagle:
            out["eagle"] = self.eagle
        return out

    def plan_texts(self) -> list[str]:
        """--prompts_per_domain plan prompts, interleaved across the sorted domains."""
        by_domain = {}
        for p in load_prompts():
            by_domain.setdefault(p["domain"], []).append(p["prompt"])
        return [
            t
            for i in range(self.prompts_per_domain)
            for d in sorted(by_domain)
            for t in by_domain[d][i : i + 1]
        ]


def part_ratio(s: Settings, result: dict, bw: float, target: Target) -> None:
    """T_step and T_score(k) per --dtypes layout and batch, printed; ``result['ratio']``."""
    rows = []
    for spec in s.dtypes:
        m = target.load_verifier(spec, 512, "--dtypes")
        for row in score_ratios(spec, m.lm, m.params, s.ratio_batches, s.ks, bw):
            rows.append(row)
            print(
                f"{spec:13} B={row['batch']}: T_step {1e3 * row['t_step']:7.2f} ms (floor "
                f"{1e3 * row['floor_s']:6.2f} ms, {row['t_step'] / row['floor_s']:.2f}x); "
                "T_score(k)/T_step " + " ".join(f"{k}:{v:.2f}" for k, v in row["ratio"].items()),
                flush=True,
            )
        del m
    result["ratio"] = rows


def _forward_times(s: Settings, dep, batch: int, context: int, capacity: int) -> tuple:
    """T_step, T_score(k) per block width k = S·γ + 1 (S chains of γ: one per drafter of an
    entry) and T_draft per drafter (seconds, the min of 3 rounds at this shape). The shapes
    are timed interleaved, round by round, so that a burst of load on the machine lands on
    all of them rather than on one ratio's numerator or denominator."""
    v = dep.verifier
    widths = sorted({len(entries.members(e)) * int(g) + 1 for e in s.drafters for g in s.gammas})
    timers = {
        ("verifier", k): forward_timer(v, dep.v_params, batch, k, context, capacity, 16)
        for k in [1, *widths]
    }
    passes = dict.fromkeys(p for e in s.drafters for p in entries.twin_counts(e).items())
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


def _spec_setups(s: Settings, dep, calls, tau: float) -> list[dict]:
    """One setup per --drafters entry × γ at verifier τ: its deployment (an entry's
    drafters in its order: the tree's slots), engine config, drafter prompts, and empty
    lists for its runs."""
    setups = []
    for name in s.drafters:
        members = entries.members(name)
        sub = dep.subset(members)
        if tau == 0.0 and s.greedy_drafters:
            sub = sub.with_temperatures([0.0] * len(members))
        d_calls = [[[enc(t) for t in c] for enc in sub.drafter_encode] for c in calls]
        rules = s.chain_rules if len(members) == 1 else [s.tree_rule]
        for g, rule in itertools.product([int(x) for x in s.gammas], rules):
            cfg = EngineConfig(
                gamma=g,
                rule=rule,
                verifier_temperature=tau,
                max_new_tokens=s.new_tokens,
                n_slots=len(members),
                q_layout=s.q_layout,
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


def _rate(per_call) -> float:
    """Tokens/s over calls of (tokens, seconds)."""
    return sum(n for n, _ in per_call) / sum(sec for _, sec in per_call)


def _run_ar(s: Settings, dep, v_calls, tau: float) -> tuple:
    """Tokens/s of autoregressive decoding over every call, and each call's (tokens,
    seconds)."""
    per_call = []
    for vc in v_calls:
        r = autoregressive_generate(
            dep.verifier,
            dep.v_params,
            vc,
            row_keys_for(0, len(vc)),
            temperature=tau,
            max_new_tokens=s.new_tokens,
            bucket=64,
        )
        per_call.append((float((r.length - r.start).sum()), r.seconds))
    return _rate(per_call), per_call


def _run_spec(dep, v_calls, d: dict) -> tuple:
    """Tokens/s of one setup's speculative decoding over every call, its counters, and
    each call's (tokens, seconds)."""
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


def _paired_runs(s: Settings, dep, v_calls, setups, tau: float, ref=None) -> tuple:
    """AR (and the reference dtype's AR, ``ref``) and every setup's speculative runs
    alternating (the first round discarded); fills each setup's runs and its per-call
    (tokens, seconds) summed over the repeats (``calls``), and returns AR's and the
    reference AR's tokens/s per repeat and AR's per-call sums."""
    ar, ref_ar = [], []
    ar_calls = np.zeros((len(v_calls), 2))
    for d in setups:
        d["calls"] = np.zeros((len(v_calls), 2))
    for i in range(s.repeats + 1):
        a, a_calls = _run_ar(s, dep, v_calls, tau)
        r = _run_ar(s, ref, v_calls, tau)[0] if ref is not None else None
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


def _acceptance(d: dict) -> tuple:
    """α, α per drafter of the entry, tokens per round and row use of a setup's counters."""
    counters = d["counters"]
    acc = sum(float(c.own_accepted_at.sum()) for c in counters)
    reach = sum(float(c.own_reached_at.sum()) for c in counters)
    by_k = [
        sum(np.asarray(c.own_accepted_at).sum(axis=(0, 2)) for c in counters),
        sum(np.asarray(c.own_reached_at).sum(axis=(0, 2)) for c in counters),
    ]
    by_drafter = {
        n: float(a) / max(float(r), 1.0)
        for n, a, r in zip(entries.labels(entries.members(d["name"])), by_k[0], by_k[1])
    }
    per_round = sum(float(c.committed.sum()) for c in counters) / max(
        sum(float(c.rounds.sum()) for c in counters), 1.0
    )
    # A call runs until its slowest row is done: the rows' rounds ÷ (B × the call's rounds).
    rounds = [np.asarray(c.rounds) for c in counters]
    row_use = sum(float(r.sum()) for r in rounds) / max(
        sum(float(r.max()) * r.size for r in rounds), 1.0
    )
    return acc / max(reach, 1.0), by_drafter, per_round, row_use


def _spec_row(d: dict, batch: int, tau: float, ar_tps: float, t_step, t_draft, t_score) -> dict:
    """One setup's result row (α, tokens per round, c, predictions, measured speed-up); printed."""
    alpha, by_drafter, per_round, row_use = _acceptance(d)
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
        alpha_by_drafter=by_drafter,
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


def _batch_calls(s: Settings, dep, texts_all: list[str], batch: int) -> tuple:
    """The calls of ``batch`` rows (texts and verifier prompts), the mean context a forward
    attends over and the cache capacity."""
    texts = (texts_all * batch)[: max(batch, len(texts_all))]
    calls = [texts[i : i + batch] for i in range(0, len(texts), batch)]
    v_calls = [[dep.encode(t) for t in c] for c in calls]
    width = max(len(p) for c in v_calls for p in c)
    capacity = -(-width // 64) * 64 + s.new_tokens + 16
    context = int(np.mean([len(p) for c in v_calls for p in c])) + s.new_tokens // 2
    return calls, v_calls, context, capacity


def _setup_rows(s: Settings, setups, v_calls, ar_calls, ref_ar, spec_row_args) -> list[dict]:
    """Each setup's row with its paired interval over the calls (and against the reference
    AR where one was timed); printed."""
    rows = []
    for d in setups:
        row = _spec_row(d, *spec_row_args)
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
    return rows


def part_spec(s: Settings, result: dict, dep, ref=None, bw: float | None = None) -> None:
    """Speculative vs AR per batch × verifier τ × drafter × γ, with the forward times
    (``ref``: the `--ar_reference` verifier, its AR timed in the same rounds) and, with the
    stream bandwidth ``bw``, AR's bandwidth floor (`hardware.step_floor` at the calls' mean
    context)."""
    texts_all = s.plan_texts()
    rows, per_batch = [], []
    for batch in [int(b) for b in s.batches]:
        calls, v_calls, context, capacity = _batch_calls(s, dep, texts_all, batch)
        t_step, t_score, t_draft = _forward_times(s, dep, batch, context, capacity)
        floor = step_floor(dep.verifier, dep.v_params, batch, context, bw) if bw else {}
        for tau in [float(t) for t in s.taus]:
            setups = _spec_setups(s, dep, calls, tau)
            ar, ref_ar, ar_calls = _paired_runs(s, dep, v_calls, setups, tau, ref)
            ar_tps = statistics.median(ar)
            per_batch.append(
                dict(
                    batch=batch,
                    tau=tau,
                    ar_tokens_per_s=ar_tps,
                    t_step=t_step,
                    ar_runs=ar,
                    reference_ar_runs=ref_ar,
                    reference_dtype=s.ar_reference if ref_ar else None,
                    context=context,
                    capacity=capacity,
                    **floor,
                )
            )
            print(
                f"B={batch} τ={tau}: AR {ar_tps:.1f} tok/s; T_step {1e3 * t_step:.2f} ms"
                + (
                    f"; floor {1e3 * floor['floor_s']:.2f} ms a step "
                    f"({batch / floor['floor_s']:.1f} tok/s: AR at "
                    f"{batch / ar_tps / floor['floor_s']:.2f}x)"
                    if floor
                    else ""
                ),
                flush=True,
            )
            if ref_ar:
                print(f"  reference AR ({s.ar_reference}) {statistics.median(ref_ar):.1f} tok/s")
            args = (batch, tau, ar_tps, t_step, t_draft, t_score)
            rows.extend(_setup_rows(s, setups, v_calls, ar_calls, ref_ar, args))
    result["spec"] = rows
    result["ar"] = per_batch


def part_peer(s: Settings, result: dict, dep, f32, target: Target) -> None:
    """transformers on the same GGUF file: plain, prompt lookup, assisted (the target's
    ``peer_drafter``, where it has one); greedy identity against ``f32`` (the verifier in
    f32: ``verifier``, ``v_params``)."""
    missing = [m for m in ("torch", "transformers") if importlib.util.find_spec(m) is None]
    if missing:
        print(f"peer skipped: {', '.join(missing)} not installed")
        return
    prompts = {}
    for q in load_prompts():
        prompts.setdefault(q["domain"], q["prompt"])
    name = target.peer_drafter
    peer = peer_real.run(
        dep,
        f32,
        [prompts[d] for d in sorted(prompts)],
        s.new_tokens,
        s.repeats,
        target.gguf(),
        drafter=s.drafter_files().get(name, name) if name in dep.names else None,
        out_dir=s.out,
    )
    print(
        "peer (transformers, same weights, f32, B=1, greedy): "
        + ", ".join(f"{k} {v:.1f} tok/s" for k, v in peer.items() if k != "greedy_identical"),
        flush=True,
    )
    result["peer"] = peer


def _as_verifier(model) -> types.SimpleNamespace:
    """A loaded layout as the parts read a verifier (``verifier``, ``v_params``)."""
    return types.SimpleNamespace(verifier=model.lm, v_params=model.params)


def _real_parts(s: Settings, result: dict, target: Target) -> None:
    """The spec and peer parts: the verifier in --dtype with the drafters (the target's
    ``build``), the --ar_reference verifier, and for the peer specjax's f32 model."""
    load = target.load_verifier
    model = load(s.dtype, MAX_LEN, "--dtype")
    peer = [target.peer_drafter] if "peer" in s.parts and target.peer_drafter else []
    names = list(dict.fromkeys(s.drafter_names() + peer))
    dt = s.dtype.partition(":")[0]  # the drafters' dtype
    dep = target.build(names, dtype=dt, max_len=MAX_LEN, drafters=s.drafter_files(), verifier=model)
    ref = None
    if "spec" in s.parts and s.ar_reference and s.ar_reference != s.dtype:
        ref = _as_verifier(load(s.ar_reference, MAX_LEN, "--ar_reference"))
    if "spec" in s.parts:
        part_spec(s, result, dep, ref, result.get("stream_bytes_per_s"))
    del model
    if "peer" in s.parts:
        # transformers runs the file in f32: its greedy tokens are compared with
        # specjax's f32 model (the reference's, or one loaded for it).
        f32 = dep if dt == "float32" else ref
        if dt != "float32" and (ref is None or not s.ar_reference.startswith("float32")):
            f32 = _as_verifier(load("float32", MAX_LEN, "--dtype"))
        part_peer(s, result, dep, f32, target)


def measure(s: Settings, machine: Mapping, target: Target) -> dict:
    """Every part of ``s.parts``, in order, printed as it goes, on ``target``'s deployment;
    the result (its settings, the stream bandwidth, and a key per part). ``machine``: the
    provenance's machine record (printed)."""
    result = {
        "deployment": target.name,
        "verifier": target.model,
        "prompt_form": "in the chat template" if target.chat else "as plain text",
        "new_tokens": s.new_tokens,
        "repeats": s.repeats,
        "prompts_per_domain": s.prompts_per_domain,
        "layout": s.dtype,
    }
    bw = stream_bandwidth()
    result["stream_bytes_per_s"] = bw
    print(
        f"machine: {machine.get('Model name')}, L2 {machine.get('L2 cache')}, "
        f"L3 {machine.get('L3 cache')}, load {os.getloadavg()[0]:.2f}; "
        f"stream {bw / 1e9:.1f} GB/s",
        flush=True,
    )
    if "ratio" in s.parts:
        part_ratio(s, result, bw, target)
    if "spec" in s.parts or "peer" in s.parts:
        _real_parts(s, result, target)
    return result


def _floor_lines(r: dict) -> list[str]:
    """Autoregressive decoding against its bandwidth floor, one row per batch and τ (none
    without the floor: a result from before it was recorded)."""
    rows = [a for a in r.get("ar", []) if "floor_s" in a]
    if not rows:
        return []
    lines = [
        f"## Autoregressive decoding against its bandwidth floor ({r.get('layout')})",
        "",
        "Floor: the bytes a decode step must read — the weights as stored (a tied head "
        "once; an untied model's input table only by row, not counted) and the KV cache "
        "over the calls' mean context (a sliding-window layer's at most its window) — ÷ "
        "the stream bandwidth. AR step: the batch ÷ AR tok/s (the whole decode loop); "
        "T_step: the verifier's one-token forward alone.",
        "",
        "| B | τ | weights MB | KV MB | floor ms | floor tok/s | AR tok/s | AR step ms | "
        "AR step / floor | T_step ms | T_step / floor |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for a in rows:
        b, f, step = a["batch"], a["floor_s"], a["batch"] / a["ar_tokens_per_s"]
        lines.append(
            f"| {b} | {a['tau']:g} | {a['weight_bytes'] / 1e6:.1f} | {a['kv_bytes'] / 1e6:.2f} "
            f"| {1e3 * f:.2f} | {b / f:.1f} | {a['ar_tokens_per_s']:.1f} | {1e3 * step:.2f} "
            f"| {step / f:.2f} | {1e3 * a['t_step']:.2f} | {a['t_step'] / f:.2f} |"
        )
    return lines + [""]


def page(r: dict) -> list[str]:
    """The body (below the provenance header) of benchmark_real.py's pages:
    `benchmark_tables.real_speed_page` with AR against its bandwidth floor before the
    speculative table, and the prompts' form (chat template or plain text) as the run's."""
    lines = real_speed_page(r)
    form = r.get("prompt_form", "in the chat template")
    heading = "## Speculative vs autoregressive"
    at = next((i for i, x in enumerate(lines) if x.startswith(heading)), None)
    if at is None:
        return lines + _floor_lines(r)
    lines[at] = lines[at].replace("in the chat template", form)
    return lines[:at] + _floor_lines(r) + lines[at:]
