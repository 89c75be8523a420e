"""Speculative vs autoregressive decoding on the zoo: speed, its floor, the peer, the theory.

  python experiments/benchmark.py --out runs/benchmark                  # B = 1, 8; γ = 2, 4
  python experiments/benchmark.py --drafters code --gammas 4 --batches 1 --peer=false
  make benchmark-device                                                  # the same on a GPU, ≤ 5 min
  python experiments/benchmark.py --batches 1,8,32 --gammas 2,4,8 --repeats 3 --write_docs
                                        # docs/results/engine_speed.md, ~15 min on 2 cores

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

Prints tables and writes benchmark.json under --out; ``--write_docs`` writes
docs/results/engine_speed.md (``--docs_dir``) from the run's own figures. The defaults
(B = 1, 8; γ = 2, 4) take about 5 minutes on 2 idle cores; the published page's command,
``--batches 1,8,32 --gammas 2,4,8``, about 15.
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import time
from pathlib import Path

import jax
import numpy as np
from absl import flags

from specjax import metrics
from specjax.data import load_prompts
from specjax.engine.autoregressive import autoregressive_generate
from specjax.engine.deployment import from_zoo
from specjax.engine.generate import row_keys_for, speculative_generate
from specjax.engine.spec import EngineConfig
from specjax.measure.benchmark_tables import print_tables, render_page
from specjax.measure.timing import matmul_floor, time_forward, time_prefill
from specjax.models.zoo import load_zoo
from specjax.runner import provenance
from specjax.runner import script_flags as sf

FLAGS = flags.FLAGS
PAGE = "engine_speed"


def define_flags():
    """The script's flags (defined only when it runs as a script)."""
    provenance.define_common_flags(out="runs/benchmark", repeats=3, page=PAGE)
    flags.DEFINE_list(
        "drafters",
        ["auto"],
        "drafters to benchmark; 'auto' = the best drafter "
        "of the verifier's tokenizer group (short acceptance probe)",
    )
    flags.DEFINE_list("gammas", ["2", "4"], "γ values")
    flags.DEFINE_list("batches", ["1", "8"], "batch sizes")
    flags.DEFINE_integer("new_tokens", 64, "tokens generated per row")
    flags.DEFINE_float("verifier_temperature", 1.0, "τ of the verifier")
    flags.DEFINE_integer("bucket", 64, "prompt widths are padded to a multiple of this")
    flags.DEFINE_bool("peer", True, "also time transformers (plain and assisted) when installed")
    flags.DEFINE_string(
        "zoo", None, "zoo path (default: $SPECJAX_ZOO, else the shipped specjax/zoo)"
    )
    flags.DEFINE_bool(
        "same_weights",
        True,
        "with --peer: also the side-by-side against "
        "transformers' assisted generation on the zoo's own weights exported to "
        "HF format (specjax.measure.peer), batch 1, greedy and sampled",
    )
    flags.DEFINE_bool(
        "require_accelerator",
        False,
        "fail unless JAX's default backend is a GPU/TPU (make benchmark-device)",
    )


