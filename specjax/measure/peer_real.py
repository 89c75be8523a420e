"""transformers on the real verifier's weights: the peer side of
``experiments/benchmark_real.py --parts peer`` (SmolLM2-135M-Instruct or Gemma-3-270M: the
deployment's GGUF file).

transformers loads the same GGUF file (`from_pretrained(dir, gguf_file=...)`, dequantized
to f32, PyTorch eager). On the same prompts, at batch 1, greedy:

  * `greedy_identity`: specjax's autoregressive decoding at τ = 0 gives transformers'
    greedy tokens, prompt by prompt;
  * `tokens_per_s`: transformers' `generate`, plain or with generation options (its
    prompt-lookup decoding, ``prompt_lookup_num_tokens``; assisted generation,
    ``assistant_model``), median tokens/s over ``repeats`` runs after a discarded one;
  * `assisted`: assisted generation with a specjax drafter exported to an HF folder,
    drafting exactly γ tokens per round (schedule ``constant``).
"""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path

from specjax.engine.autoregressive import autoregressive_generate
from specjax.engine.generate import row_keys_for
from specjax.models.real_zoo import export_hf, load_drafter

__all__ = ["assisted", "greedy_identity", "load_target", "run", "tokens_per_s"]


def load_target(path):
    """transformers' causal LM on the GGUF file ``path`` (f32, eval mode), with torch set to
    every core."""
    import torch  # pylint: disable=import-outside-toplevel
    import transformers  # pylint: disable=import-outside-toplevel

    torch.set_num_threads(os.cpu_count() or 1)
    p = Path(path)
    return transformers.AutoModelForCausalLM.from_pretrained(
        str(p.parent), gguf_file=p.name, dtype=torch.float32
    ).eval()


def _generate(target, row, n_new: int, **kw):
    import torch  # pylint: disable=import-outside-toplevel

    with torch.no_grad():
        return target.generate(
            torch.tensor([row]),
            max_new_tokens=n_new,
            do_sample=False,
            min_new_tokens=n_new,
            eos_token_id=None,
            pad_token_id=0,
            **kw,
        )


def greedy_identity(verifier, v_params, target, ids, n_new: int) -> list[bool]:
    """Per prompt (verifier token ids): specjax's AR at τ = 0 gives transformers' greedy
    tokens for ``n_new`` tokens."""

    same = []
    for row in ids:
        r = autoregressive_generate(
            verifier,
            v_params,
            [row],
            row_keys_for(0, 1),
            temperature=0.0,
            max_new_tokens=n_new,
            bucket=64,
        )
        ours = [int(x) for x in r.tokens[0, r.start[0] : r.length[0]]]
        theirs = _generate(target, row, n_new)[0, len(row) :].tolist()
        same.append(ours == theirs[: len(ours)] and len(ours) == n_new)
    return same


def tokens_per_s(target, ids, n_new: int, repeats: int, **kw) -> float:
    """Median tokens/s of transformers' greedy `generate` over the prompts (``repeats``
    runs, a first one discarded); ``kw`` go to `generate`."""
    tps = []
    for i in range(repeats + 1):
        n = s = 0.0
        for row in ids:
            t = time.perf_counter()
            out = _generate(target, row, n_new, **kw)
            s += time.perf_counter() - t
            n += out.shape[1] - len(row)
        if i:
            tps.append(n / s)
    return statistics.median(tps)


def assisted(target, ids, n_new: int, repeats: int, drafter, out_dir, gammas=(2, 4, 8)) -> dict:
    """``{'assisted_γ': tokens/s}``: assisted generation with the distilled drafter
    ``drafter`` (a `real_zoo` name or file), exported whole (its `SubsetVocabLM` over the
    verifier's ids) to ``out_dir/hf_code_drafter``."""
    import torch  # pylint: disable=import-outside-toplevel
    import transformers  # pylint: disable=import-outside-toplevel

    drafter_dir = Path(out_dir) / "hf_code_drafter"
    lm, params, _ = load_drafter(drafter)
    export_hf(drafter_dir, lm, params)
    assistant = transformers.AutoModelForCausalLM.from_pretrained(
        str(drafter_dir), dtype=torch.float32
    ).eval()
    rows = {}
    for g in gammas:
        assistant.generation_config.num_assistant_tokens = g
        assistant.generation_config.num_assistant_tokens_schedule = "constant"
        rows[f"assisted_{g}"] = tokens_per_s(target, ids, n_new, repeats, assistant_model=assistant)
    return rows


def run(dep, f32, texts, n_new: int, repeats: int, gguf, drafter=None, out_dir=".") -> dict:
    """The peer part on the GGUF file ``gguf`` (the deployment's verifier's): greedy
    identity on ``texts`` of ``f32`` (specjax's verifier in f32, as transformers runs the
    file: ``f32.verifier``, ``f32.v_params``; a bf16 model may pick another argmax where two
    logits are close), plain and prompt-lookup (γ 2, 4, 8) tokens/s, and assisted
    generation with ``drafter`` where one is given; prompts encoded by the deployment
    ``dep``."""
    target = load_target(gguf)
    ids = [dep.encode(t) for t in texts]
    same = greedy_identity(f32.verifier, f32.v_params, target, ids, n_new)
    print(f"greedy identical to transformers for {n_new} tokens: {same}", flush=True)
    peer = {"greedy_identical": same, "plain": tokens_per_s(target, ids, n_new, repeats)}
    for g in (2, 4, 8):
        peer[f"prompt_lookup_{g}"] = tokens_per_s(
            target, ids, n_new, repeats, prompt_lookup_num_tokens=g
        )
    if drafter is not None:
        peer.update(assisted(target, ids, n_new, repeats, drafter, out_dir))
    return peer
