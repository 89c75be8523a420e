"""Speculative vs autoregressive decoding on the zoo: speed, its floor, the peer, the theory.

  python experiments/benchmark.py --out runs/benchmark                  # B = 1, 8, 32; γ = 2, 4, 8
  python experiments/benchmark.py --drafters code --gammas 4 --batches 1 --peer=false
  make benchmark-device                                                  # the same on a GPU, ≤ 5 min

Default drafter: the best single drafter on the verifier's tokenizer (the drafter of the
verifier's tokenizer group with the highest acceptance in a short probe). For every batch
size B, measured in one process, interleaved, medians of `--repeats`:

  * AR and speculative runs alternate (one of each per repeat), and spec/AR is the
    median of the paired per-repeat ratios, so load drift does not bias a ratio;
  * AR: the verifier alone, tokens/s over all rows (`autoregressive_generate`; seconds of
    the compiled program, compilation and transfers excluded; the first run of each
    program is a discarded warm-up: XLA:CPU's first execution is ~1.5x slower); and AR
    decode: the same without the prompt's prefill (the engine's own prefill program of the
    same prompts, ragged where the call's is, timed alone), the figure to hold
    against the floor;
  * floor: the verifier's own weight matmuls alone at the same shapes (embedding, q/k/v/o,
    SwiGLU, head; no attention, no cache, no sampling) in a jitted `lax.scan`, tokens/s:
    AR / floor says what attention, the cache and sampling cost;
  * T_step, T_score: one-token and (γ+1)-token verifier forwards (at the AR call's cache
    capacity, half filled) and T_draft, the drafter's one-token forward, each in a jitted
    `lax.scan`;
  * per drafter × γ: speculative tokens/s, measured α (each chain tested alone against p),
    tokens per round E, Leviathan's speedup with c = T_draft / T_step, the hardware-aware
    prediction E · T_step / (γ · T_draft + T_score) and measured / hardware-aware;
  * the peer (`transformers`, PyTorch eager, where installed): a randomly initialised
    Llama of the verifier's exact shape, prompts as wide as specjax's padded ones (the same
    prefill work), medians as specjax's; plain generation at every B, and assisted
    generation (batch 1; transformers supports no other) with an assistant of the
    drafter's shape.

Prints tables and writes benchmark.json.
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax  # noqa: E402
import numpy as np  # noqa: E402
from absl import app, flags  # noqa: E402

from specjax import metrics  # noqa: E402
from specjax.data import load_prompts  # noqa: E402
from specjax.engine.generate import (autoregressive_generate, row_keys_for,  # noqa: E402
                                     speculative_generate)
from specjax.engine.deployment import from_zoo  # noqa: E402
from specjax.engine.spec import EngineConfig  # noqa: E402
from specjax.models.zoo import load_zoo  # noqa: E402
from timing import matmul_floor, time_forward, time_prefill  # noqa: E402  (experiments/)

FLAGS = flags.FLAGS
flags.DEFINE_string("out", "runs/benchmark", "output directory (benchmark.json)")
flags.DEFINE_list("drafters", ["auto"], "drafters to benchmark; 'auto' = the best drafter "
                  "of the verifier's tokenizer group (short acceptance probe)")
flags.DEFINE_list("gammas", ["2", "4", "8"], "γ values")
flags.DEFINE_list("batches", ["1", "8", "32"], "batch sizes")
flags.DEFINE_integer("new_tokens", 64, "tokens generated per row")
flags.DEFINE_integer("repeats", 3, "repeats per measurement (median)")
flags.DEFINE_float("verifier_temperature", 1.0, "τ of the verifier")
flags.DEFINE_integer("bucket", 64, "prompt widths are padded to a multiple of this")
flags.DEFINE_bool("peer", True, "also time transformers (plain and assisted) when installed")
flags.DEFINE_string("zoo", None, "zoo path (default: $SPECJAX_ZOO, else the shipped specjax/zoo)")
flags.DEFINE_bool("same_weights", True, "with --peer: also the side-by-side against "
                  "transformers' assisted generation on the zoo's own weights exported to HF "
                  "format (experiments/benchmark_peer.py), batch 1, greedy and sampled")
flags.DEFINE_bool("require_accelerator", False, "fail unless JAX's default backend is a GPU/TPU "
                  "(make benchmark-device)")



# ----------------------------------------------------------------------------------------
# The peer: transformers (PyTorch eager)
# ----------------------------------------------------------------------------------------

def _llama(cfg, torch, transformers):
    hf = transformers.LlamaConfig(
        vocab_size=cfg.vocab_size, hidden_size=cfg.d_model, intermediate_size=cfg.d_ff,
        num_hidden_layers=cfg.n_layers, num_attention_heads=cfg.n_heads,
        num_key_value_heads=cfg.n_kv_heads, max_position_embeddings=cfg.max_len,
        rope_theta=cfg.rope_theta, tie_word_embeddings=cfg.tie_embeddings,
        bos_token_id=None, eos_token_id=None, pad_token_id=0)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(hf).eval()


def peer_tokens_per_s(v_cfg, d_cfg, batches, prompt_lens: dict, new_tokens: int,
                      repeats: int) -> dict | None:
    """transformers' plain generation at each batch size and assisted generation at batch 1
    (tokens/s, median of `repeats` after a warm-up, as specjax's), randomly initialised
    models of the verifier's and the drafter's shapes, prompts of `prompt_lens[batch]`
    tokens: the width specjax prefills at that batch (its prompts padded to the bucket)."""
    try:
        import torch
        import transformers
    except ImportError:
        return None
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    target, draft = _llama(v_cfg, torch, transformers), _llama(d_cfg, torch, transformers)
    kw = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False)
    out = {"transformers": transformers.__version__, "torch": torch.__version__,
           "threads": torch.get_num_threads(), "plain": {}, "assisted": {}}

    def timed(batch, **extra):
        ids = torch.randint(1, v_cfg.vocab_size, (batch, prompt_lens[batch]))
        with torch.no_grad():
            target.generate(ids, **kw, **extra)                       # warm-up
            runs = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                target.generate(ids, **kw, **extra)
                runs.append(time.perf_counter() - t0)
        return batch * new_tokens / statistics.median(runs)

    for b in batches:
        out["plain"][b] = timed(b)
    try:
        out["assisted"][1] = timed(1, assistant_model=draft)
    except Exception as e:  # pylint: disable=broad-except
        out["assisted_error"] = f"{type(e).__name__}: {e}"
    return out


# ----------------------------------------------------------------------------------------
# Main
# ----------------------------------------------------------------------------------------

def _same_tokenizer_drafters(zoo, dep) -> list[str]:
    vgroup = zoo.verifier.tokenizer.fingerprint()
    return [n for n, g in zip(dep.names, dep.groups) if g == vgroup] or list(dep.names)


def _probe_best(full, names, texts) -> str:
    """The drafter with the highest acceptance in one short speculative call per drafter."""
    best, best_alpha = names[0], -1.0
    for name in names:
        dep = full.subset([name])
        v = [dep.encode(t) for t in texts]
        d = [[dep.drafter_encode[0](t) for t in texts]]
        res = speculative_generate(EngineConfig(gamma=4, max_new_tokens=32), dep.verifier,
                                   dep.v_params, dep.drafters, dep.d_data, v, d,
                                   row_keys_for(0, len(v), stream="probe"), bucket=64)
        c = res.counters
        alpha = float(c.own_accepted_at.sum() / max(c.own_reached_at.sum(), 1))
        print(f"probe: {name} α = {alpha:.3f}", flush=True)
        if alpha > best_alpha:
            best, best_alpha = name, alpha
    return best


def main(argv):
    del argv
    if FLAGS.require_accelerator and jax.default_backend() == "cpu":
        raise SystemExit("benchmark-device: JAX sees only the CPU (devices: "
                         f"{jax.devices()}); run it where jax[cuda] or jax[tpu] is installed")
    zoo = load_zoo(FLAGS.zoo)
    full = from_zoo(zoo)
    prompts_text = [p["prompt"] for p in load_prompts()]
    out = Path(FLAGS.out)
    out.mkdir(parents=True, exist_ok=True)
    v = full.verifier
    batches = [int(b) for b in FLAGS.batches]
    gammas = [int(g) for g in FLAGS.gammas]
    names = list(FLAGS.drafters)
    if names == ["auto"]:
        names = [_probe_best(full, _same_tokenizer_drafters(zoo, full), prompts_text[:8])]
    print(f"devices: {jax.devices()}  drafters: {names}", flush=True)

    per_batch, rows = {}, []
    for batch in batches:
        texts = (prompts_text * (batch // len(prompts_text) + 1))[:batch]
        v_prompts = [full.encode(t) for t in texts]
        width = -(-max(map(len, v_prompts)) // FLAGS.bucket) * FLAGS.bucket
        capacity = width + FLAGS.new_tokens
        context = int(np.mean([len(p) for p in v_prompts])) + FLAGS.new_tokens // 2
        keys = row_keys_for(0, batch)
        t_step = time_forward(v, full.v_params, batch, 1, context, capacity)
        t_prefill = time_prefill(v, full.v_params, v_prompts, capacity, FLAGS.bucket)
        floor = matmul_floor(v, full.v_params, batch)
        # AR and every speculative configuration are timed in turns (one run of each per
        # repeat, after one warm-up run of each), so a load change during the benchmark
        # hits both sides of a ratio alike; spec/AR is the median of the paired ratios.
        drafter_setups = []
        for name in names:
            dep = full.subset([name])
            spec_d, data = dep.drafters[0], dep.d_data[0]
            d_prompts = [[dep.drafter_encode[0](t) for t in texts]]
            t_draft = time_forward(spec_d.lm, data.params, batch, 1, context,
                                   min(spec_d.lm.max_len, capacity))
            for gamma in gammas:
                t_score = time_forward(v, full.v_params, batch, gamma + 1, context, capacity)
                cfg = EngineConfig(gamma=gamma, rule="rejection",
                                   verifier_temperature=FLAGS.verifier_temperature,
                                   max_new_tokens=FLAGS.new_tokens)
                drafter_setups.append(dict(name=name, gamma=gamma, dep=dep, cfg=cfg,
                                           d_prompts=d_prompts, t_draft=t_draft,
                                           t_score=t_score, tps=[], counters=None))

        def run_ar():
            return autoregressive_generate(v, full.v_params, v_prompts, keys,
                                           temperature=FLAGS.verifier_temperature,
                                           max_new_tokens=FLAGS.new_tokens,
                                           bucket=FLAGS.bucket)

        def run_spec(d):
            return speculative_generate(d["cfg"], v, full.v_params, d["dep"].drafters,
                                        d["dep"].d_data, v_prompts, d["d_prompts"], keys,
                                        bucket=FLAGS.bucket)

        ar_s, ar_dec = [], []
        for i in range(FLAGS.repeats + 1):    # the first run of a program warms it up
            ar = run_ar()
            if i:
                ar_s.append(float((ar.length - ar.start).sum()) / ar.seconds)
                ar_dec.append(float((ar.length - ar.start).sum()) / (ar.seconds - t_prefill))
            for d in drafter_setups:
                sp = run_spec(d)
                if i:
                    d["tps"].append(float((sp.length - sp.start).sum()) / sp.seconds)
                d["counters"] = sp.counters
        ar_tps = statistics.median(ar_s)
        dec_tps = statistics.median(ar_dec)
        per_batch[batch] = dict(batch=batch, ar_tokens_per_s=ar_tps, floor_tokens_per_s=floor,
                                ar_decode_tokens_per_s=dec_tps, t_prefill=t_prefill,
                                decode_over_floor=floor / dec_tps,
                                ar_over_floor=floor / ar_tps, t_step=t_step,
                                ar_ms_per_step=1e3 * batch / ar_tps,
                                decode_ms_per_step=1e3 * batch / dec_tps,
                                floor_ms_per_step=1e3 * batch / floor, context=context,
                                capacity=capacity, width=width, ar_runs=ar_s)
        print(f"B={batch:2d}: prefill {1e3 * t_prefill:.2f} ms; AR decode {dec_tps:8.1f} tok/s "
              f"({1e3 * batch / dec_tps:.3f} ms/step, {floor / dec_tps:.2f}x the floor)", flush=True)
        print(f"B={batch:2d}: AR {ar_tps:8.1f} tok/s ({1e3 * batch / ar_tps:.3f} ms/step), "
              f"matmul floor {floor:8.1f} tok/s ({1e3 * batch / floor:.3f} ms/step), "
              f"AR is {floor / ar_tps:.2f}x off the floor; T_step {1e3 * t_step:.3f} ms",
              flush=True)
        for d in drafter_setups:
            c, gamma, t_draft, t_score = d["counters"], d["gamma"], d["t_draft"], d["t_score"]
            alpha = float(c.own_accepted_at.sum() / max(c.own_reached_at.sum(), 1))
            per_round = float(c.committed.sum() / max(c.rounds.sum(), 1))
            cc = t_draft / t_step
            lev = float(metrics.leviathan_speedup(alpha, gamma, cc))
            hw = float(metrics.hardware_aware_speedup(per_round, t_step, t_draft,
                                                      t_score, gamma))
            sp_tps = statistics.median(d["tps"])
            measured = statistics.median(s / a for s, a in zip(d["tps"], ar_s))
            row = dict(drafter=d["name"], gamma=gamma, batch=batch, ar_tokens_per_s=ar_tps,
                       spec_tokens_per_s=sp_tps, alpha=alpha, tokens_per_round=per_round,
                       c=cc, t_step=t_step, t_draft=t_draft, t_score=t_score,
                       t_score_over_t_step=t_score / t_step,
                       leviathan_expected_tokens=float(
                           metrics.leviathan_expected_tokens(alpha, gamma)),
                       leviathan_speedup=lev, hardware_aware_speedup=hw,
                       measured_speedup=measured, measured_over_hardware_aware=measured / hw,
                       spec_runs=d["tps"])
            rows.append(row)
    peer = None
    if FLAGS.peer:
        d_cfg = full.subset([names[0]]).drafters[0].lm.config
        peer = peer_tokens_per_s(v.config, d_cfg, batches,
                                 {b: per_batch[b]["width"] for b in batches},
                                 FLAGS.new_tokens, FLAGS.repeats)
        if peer is not None:
            for b in batches:
                per_batch[b]["peer_tokens_per_s"] = peer["plain"][b]
                per_batch[b]["ar_over_peer"] = per_batch[b]["ar_tokens_per_s"] / peer["plain"][b]

    same_weights = None
    if FLAGS.peer and FLAGS.same_weights:
        try:
            import benchmark_peer  # pylint: disable=import-outside-toplevel
            same_weights = benchmark_peer.run(zoo, out / "same_weights", gamma=4,
                                              new_tokens=FLAGS.new_tokens)
        except ImportError as e:   # transformers / torch absent: the peer is optional
            print(f"same-weights peer skipped: {e}")
        else:
            print("\nspecjax vs transformers' assisted generation, same weights "
                  "(experiments/benchmark_peer.py):")
            benchmark_peer.print_result(same_weights)

    print(f"\n{'B':>3} {'AR tok/s':>9} {'decode':>9} {'floor':>9} {'floor/dec':>9} {'peer':>8} "
          f"{'AR/peer':>7}")
    for b in batches:
        r = per_batch[b]
        print(f"{b:3d} {r['ar_tokens_per_s']:9.1f} {r['ar_decode_tokens_per_s']:9.1f} "
              f"{r['floor_tokens_per_s']:9.1f} "
              f"{r['decode_over_floor']:9.2f} {r.get('peer_tokens_per_s', float('nan')):8.1f} "
              f"{r.get('ar_over_peer', float('nan')):7.2f}")
    if len(batches) > 1:
        b0, b1 = batches[0], batches[-1]
        print(f"AR scaling B={b1} / B={b0}: "
              f"{per_batch[b1]['ar_tokens_per_s'] / per_batch[b0]['ar_tokens_per_s']:.2f}x "
              f"(floor {per_batch[b1]['floor_tokens_per_s'] / per_batch[b0]['floor_tokens_per_s']:.2f}x)")
    if peer is not None and peer["assisted"]:
        print(f"peer assisted (B=1): {peer['assisted'][1]:.1f} tok/s; plain (B=1): "
              f"{peer['plain'].get(1, float('nan')):.1f} tok/s")
    print(f"\n{'drafter':9} {'γ':>2} {'B':>2} {'AR tok/s':>9} {'spec tok/s':>10} {'α':>5} "
          f"{'tok/rnd':>7} {'c':>5} {'Tscore/Tstep':>12} {'Leviathan':>9} {'hw-aware':>8} "
          f"{'spec/AR':>7} {'meas/hw':>7}")
    for r in rows:
        print(f"{r['drafter']:9} {r['gamma']:2d} {r['batch']:2d} {r['ar_tokens_per_s']:9.1f} "
              f"{r['spec_tokens_per_s']:10.1f} {r['alpha']:5.2f} {r['tokens_per_round']:7.2f} "
              f"{r['c']:5.2f} {r['t_score_over_t_step']:12.2f} {r['leviathan_speedup']:9.2f} "
              f"{r['hardware_aware_speedup']:8.2f} {r['measured_speedup']:7.2f} "
              f"{r['measured_over_hardware_aware']:7.2f}")
    result = {"per_batch": [per_batch[b] for b in batches], "rows": rows, "peer": peer,
              "same_weights": same_weights,
              "verifier_temperature": FLAGS.verifier_temperature,
              "new_tokens": FLAGS.new_tokens, "repeats": FLAGS.repeats,
              "devices": [str(d) for d in jax.devices()], "jax": jax.__version__,
              "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None}
    tmp = out / "benchmark.json.tmp"
    tmp.write_text(json.dumps(result, indent=1))
    os.replace(tmp, out / "benchmark.json")
    if rows:
        for b in batches:
            best = max((r for r in rows if r["batch"] == b), key=lambda r: r["measured_speedup"])
            print(f"best at B={b}: {best['drafter']} γ={best['gamma']}: spec/AR "
                  f"{best['measured_speedup']:.2f}x, hardware-aware "
                  f"{best['hardware_aware_speedup']:.2f}x (ratio "
                  f"{best['measured_over_hardware_aware']:.2f}), Leviathan "
                  f"{best['leviathan_speedup']:.2f}x")


if __name__ == "__main__":
    app.run(main)
