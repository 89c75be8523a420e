r"""specjax against transformers' assisted generation, on the same weights.

Run by ``experiments/benchmark_peer.py`` and by ``experiments/benchmark.py`` (``--same_weights``)::

  python experiments/benchmark_peer.py --out runs/benchmark_peer

The zoo's verifier and its best drafter (the drafter of the verifier's tokenizer group with
the highest mean acceptance in the zoo manifest) are exported to Hugging Face Llama
folders (`specjax.models.hf.save_hf`) and loaded back by `transformers`; their logits are
checked against specjax's first. Then, for the same prompts (the shipped plan prompts,
every domain), the same γ, batch 1, on this CPU:

  * specjax: `speculative_generate` (rule 1, one drafter) and `autoregressive_generate`,
    one compiled program each (prompts padded to one width), seconds of the compiled
    call (compilation excluded);
  * transformers: `generate(assistant_model=...)` with the assistant drafting exactly γ
    tokens per round (``num_assistant_tokens_schedule='constant'``, confidence threshold
    off), and plain `generate`, PyTorch eager in f32, after one warm-up call.

Both greedy (τ = 0) and sampled (τ = 1, no top-k / top-p). Acceptance: specjax counts
accepted / proposed draft tokens; for transformers it is recovered from the number of
target-model calls R (each round commits its accepted drafts plus one token):
(new tokens − R) / (R · γ). Greedy acceptance must be equal (both commit the verifier's
argmax; the drafts are the drafter's argmax; the last round of a prompt may propose
fewer than γ in transformers, which this formula ignores). Sampled: both drafters sample
at τ, both targets verify by rejection sampling. `print_result` prints a table;
the result holds the machine's load average before and after: CPU timings are
unreliable while other jobs run.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from specjax.data import load_prompts
from specjax.engine.autoregressive import autoregressive_generate
from specjax.engine.deployment import from_zoo
from specjax.engine.generate import row_keys_for, speculative_generate
from specjax.engine.spec import EngineConfig
from specjax.models import hf
from specjax.models.zoo import load_zoo

__all__ = ["run", "print_result"]


def _specjax(zoo, drafter, prompts, d_prompts, gamma, tau, new_tokens, seed):

    dep = from_zoo(zoo, [drafter], temperatures=[tau])  # greedy drafts at τ = 0, like HF
    width = max(len(p) for p in prompts)
    cfg = EngineConfig(
        gamma=gamma, rule="rejection", verifier_temperature=tau, max_new_tokens=new_tokens
    )
    spec_s, ar_s, toks, acc, prop, rounds, outs = 0.0, 0.0, 0, 0, 0, 0, []
    for i, (p, dp) in enumerate(zip(prompts, d_prompts)):
        keys = row_keys_for(seed + i, 1)
        r = speculative_generate(
            cfg,
            dep.verifier,
            dep.v_params,
            dep.drafters,
            dep.d_data,
            [p],
            [[dp]],
            keys,
            min_width=width,
            drafter_min_width=[max(len(x) for x in d_prompts)],
        )
        a = autoregressive_generate(
            dep.verifier,
            dep.v_params,
            [p],
            keys,
            temperature=tau,
            max_new_tokens=new_tokens,
            min_width=width,
        )
        spec_s += r.seconds
        ar_s += a.seconds
        toks += len(r.new_tokens(0))
        acc += int(np.asarray(r.counters.accepted).sum())
        prop += int(np.asarray(r.counters.proposed).sum())
        rounds += int(np.asarray(r.counters.rounds).sum())
        outs.append(r.new_tokens(0))
    return {
        "tokens": toks,
        "seconds": spec_s,
        "tokens_per_s": toks / spec_s,
        "acceptance": acc / max(prop, 1),
        "tokens_per_round": toks / max(rounds, 1),
        "ar_seconds": ar_s,
        "ar_tokens_per_s": toks / ar_s,
        "outputs": outs,
    }


def _peer(target, assistant, prompts, gamma, tau, new_tokens, seed, tokenizers=None):
    import torch

    calls = {"n": 0}
    hook = target.register_forward_hook(lambda *_: calls.__setitem__("n", calls["n"] + 1))
    assistant.generation_config.num_assistant_tokens = gamma
    assistant.generation_config.num_assistant_tokens_schedule = "constant"
    assistant.generation_config.assistant_confidence_threshold = 0.0
    # The assistant drafts as the target decodes: greedy, or sampled at τ (HF's default
    # would draft greedily even when the target samples).
    assistant.generation_config.do_sample = tau > 0
    if tau > 0:
        assistant.generation_config.temperature = tau
        assistant.generation_config.top_k = 0
        assistant.generation_config.top_p = 1.0
    sample = (
        dict(do_sample=True, temperature=1.0, top_k=0, top_p=1.0)
        if tau > 0
        else dict(do_sample=False)
    )
    common = dict(
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        pad_token_id=0,
        eos_token_id=None,
        **sample,
    )

    def gen(p, **kw):
        ids = torch.tensor([p])
        with torch.no_grad():
            return target.generate(ids, attention_mask=torch.ones_like(ids), **common, **kw)

    assist = dict(assistant_model=assistant, **(tokenizers or {}))
    gen(prompts[0], **assist)  # warm-up (first-call allocations)
    gen(prompts[0])
    torch.manual_seed(seed)
    a_s, p_s, toks, rounds, outs = 0.0, 0.0, 0, 0, []
    for p in prompts:
        calls["n"] = 0
        t0 = time.perf_counter()
        out = gen(p, **assist)
        a_s += time.perf_counter() - t0
        rounds += calls["n"]
        new = out[0, len(p) :].tolist()
        toks += len(new)
        outs.append(new)
        t0 = time.perf_counter()
        gen(p)
        p_s += time.perf_counter() - t0
    hook.remove()
    accepted = toks - rounds
    return {
        "tokens": toks,
        "seconds": a_s,
        "tokens_per_s": toks / a_s,
        "acceptance": accepted / max(rounds * gamma, 1),
        "rounds": rounds,
        "tokens_per_round": toks / max(rounds, 1),
        "plain_seconds": p_s,
        "plain_tokens_per_s": toks / p_s,
        "outputs": outs,
    }


def _pick_drafter(zoo, drafter: str):
    """The drafter model (`auto`: the verifier-tokenizer drafter of best mean acceptance)."""
    v = zoo.verifier
    name = drafter
    if name == "auto":
        same = [m for m in zoo.drafters if m.tokenizer.fingerprint() == v.tokenizer.fingerprint()]
        name = max(
            same, key=lambda m: np.mean(list((m.record.get("acceptance") or {0: 0}).values()))
        ).name
    d = zoo.drafter(name)
    if d.tokenizer.fingerprint() != v.tokenizer.fingerprint():
        raise SystemExit(
            f"drafter {name!r} has another tokenizer; transformers' "
            "same-tokenizer assisted generation needs the verifier's"
        )
    return d


def _export(out_dir: Path, name: str, m):
    """Model `m` saved as a Hugging Face Llama folder under `out_dir`/hf and loaded back (f32)."""
    import torch
    import transformers

    path = hf.save_hf(out_dir / "hf" / name, m.lm, m.params, family="llama")
    return transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def _prompt_texts(prompts_per_domain: int) -> list[str]:
    """The first `prompts_per_domain` shipped plan prompts of every domain, domains sorted."""

    by_domain = {}
    for p in load_prompts():
        by_domain.setdefault(p["domain"], []).append(p["prompt"])
    return [t for dom in sorted(by_domain) for t in by_domain[dom][:prompts_per_domain]]


def _parity(models, export, prompt) -> dict:
    """Max |Δlogit| between specjax and each exported model on one prompt, by name."""
    import torch

    parity = {}
    for name, m in models:
        toks = np.asarray(prompt)[None]
        ours = np.asarray(m.lm.logits_full(m.params, jnp.asarray(toks, jnp.int32)))
        with torch.no_grad():
            theirs = export[name](torch.tensor(toks)).logits.numpy()
        parity[name] = float(np.abs(ours - theirs).max())
    return parity


def _without_outputs(r: dict) -> dict:
    """A side's figures, its generated tokens left out."""
    return {k: v_ for k, v_ in r.items() if k != "outputs"}