def validate() -> None:
    """Every flag, before anything is printed, loaded or written (`sf.run`): a
    `ConfigError` naming the flag, its value and what is allowed."""
    _, manifest = sf.zoo("--zoo", FLAGS.zoo)
    max_len = int(manifest["models"]["verifier"]["config"]["max_len"])
    drafters = sf.zoo_drafters(manifest)
    if FLAGS.drafters != ["auto"]:
        sf.names("--drafters", FLAGS.drafters, drafters)
    sf.integers("--gammas", FLAGS.gammas, 1, 64)
    sf.integers("--batches", FLAGS.batches, 1, 1024)
    sf.integer("--new_tokens", FLAGS.new_tokens, 1, max_len // 2)
    sf.number("--verifier_temperature", FLAGS.verifier_temperature, 0.0, 100.0)
    sf.integer("--bucket", FLAGS.bucket, 1, max_len // 2)
    if FLAGS.require_accelerator:
        sf.accelerator("--require_accelerator")


@dataclasses.dataclass(frozen=True)
class Config:
    """One run's settings (the flags)."""

    drafters: tuple[str, ...] = ("auto",)
    gammas: tuple[int, ...] = (2, 4)
    batches: tuple[int, ...] = (1, 8)
    new_tokens: int = 64
    repeats: int = 3
    verifier_temperature: float = 1.0
    bucket: int = 64
    peer: bool = True
    same_weights: bool = True
    zoo: str | None = None
    out: str = "runs/benchmark"

    @classmethod
    def from_flags(cls) -> "Config":
        return cls(
            drafters=tuple(FLAGS.drafters),
            gammas=tuple(int(g) for g in FLAGS.gammas),
            batches=tuple(int(b) for b in FLAGS.batches),
            new_tokens=FLAGS.new_tokens,
            repeats=FLAGS.repeats,
            verifier_temperature=FLAGS.verifier_temperature,
            bucket=FLAGS.bucket,
            peer=FLAGS.peer,
            same_weights=FLAGS.same_weights,
            zoo=FLAGS.zoo,
            out=FLAGS.out,
        )


# ----------------------------------------------------------------------------------------
# The peer: transformers (PyTorch eager)
# ----------------------------------------------------------------------------------------


def _llama(cfg, torch, transformers):
    hf = transformers.LlamaConfig(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.d_model,
        intermediate_size=cfg.d_ff,
        num_hidden_layers=cfg.n_layers,
        num_attention_heads=cfg.n_heads,
        num_key_value_heads=cfg.n_kv_heads,
        max_position_embeddings=cfg.max_len,
        rope_theta=cfg.rope_theta,
        tie_word_embeddings=cfg.tie_embeddings,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=0,
    )
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(hf).eval()


def peer_tokens_per_s(
    v_cfg, d_cfg, batches, prompt_lens: dict, new_tokens: int, repeats: int
) -> dict | None:
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
    out = {
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "plain": {},
        "assisted": {},
    }

    def timed(batch, **extra):
        ids = torch.randint(1, v_cfg.vocab_size, (batch, prompt_lens[batch]))
        with torch.no_grad():
            target.generate(ids, **kw, **extra)  # warm-up
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
        res = speculative_generate(
            EngineConfig(gamma=4, max_new_tokens=32),
            dep.verifier,
            dep.v_params,
            dep.drafters,
            dep.d_data,
            v,
            d,
            row_keys_for(0, len(v), stream="probe"),
            bucket=64,
        )
        c = res.counters
        alpha = float(c.own_accepted_at.sum() / max(c.own_reached_at.sum(), 1))
        print(f"probe: {name} α = {alpha:.3f}", flush=True)
        if alpha > best_alpha:
            best, best_alpha = name, alpha
    return best


@dataclasses.dataclass
class BatchSetup:
    """One batch size's prompts, shapes, forward timings and drafter configurations."""

    batch: int
    v_prompts: list
    width: int
    capacity: int
    context: int
    keys: object
    t_step: float
    t_prefill: float
    floor: float
    drafters: list  # dicts: name, gamma, dep, cfg, d_prompts, t_draft, t_score, ...


def setup_batch(full, names, texts, batch: int, cfg: Config) -> BatchSetup:
    """The batch's prompts and shapes, T_step, the prefill, the floor, and per drafter × γ
    T_draft, T_score and the engine configuration."""
    v = full.verifier
    v_prompts = [full.encode(t) for t in texts]
    width = -(-max(map(len, v_prompts)) // cfg.bucket) * cfg.bucket
    capacity = width + cfg.new_tokens
    context = int(np.mean([len(p) for p in v_prompts])) + cfg.new_tokens // 2
    setups = []
    for name in names:
        dep = full.subset([name])
        spec_d, data = dep.drafters[0], dep.d_data[0]
        d_prompts = [[dep.drafter_encode[0](t) for t in texts]]
        t_draft = time_forward(
            spec_d.lm, data.params, batch, 1, context, min(spec_d.lm.max_len, capacity)
        )
        for gamma in cfg.gammas:
            t_score = time_forward(v, full.v_params, batch, gamma + 1, context, capacity)
            ecfg = EngineConfig(
                gamma=gamma,
                rule="rejection",
                verifier_temperature=cfg.verifier_temperature,
                max_new_tokens=cfg.new_tokens,
            )
            setups.append(
                dict(
                    name=name,
                    gamma=gamma,
                    dep=dep,
                    cfg=ecfg,
                    d_prompts=d_prompts,
                    t_draft=t_draft,
                    t_score=t_score,
                    tps=[],
                    counters=None,
                )
            )
    return BatchSetup(
        batch=batch,
        v_prompts=v_prompts,
        width=width,
        capacity=capacity,
        context=context,
        keys=row_keys_for(0, batch),
        t_step=time_forward(v, full.v_params, batch, 1, context, capacity),
        t_prefill=time_prefill(v, full.v_params, v_prompts, capacity, cfg.bucket),
        floor=matmul_floor(v, full.v_params, batch),
        drafters=setups,
    )


def time_batch(full, s: BatchSetup, cfg: Config) -> tuple[list[float], list[float]]:
    """AR and every speculative configuration timed in turns (one run of each per repeat,
    after one warm-up run of each), so a load change hits both sides of a ratio alike.
    Returns AR tokens/s and AR decode tokens/s per repeat; fills each drafter setup's
    ``tps`` and ``counters``."""
    v = full.verifier
    ar_s, ar_dec = [], []
    for i in range(cfg.repeats + 1):  # the first run of a program warms it up
        ar = autoregressive_generate(
            v,
            full.v_params,
            s.v_prompts,
            s.keys,
            temperature=cfg.verifier_temperature,
            max_new_tokens=cfg.new_tokens,
            bucket=cfg.bucket,
        )
        if i:
            ar_s.append(float((ar.length - ar.start).sum()) / ar.seconds)
            ar_dec.append(float((ar.length - ar.start).sum()) / (ar.seconds - s.t_prefill))
        for d in s.drafters:
            sp = speculative_generate(
                d["cfg"],
                v,
                full.v_params,
                d["dep"].drafters,
                d["dep"].d_data,
                s.v_prompts,
                d["d_prompts"],
                s.keys,
                bucket=cfg.bucket,
            )
            if i:
                d["tps"].append(float((sp.length - sp.start).sum()) / sp.seconds)
            d["counters"] = sp.counters
    return ar_s, ar_dec


def batch_results(s: BatchSetup, ar_s, ar_dec) -> tuple[dict, list[dict]]:
    """The batch's AR figures and one row per drafter × γ (spec/AR: the median of the paired
    per-repeat ratios)."""
    batch, floor, t_step = s.batch, s.floor, s.t_step
    ar_tps, dec_tps = statistics.median(ar_s), statistics.median(ar_dec)
    per_batch = dict(
        batch=batch,
        ar_tokens_per_s=ar_tps,
        floor_tokens_per_s=floor,
        ar_decode_tokens_per_s=dec_tps,
        t_prefill=s.t_prefill,
        decode_over_floor=floor / dec_tps,
        ar_over_floor=floor / ar_tps,
        t_step=t_step,
        ar_ms_per_step=1e3 * batch / ar_tps,
        decode_ms_per_step=1e3 * batch / dec_tps,
        floor_ms_per_step=1e3 * batch / floor,
        context=s.context,
        capacity=s.capacity,
        width=s.width,
        ar_runs=ar_s,
    )
    rows = []
    for d in s.drafters:
        c, gamma, t_draft, t_score = d["counters"], d["gamma"], d["t_draft"], d["t_score"]
        alpha = float(c.own_accepted_at.sum() / max(c.own_reached_at.sum(), 1))
        per_round = float(c.committed.sum() / max(c.rounds.sum(), 1))
        cc = t_draft / t_step
        hw = float(metrics.hardware_aware_speedup(per_round, t_step, t_draft, t_score, gamma))
        measured = statistics.median(sp / a for sp, a in zip(d["tps"], ar_s))
        rows.append(
            dict(
                drafter=d["name"],
                gamma=gamma,
                batch=batch,
                ar_tokens_per_s=ar_tps,
                spec_tokens_per_s=statistics.median(d["tps"]),
                alpha=alpha,
                tokens_per_round=per_round,
                c=cc,
                t_step=t_step,
                t_draft=t_draft,
                t_score=t_score,
                t_score_over_t_step=t_score / t_step,
                leviathan_expected_tokens=float(metrics.leviathan_expected_tokens(alpha, gamma)),
                leviathan_speedup=float(metrics.leviathan_speedup(alpha, gamma, cc)),
                hardware_aware_speedup=hw,
                measured_speedup=measured,
                measured_over_hardware_aware=measured / hw,
                spec_runs=d["tps"],
            )
        )
    return per_batch, rows


def measure(zoo, full, names, cfg: Config) -> tuple[dict, list[dict]]:
    """Every batch size in turn: its AR figures and its drafter × γ rows."""
    prompts_text = [p["prompt"] for p in load_prompts()]
    per_batch, rows = {}, []
    for batch in cfg.batches:
        texts = (prompts_text * (batch // len(prompts_text) + 1))[:batch]
        s = setup_batch(full, names, texts, batch, cfg)
        per_batch[batch], batch_rows = batch_results(s, *time_batch(full, s, cfg))
        rows += batch_rows
        r = per_batch[batch]
        print(
            f"B={batch:2d}: prefill {1e3 * s.t_prefill:.2f} ms; AR decode "
            f"{r['ar_decode_tokens_per_s']:8.1f} tok/s ({r['decode_ms_per_step']:.3f} ms/step, "
            f"{r['decode_over_floor']:.2f}x the floor)",
            flush=True,
        )
        print(
            f"B={batch:2d}: AR {r['ar_tokens_per_s']:8.1f} tok/s ({r['ar_ms_per_step']:.3f} "
            f"ms/step), matmul floor {s.floor:8.1f} tok/s ({r['floor_ms_per_step']:.3f} "
            f"ms/step), AR is {r['ar_over_floor']:.2f}x off the floor; T_step "
            f"{1e3 * s.t_step:.3f} ms",
            flush=True,
        )
    return per_batch, rows


def run_peers(zoo, full, names, per_batch, cfg: Config) -> tuple[dict | None, dict | None]:
    """transformers at the same shapes (random weights), and the same-weights side-by-side
    (`specjax.measure.peer`); None where not asked for or transformers / torch are absent."""
    peer = same_weights = None
    if not cfg.peer:
        return peer, same_weights
    d_cfg = full.subset([names[0]]).drafters[0].lm.config
    peer = peer_tokens_per_s(
        full.verifier.config,
        d_cfg,
        cfg.batches,
        {b: per_batch[b]["width"] for b in cfg.batches},
        cfg.new_tokens,
        cfg.repeats,
    )
    if peer is not None:
        for b in cfg.batches:
            per_batch[b]["peer_tokens_per_s"] = peer["plain"][b]
            per_batch[b]["ar_over_peer"] = per_batch[b]["ar_tokens_per_s"] / peer["plain"][b]
    if cfg.same_weights:
        try:
            from specjax.measure import peer as peer_lib  # pylint: disable=import-outside-toplevel

            same_weights = peer_lib.run(
                zoo, Path(cfg.out) / "same_weights", gamma=4, new_tokens=cfg.new_tokens
            )
        except ImportError as e:  # transformers / torch absent: the peer is optional
            print(f"same-weights peer skipped: {e}")
        else:
            print(
                "\nspecjax vs transformers' assisted generation, same weights "
                "(specjax.measure.peer):"
            )
            peer_lib.print_result(same_weights)
    return peer, same_weights


def main(argv):
    del argv
    cfg = Config.from_flags()  # the flags were checked by `validate`
    prov = provenance.provenance()
    zoo = load_zoo(cfg.zoo)
    full = from_zoo(zoo)
    names = list(cfg.drafters)
    if names == ["auto"]:
        texts = [p["prompt"] for p in load_prompts()][:8]
        names = [_probe_best(full, _same_tokenizer_drafters(zoo, full), texts)]
    print(f"devices: {jax.devices()}  drafters: {names}", flush=True)
    per_batch, rows = measure(zoo, full, names, cfg)
    peer, same_weights = run_peers(zoo, full, names, per_batch, cfg)
    result = {
        "per_batch": [per_batch[b] for b in cfg.batches],
        "rows": rows,
        "peer": peer,
        "same_weights": same_weights,
        "verifier_temperature": cfg.verifier_temperature,
        "new_tokens": cfg.new_tokens,
        "repeats": cfg.repeats,
        "devices": [str(d) for d in jax.devices()],
    }
    print_tables(result)
    path = provenance.write_json(Path(cfg.out) / "benchmark.json", result, prov)
    print(f"wrote {path}")
    if FLAGS.write_docs:
        page = provenance.write_page(
            PAGE,
            "Engine speed on the zoo (experiments/benchmark.py)",
            render_page(result),
            prov,
            FLAGS.docs_dir,
        )
        print(f"wrote {page}")


if __name__ == "__main__":
    define_flags()
    sf.run(main, validate, "benchmark")
