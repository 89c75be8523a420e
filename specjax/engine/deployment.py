"""A deployment: one verifier and K drafters, with the text ↔ token plumbing between them.

The engine works in token ids; plans, consensus and journals work in text. A `Deployment`
holds both sides: the models (functional LMs + parameters + vocabulary maps) and, for each
model, how to spell text in its ids. Built from the zoo (`from_zoo`), from any loaded models
(`assemble`, `build_deployment`: Hugging Face folders, a GGUF verifier and its drafters —
`specjax.runner.deployments` builds the real ones —, tiny test transformers) or from
synthetic tables (`specjax.testing`), it is what the policy layer and the experiments take.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Mapping
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from specjax.engine.decode import pack_valid
from specjax.engine.features import feature_layout, pick_features
from specjax.engine.gammas import check_gamma
from specjax.engine.spec import (
    DrafterData,
    DrafterSpec,
    DrafterStatic,
    cross_vocab_maps,
    drafting_maps,
    validate_drafter,
)
from specjax.errors import ConfigError, check
from specjax.models.api import causal_block_mask, forward_rows
from specjax.verify.distributions import sampling_probs, to_verifier_space


@dataclasses.dataclass
class Deployment:
    """One verifier, K drafters (in priority order) and their tokenisations.

    Attributes:
      verifier: the verifier's functional LM; v_params its parameters.
      drafters / d_data: the drafters' static specs and arrays.
      groups: K tokenizer-group labels (equal label = identical tokenizer).
      encode: text → verifier ids. decode: verifier ids → text.
      drafter_encode: K functions text → drafter ids (each drafter's own tokenizer).
      stop_table: bool[Vv], verifier tokens that end a plan step (contain the delimiter).
    """

    verifier: Any
    v_params: Any
    drafters: tuple
    d_data: tuple
    groups: tuple
    encode: Callable[[str], list[int]]
    decode: Callable[[Sequence[int]], str]
    drafter_encode: tuple
    stop_table: np.ndarray

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(d.name for d in self.drafters)

    def index(self, name: str) -> int:
        if name not in self.names:
            from specjax.errors import ConfigError

            raise ConfigError(f"drafter: got {name!r}; allowed: one of {', '.join(self.names)}")
        return self.names.index(name)

    def subset(self, names: Sequence[str]) -> "Deployment":
        """The same verifier with only the named drafters (in the given order)."""
        idx = [self.index(n) for n in names]
        return dataclasses.replace(
            self,
            drafters=tuple(self.drafters[i] for i in idx),
            d_data=tuple(self.d_data[i] for i in idx),
            groups=tuple(self.groups[i] for i in idx),
            drafter_encode=tuple(self.drafter_encode[i] for i in idx),
        )

    def with_gammas(self, gammas: Sequence[int | None]) -> "Deployment":
        """Per-drafter draft windows γ_i (None: the engine config's γ). A drafter's own γ
        applies where it drafts one chain per row; drafters sharing a row's block draft
        the config's γ."""
        check(
            len(gammas) == len(self.drafters),
            "drafter gamma",
            list(gammas),
            f"one γ (or None) per drafter of {list(self.names)}",
        )
        return dataclasses.replace(
            self,
            drafters=tuple(
                dataclasses.replace(d, gamma=None if g is None else check_gamma(g, "drafter gamma"))
                for d, g in zip(self.drafters, gammas)
            ),
        )

    def with_temperatures(self, temps: Sequence[float]) -> "Deployment":
        return dataclasses.replace(
            self,
            drafters=tuple(
                dataclasses.replace(d, temperature=float(t)) for d, t in zip(self.drafters, temps)
            ),
        )


@functools.partial(jax.jit, static_argnames=("verifier", "request"))
def _verifier_states(verifier, v_params, v_tokens, request):
    """The verifier's hidden states [B, T, n·D] at every position of ``v_tokens`` (the
    states feature drafters read, `feature_layout`'s ``request``)."""
    b, t = v_tokens.shape
    # A runtime 0 (ids are ≥ 0), not a constant XLA would fold attention over.
    cache = verifier.init_cache(b, t).replace(length=jnp.minimum(v_tokens[:, 0], 0))
    pos = jnp.broadcast_to(jnp.arange(t), (b, t))
    at = jnp.zeros((b, 1), jnp.int32)
    mask = causal_block_mask(b, t)
    return forward_rows(verifier, v_params, cache, v_tokens, pos, mask, at, with_hidden=request)[1]


@functools.partial(jax.jit, static_argnames=("spec", "v_vocab"))
def _prefix_q(
    spec: DrafterStatic, data: DrafterData, temperature, v_tokens, v_valid, v_vocab, feats=None
):
    # `spec` is the drafter's static part and the temperature an array: one program per
    # drafter model and shape, whatever the temperature (a temperature sweep compiles once).
    # `feats` (a feature drafter, which reads the verifier's ids): the verifier's features
    # f[B, T, F] of the prefix, written before it is read, as the engine does.
    b, t = v_tokens.shape
    m = data.retok.shape[1]
    lens = jnp.where(v_valid, data.retok_len[v_tokens], 0)  # [B, T]
    ids = data.retok[v_tokens].reshape(b, t * m)
    valid = (jnp.arange(m)[None, None, :] < lens[:, :, None]).reshape(b, t * m)
    ids, total = pack_valid(ids, valid)
    # Only the most recent pieces that fit in half the drafter's context are read: the KL
    # is measured on the last positions of the prefix, which this window always covers.
    w = min(t * m, spec.lm.max_len // 2)
    offset = jnp.maximum(total - w, 0)
    ids = jnp.take_along_axis(ids, offset[:, None] + jnp.arange(w)[None, :], axis=1)
    # Runtime zero length: avoids constant-folding attention over empty slots (generate.py).
    cache = spec.lm.init_cache(b, w).replace(length=jnp.minimum(total, 0).astype(jnp.int32))
    if feats is not None:  # slot s reads the feature of slot s − 1: position offset + s − 1
        window = jnp.take_along_axis(
            feats, jnp.minimum(offset[:, None] + jnp.arange(w)[None, :], t - 1)[:, :, None], 1
        )
        cache = spec.lm.write_features(cache, window, jnp.zeros_like(total), total - offset)
    ends = jnp.cumsum(lens, axis=1) - 1 - offset[:, None]  # last piece of token t
    at, _ = forward_rows(
        spec.lm,
        data.params,
        cache,
        ids,
        jnp.broadcast_to(jnp.arange(w), (b, w)),
        causal_block_mask(b, w) & (total >= 0)[:, None, None],
        jnp.clip(ends, 0, w - 1),
    )
    q = sampling_probs(
        at, temperature, top_k=spec.top_k, top_p=spec.top_p, mask=data.to_verifier >= 0
    )
    return to_verifier_space(q, data.to_verifier, v_vocab)


def prefix_distributions(
    dep: Deployment, v_tokens: np.ndarray, v_len: np.ndarray, last: int
) -> jax.Array:
    """Each drafter's next-token distribution at the last `last` positions of each prefix.

    Drafters read the prefix re-spelt token by token in their own ids, and their
    distributions are taken at verifier-token boundaries, so positions align across
    tokenizers. Returns f32[K, B·last, Vv] (positions before a row's start are dropped by
    the returned validity mask) and bool[B·last].
    """
    b, t = v_tokens.shape
    valid = np.arange(t)[None, :] < v_len[:, None]
    toks, ok_in = jax.device_put((np.asarray(v_tokens, np.int32), valid))
    request, picks = feature_layout(dep.verifier, [s.lm for s in dep.drafters])
    states = _verifier_states(dep.verifier, dep.v_params, toks, request) if request else None
    qs = [
        _prefix_q(
            dataclasses.replace(s.static, gamma=None),
            d,
            jax.device_put(np.float32(s.temperature)),
            toks,
            ok_in,
            dep.verifier.vocab_size,
            None if pick is None else pick_features(states, pick, request),
        )
        for s, d, pick in zip(dep.drafters, dep.d_data, picks)
    ]
    pos = v_len[:, None] - last + np.arange(last)[None, :]  # [B, last]
    ok = pos >= 0
    pos = np.maximum(pos, 0)
    q = jnp.stack([jnp.take_along_axis(x, jnp.asarray(pos)[:, :, None], axis=1) for x in qs])
    return q.reshape(len(qs), b * last, -1), ok.reshape(-1)


def from_zoo(
    zoo,
    names: Sequence[str] | None = None,
    temperatures: Sequence[float] | Mapping[str, float] | None = None,
    costs: Sequence[float] | Mapping[str, float] | None = None,
) -> "Deployment":
    """A `specjax.models.zoo.Zoo`'s verifier and named drafters as a deployment (default: all
    loaded drafters, in priority order). The zoo loads models; the engine assembles them.

    Args:
      names: drafters, in the priority order wanted; ``'lookup'`` (`LOOKUP`) adds
        prompt-lookup drafting over the verifier's tokenizer (`prompt_lookup_drafter`:
        temperature 1, cost 0), unless the zoo has a drafter of that name.
      temperatures / costs: overrides, either aligned with ``names`` or a mapping
        name -> value (missing names keep their defaults).

    Returns:
      A `specjax.engine.deployment.Deployment`: identity maps for drafters sharing
      the verifier's tokenizer, token-level-intersection maps otherwise; groups are
      tokenizer fingerprints; text is spelt with the verifier's tokenizer and each
      drafter's own; ``stop_table`` marks the verifier tokens whose bytes hold ``\\n``.
    """
    if isinstance(names, str):
        names = (names,)
    names = tuple(zoo.names if names is None else names)
    if not names:
        raise ConfigError(
            'zoo deployment names: got an empty list; allowed: one or more of '
            f'{", ".join(map(repr, zoo.names))}'
        )
    if len(set(names)) != len(names):
        raise ConfigError(f'zoo deployment names: got {list(names)}; allowed: distinct names')
    v = zoo.verifier
    # `LOOKUP` (unless the zoo has a model of that name): prompt-lookup drafting over the
    # verifier's tokenizer, built here (it has no weights in the zoo).
    models = [
        prompt_lookup_drafter(v.lm, v.tokenizer)
        if n == LOOKUP and n not in zoo.names
        else zoo.drafter(n)
        for n in names
    ]
    models = [
        m if isinstance(m, tuple) else (m.name, m.lm, m.params, m.tokenizer, m.temperature, m.cost)
        for m in models
    ]
    temps = _per_drafter('temperatures', temperatures, names, [m[4] for m in models])
    cost = _per_drafter('costs', costs, names, [m[5] for m in models])
    return assemble(
        v.lm, v.params, v.tokenizer, [m[:4] + (t, c) for m, t, c in zip(models, temps, cost)]
    )


#: The drafter name `from_zoo` reads as prompt-lookup drafting.
LOOKUP = 'lookup'


def prompt_lookup_drafter(
    verifier_lm,
    tokenizer,
    name: str = LOOKUP,
    max_ngram: int = 3,
    min_ngram: int = 1,
    temperature: float = 1.0,
    cost: float = 0.0,
    max_len: int | None = None,
) -> tuple:
    """A prompt-lookup (n-gram) drafter over the verifier's vocabulary, as the
    ``(name, lm, params, tokenizer, temperature, cost)`` tuple `assemble` takes.

    Give it the verifier's own tokenizer: it then shares the verifier's ids (identity
    maps). Its proposals are copied from the row's context (`specjax.models.ngram`), its
    ``q`` is one-hot at any temperature, it has no parameters (``{}``) and its cost defaults
    to 0. `max_len` (default the verifier's) bounds its history's capacity.
    """
    from specjax.models.ngram import PromptLookupLM  # pylint: disable=import-outside-toplevel

    lm = PromptLookupLM(
        vocab_size=int(verifier_lm.vocab_size),
        max_len=int(verifier_lm.max_len if max_len is None else max_len),
        max_ngram=int(max_ngram),
        min_ngram=int(min_ngram),
    )
    return (name, lm, lm.init_params(), tokenizer, float(temperature), float(cost))


def _prompt_encoder(tok, bos: bool):
    prefix = tuple(getattr(tok, 'prompt_prefix', ())) if bos else ()
    if not prefix:
        return tok.encode
    return lambda text: list(prefix) + tok.encode(text)


def _in_ids(encode, table: np.ndarray):
    """``encode`` followed by the id map ``table`` (verifier id -> drafter id)."""
    return lambda text: [int(i) for i in table[np.asarray(encode(text), np.int64)]]


def assemble(verifier_lm, v_params, v_tok, drafters, bos: bool = True) -> "Deployment":
    """A deployment from a verifier and drafters given as (name, lm, params, tokenizer,
    temperature, cost): for drafters of the verifier's tokenizer, the maps their kind
    drafts with (`spec.drafting_maps`: identity maps; a feature drafter drawn over its
    head's ids; a `SubsetVocabLM` as its inner model in its own ids, its prompts in those
    ids), token-level-intersection maps otherwise; groups are tokenizer
    fingerprints; text is spelt with the verifier's tokenizer and each drafter's own; ``stop_table`` marks the verifier tokens
    whose bytes hold a newline. With `bos`, each model's prompts start with the special
    ids its tokenizer's own pipeline puts first (a tokenizer's ``prompt_prefix``: Llama's
    ``<s>``; none for the zoo's tokenizers)."""
    from specjax.tokenizers import intersection_map, retokenization_table  # pylint: disable=import-outside-toplevel

    vocab = verifier_lm.vocab_size
    specs, data, groups, encoders = [], [], [], []
    for name, lm, params, tok, t, c in drafters:
        same = tok.fingerprint() == v_tok.fingerprint()
        if same:  # as its kind drafts (a subset-vocabulary drafter: its inner model)
            lm, d = drafting_maps(lm, params, vocab)
        spec = DrafterSpec(name=name, lm=lm, temperature=float(t), cost=float(c))
        validate_drafter(spec)
        if not same:
            to_v = intersection_map(tok, v_tok)
            retok, retok_len = retokenization_table(v_tok, tok)
            d = cross_vocab_maps(params, to_v, retok, retok_len, vocab)
        specs.append(spec)
        data.append(d)
        groups.append(tok.fingerprint())
        enc = _prompt_encoder(tok, bos)
        if same and not d.identity:  # it reads ids of its own (a subset's "other" row)
            enc = _in_ids(enc, np.asarray(d.from_verifier))
        encoders.append(enc)
    stop = np.array([b'\n' in b for b in v_tok.all_token_bytes()], bool)
    return Deployment(
        verifier=verifier_lm,
        v_params=v_params,
        drafters=tuple(specs),
        d_data=tuple(data),
        groups=tuple(groups),
        encode=_prompt_encoder(v_tok, bos),
        decode=v_tok.decode,
        drafter_encode=tuple(encoders),
        stop_table=stop,
    )


def build_deployment(
    verifier, drafters: Sequence[tuple[str, Any, float, float | None]], bos: bool = True
):
    """A `Deployment` from loaded models.

    Args:
      verifier: an `HFModel` (or anything with ``lm``, ``params``, ``tokenizer``).
      drafters: (name, model, temperature, cost or None) in priority order; a missing cost
        is the drafter's parameter count over the verifier's.
      bos: start every model's prompts with the special ids its tokenizer's pipeline puts
        first (e.g. Llama's ``<s>``); see `HFTokenizer.prompt_prefix`.
    """
    n_v = _n_params(verifier.params)
    return assemble(
        verifier.lm,
        verifier.params,
        verifier.tokenizer,
        [
            (
                name,
                m.lm,
                m.params,
                m.tokenizer,
                temperature,
                _n_params(m.params) / n_v if cost is None else float(cost),
            )
            for name, m, temperature, cost in drafters
        ],
        bos=bos,
    )


def _n_params(params) -> int:
    return int(sum(math.prod(x.shape) for x in jax.tree.leaves(params)))


def _per_drafter(field, value, names, defaults) -> list[float]:
    if value is None:
        return list(defaults)
    if isinstance(value, Mapping):
        unknown = sorted(set(value) - set(names))
        if unknown:
            raise ConfigError(
                f'zoo deployment {field}: got names {unknown}; allowed: '
                f'{", ".join(map(repr, names))}'
            )
        return [float(value.get(n, d)) for n, d in zip(names, defaults)]
    value = list(value)
    if len(value) != len(names):
        raise ConfigError(
            f'zoo deployment {field}: got {len(value)} values for '
            f'{len(names)} drafters {list(names)}; allowed: one per drafter'
        )
    return [float(x) for x in value]