def _same_tokenizer_rows(zoo, drafter, export, prompts, d_prompts, gamma, new_tokens, seed):
    """Greedy and sampled rows of specjax against transformers with the same-tokenizer drafter."""
    rows = {}
    for label, tau in (("greedy", 0.0), ("sampled", 1.0)):
        s = _specjax(zoo, drafter, prompts, d_prompts, gamma, tau, new_tokens, seed)
        p = _peer(export["verifier"], export[drafter], prompts, gamma, tau, new_tokens, seed)
        row = {
            "specjax": _without_outputs(s),
            "transformers": _without_outputs(p),
            "ratio_tokens_per_s": s["tokens_per_s"] / p["tokens_per_s"],
            "ratio_plain": s["ar_tokens_per_s"] / p["plain_tokens_per_s"],
        }
        if tau == 0:
            row["same_outputs"] = s["outputs"] == p["outputs"]
        rows[label] = row
    return rows


def _cross_tokenizer_rows(
    zoo, cross_drafter, target, out_dir, texts, prompts, gamma, new_tokens, seed
):
    """Greedy and sampled rows with a drafter of another tokenizer (transformers' errors kept)."""
    import transformers

    # transformers' different-tokenizer mode: candidates are re-tokenised through text
    # (greedy) or through a vocabulary translation (sampling, "universal assisted
    # generation"); specjax verifies through the token-level intersection (rule 3).
    v = zoo.verifier
    c = zoo.drafter(cross_drafter)
    c_model = _export(out_dir, c.name, c)
    toks = {
        "tokenizer": transformers.PreTrainedTokenizerFast(tokenizer_object=v.tokenizer.hf),
        "assistant_tokenizer": transformers.PreTrainedTokenizerFast(
            tokenizer_object=c.tokenizer.hf
        ),
    }
    c_prompts = [c.tokenizer.encode(t) for t in texts]
    cross = {}
    for label, tau in (("greedy", 0.0), ("sampled", 1.0)):
        s = _specjax(zoo, c.name, prompts, c_prompts, gamma, tau, new_tokens, seed)
        try:
            p = _peer(target, c_model, prompts, gamma, tau, new_tokens, seed, tokenizers=toks)
        except Exception as e:  # pylint: disable=broad-except
            p = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"}
        row = {"specjax": _without_outputs(s), "transformers": _without_outputs(p)}
        if "tokens_per_s" in p:
            row["ratio_tokens_per_s"] = s["tokens_per_s"] / p["tokens_per_s"]
            if tau == 0:
                row["same_outputs"] = s["outputs"] == p["outputs"]
        cross[label] = row
    return cross


def run(
    zoo=None,
    out_dir="runs/benchmark_peer",
    drafter="auto",
    cross_drafter="reasoning",
    gamma=4,
    prompts_per_domain=2,
    new_tokens=48,
    seed=0,
) -> dict:
    """The side-by-side run (see the module docstring); returns the JSON-able result (the
    exported HF folders are written under `out_dir`)."""
    import torch
    import transformers

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()
    zoo = load_zoo(zoo) if zoo is None or isinstance(zoo, (str, os.PathLike)) else zoo
    v = zoo.verifier
    d = _pick_drafter(zoo, drafter)
    drafter = d.name
    models = (("verifier", v), (drafter, d))
    export = {name: _export(out_dir, name, m) for name, m in models}
    # Parity of the exported models (f32), on a prompt of each domain.
    texts = _prompt_texts(prompts_per_domain)
    prompts = [v.tokenizer.encode(t) for t in texts]
    d_prompts = [d.tokenizer.encode(t) for t in texts]
    parity = _parity(models, export, prompts[0])
    torch.set_num_threads(os.cpu_count() or 1)
    rows = _same_tokenizer_rows(zoo, drafter, export, prompts, d_prompts, gamma, new_tokens, seed)
    cross = {}
    if cross_drafter:
        cross = _cross_tokenizer_rows(
            zoo,
            cross_drafter,
            export["verifier"],
            out_dir,
            texts,
            prompts,
            gamma,
            new_tokens,
            seed,
        )
    return {
        "gamma": gamma,
        "batch": 1,
        "prompts": len(prompts),
        "new_tokens": new_tokens,
        "drafter": drafter,
        "export_parity_max_abs": parity,
        "rows": rows,
        "cross_tokenizer": {"drafter": cross_drafter, "rows": cross},
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        "cpus": os.cpu_count(),
        "jax": jax.__version__,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }


def print_result(result: dict) -> None:
    """The tables of `run`'s result."""
    parity, rows, cross = (
        result["export_parity_max_abs"],
        result["rows"],
        result["cross_tokenizer"]["rows"],
    )
    gamma, cross_drafter = result["gamma"], result["cross_tokenizer"]["drafter"]
    load_before = result["load_average_before"]
    n_prompts, new_tokens = result["prompts"], result["new_tokens"]
    print(f"exported parity (max |Δlogit|): {parity}")
    print(
        f"γ={gamma}, batch 1, {n_prompts} prompts x {new_tokens} tokens; "
        f"load average {load_before[0]:.1f} -> {result['load_average_after'][0]:.1f} "
        f"on {os.cpu_count()} CPUs"
    )
    print(
        f"{'mode':8s} {'specjax tok/s':>14s} {'α':>6s} {'peer tok/s':>11s} {'α':>6s} "
        f"{'ratio':>6s} {'AR specjax':>11s} {'AR peer':>8s}"
    )
    for label, r in rows.items():
        s, p = r["specjax"], r["transformers"]
        print(
            f"{label:8s} {s['tokens_per_s']:14.1f} {s['acceptance']:6.3f} "
            f"{p['tokens_per_s']:11.1f} {p['acceptance']:6.3f} {r['ratio_tokens_per_s']:6.1f} "
            f"{s['ar_tokens_per_s']:11.1f} {p['plain_tokens_per_s']:8.1f}"
        )
    if "same_outputs" in rows.get("greedy", {}):
        print(f"greedy outputs identical: {rows['greedy']['same_outputs']}")
    for label, r in cross.items():
        s, p = r["specjax"], r["transformers"]
        peer = (
            f"{p['tokens_per_s']:.1f} tok/s, {p['tokens_per_round']:.2f} tokens/round"
            if "tokens_per_s" in p
            else p["error"]
        )
        print(
            f"cross-tokenizer ({cross_drafter}) {label}: specjax "
            f"{s['tokens_per_s']:.1f} tok/s, {s['tokens_per_round']:.2f} tokens/round; "
            f"transformers {peer}"
            + (f"; same outputs {r['same_outputs']}" if "same_outputs" in r else "")
        )
