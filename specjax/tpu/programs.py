"""The engine's own programs with a deployment's shardings, as abstract arguments.

`serve_form` puts a model in the form a TPU mesh serves it in (KV heads repeated to the
model axis, a tied head stored as its own ``[D, V]`` array: see there). `forward_program`
is the sharded forward a decode step (k = 1) or a k-token score runs. `drafter` builds one
drafter of each kind the engine has — a transformer of the verifier's tokenizer, a
subset-vocabulary (FR-Spec) drafter, the EAGLE feature drafter, prompt lookup, and a
transformer of another tokenizer (the cross-vocabulary path) — with abstract weights.
`generate_program` / `ar_program` / `state_programs` are the speculative and
autoregressive generates and the plan runner's calls on carried state, built by the
engine's own `speculative_call` / `autoregressive_call`, their arguments made abstract
with the deployment's shardings.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from specjax.engine.autoregressive import autoregressive_call
from specjax.engine.generate import speculative_call
from specjax.engine.spec import DrafterSpec, EngineConfig, cross_vocab_maps, drafting_maps
from specjax.engine.state import EngineState
from specjax.models import drafter_kinds
from specjax.models.api import TransformerConfig, TransformerLM
from specjax.models.drafter_kind import DrafterKind
from specjax.models.kv_heads import serve_form as _serve_form
from specjax.runtime import sharding as shd
from specjax.runtime.backend import tracing_for
from specjax.verify import registry

__all__ = [
    'DRAFTER_KINDS',
    'OTHER_TOKENIZER',
    'abstract_tree',
    'ar_program',
    'drafter',
    'entry_kind',
    'forward_program',
    'generate_program',
    'serve_form',
    'state_programs',
]

#: Entries naming a drafter kind over another tokenizer than the verifier's (the
#: cross-vocabulary path, token-level-intersection maps): the kind each one is.
OTHER_TOKENIZER = {'cross': drafter_kinds.DEFAULT.name}
#: The vocabulary of a drafter of another tokenizer built without a model of its own.
OTHER_VOCAB = 32768
#: What a planner config's drafter ``kind`` may name: every kind that builds an example
#: (`DrafterKind.example`), then `OTHER_TOKENIZER`'s entries.
DRAFTER_KINDS = tuple(k.name for k in drafter_kinds.all_kinds() if k.example) + tuple(
    OTHER_TOKENIZER
)


def serve_form(lm, params, model_shards: int):
    """`specjax.models.kv_heads.serve_form` with the head untied: the form a TPU mesh
    serves a model in (KV heads repeated to the model axis, a tied head as its own array)."""
    return _serve_form(lm, params, model_shards, untie_head=True)


def _for_tpu(fn):
    """Builds a program's arguments as a TPU traces them (`specjax.runtime.backend.tracing_for`):
    the caches' layout and shardings are the TPU's (`specjax.models.cache.values_slots_minor`)."""

    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        with tracing_for('tpu'):
            return fn(*args, **kwargs)

    return wrapped


def _named(mesh, spec=None):
    return NamedSharding(mesh, spec or PartitionSpec())


def abstract_tree(tree, shardings):
    """Every leaf of ``tree`` (arrays or ShapeDtypeStructs) as a ShapeDtypeStruct with
    the matching sharding of ``shardings`` (a tree of the same structure, or one
    sharding for all)."""
    if isinstance(shardings, jax.sharding.Sharding):
        return jax.tree.map(
            lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=shardings), tree
        )
    return jax.tree.map(
        lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings
    )


@_for_tpu
def forward_program(
    lm, params, mesh, rules, batch: int, k: int, capacity: int, param_layouts='auto'
):
    """``(jitted, args)``: the sharded forward of ``k`` tokens per row over a cache of
    ``capacity`` slots (`specjax.runtime.sharding.make_sharded_forward`: decode rules, the cache
    donated, the weights' layouts the compiler's choice unless ``param_layouts=None``)."""
    fwd = shd.make_sharded_forward(lm, mesh, batch, k, rules, param_layouts=param_layouts)
    aparams = abstract_tree(params, fwd.param_shardings)
    cache = jax.eval_shape(lambda: lm.init_cache(batch, capacity))
    acache = abstract_tree(cache, fwd.cache_shardings)
    tok = jax.ShapeDtypeStruct((batch, k), jnp.int32, sharding=_named(mesh))
    mask = jax.ShapeDtypeStruct((batch, k, k), jnp.bool_, sharding=_named(mesh))
    return fwd.jitted, (aparams, acache, tok, tok, mask)


@dataclasses.dataclass(frozen=True)
class Drafter:
    """One abstract drafter: its spec (model, temperature, γ) and its arrays (weights
    abstract, id maps concrete), and the width of its prompts in its own ids."""

    spec: DrafterSpec
    data: Any
    vocab: int


def _small_config(verifier_cfg: TransformerConfig, vocab: int, preset=None) -> TransformerConfig:
    if preset is not None:
        return dataclasses.replace(preset, vocab_size=vocab) if vocab else preset
    return dataclasses.replace(
        verifier_cfg,
        vocab_size=vocab,
        d_model=256,
        n_layers=4,
        n_heads=4,
        n_kv_heads=2,
        d_ff=688,
        tie_embeddings=True,
        embed_input_scale=False,
        rope_scaling=(),
        qkv_bias=False,
    )


def entry_kind(kind: str) -> DrafterKind:
    """The drafter kind a planner config's drafter ``kind`` names (an `OTHER_TOKENIZER`
    entry: the kind it is over another tokenizer)."""
    return drafter_kinds.get(OTHER_TOKENIZER.get(kind, kind))


def drafter(
    kind: str,
    verifier: TransformerLM,
    *,
    name: str | None = None,
    lm: TransformerLM | None = None,
    kept: int = 4096,
    retok_width: int = 4,
    gamma: int | None = None,
    temperature: float = 1.0,
) -> Drafter:
    """An abstract drafter of ``kind`` (one of `DRAFTER_KINDS`: a registered drafter kind's
    name, `specjax.models.drafter_kinds`, or an entry of `OTHER_TOKENIZER`) for
    ``verifier``, built as its kind builds an example (`DrafterKind.example`).

    ``lm``: the drafter's own transformer (default a 4-layer d256 model; its layers for a
    kind over a subset of the verifier's ids); ``kept``: the head's ids of a kind that has
    one; ``retok_width``: the most drafter tokens one verifier token spells into (another
    tokenizer). Id maps are concrete (their shapes are what the program depends on; their
    values are placeholders)."""
    if kind not in DRAFTER_KINDS:
        raise ValueError(f'drafter kind: got {kind!r}; allowed: one of {DRAFTER_KINDS}')
    v = verifier.vocab_size
    name = name or kind
    other = kind in OTHER_TOKENIZER
    own = lm or TransformerLM(_small_config(verifier.config, OTHER_VOCAB if other else v))
    d_lm, params = entry_kind(kind).example(verifier, own, kept)
    if other:
        dv = d_lm.vocab_size
        n = min(dv, v)
        to_v = np.where(np.arange(dv) < n, np.arange(dv) % max(n, 1), -1).astype(np.int32)
        retok = (np.arange(v)[:, None] + np.arange(retok_width)[None, :]) % dv
        data = cross_vocab_maps(params, to_v, retok, np.ones((v,), np.int32), v)
    else:
        d_lm, data = drafting_maps(d_lm, params, v)
    spec = DrafterSpec(name=name, lm=d_lm, temperature=temperature, gamma=gamma)
    return Drafter(spec, data, d_lm.vocab_size)


def _param_shardings(lm, params, mesh, rules):
    """Shardings for a model's parameters: by their logical axes where the model has
    them (transformers), replicated otherwise."""
    if hasattr(lm, 'param_logical_axes') and hasattr(lm, 'abstract_params'):
        try:
            return shd.logical_to_sharding(
                lm.param_logical_axes(), mesh, shd.decode_rules(rules), shapes=params
            )
        except (ValueError, TypeError):
            pass
    return jax.tree.map(lambda _: _named(mesh), params)


def _abstract_args(args, verifier, drafters, mesh, rules):
    """A call's arguments with every leaf abstract: the verifier's and the drafters'
    weights sharded by their logical axes, every other array replicated."""
    v_params, d_data = args[0], args[1]
    v_abs = abstract_tree(v_params, _param_shardings(verifier, v_params, mesh, rules))
    rest = abstract_tree(args[2:], _named(mesh))
    if not isinstance(d_data, tuple):  # the autoregressive call: (v_params, ...)
        return (v_abs, abstract_tree(d_data, _named(mesh))) + rest
    d_abs = []
    for d, data in zip(drafters, d_data):
        lm = d.spec.lm
        inner = getattr(lm, 'inner', lm)
        p = abstract_tree(data.params, _param_shardings(inner, data.params, mesh, rules))
        others = abstract_tree(data.replace(params=None), _named(mesh))
        d_abs.append(others.replace(params=p))
    return (v_abs, tuple(d_abs)) + rest


def _prompts(batch: int, width: int, vocab: int) -> list[list[int]]:
    return [[(7 * b + i) % vocab for i in range(width)] for b in range(batch)]


@_for_tpu
def generate_program(
    verifier: TransformerLM,
    v_params,
    drafters: list[Drafter],
    mesh,
    rules,
    *,
    rule: str = 'rejection',
    gamma: int = 3,
    batch: int = 1,
    prompt_len: int = 64,
    new_tokens: int = 64,
    reserve: int = 0,
    return_state: bool = False,
):
    """``(fn, statics, args)``: the speculative generate from prompts, arguments abstract."""
    fn, statics, args = _speculative_call(
        verifier,
        v_params,
        drafters,
        _prompts(batch, prompt_len, verifier.vocab_size),
        [_prompts(batch, prompt_len, d.vocab) for d in drafters],
        rule=rule,
        gamma=gamma,
        batch=batch,
        new_tokens=new_tokens,
        reserve=reserve,
        return_state=return_state,
    )
    return fn, statics, _abstract_args(args, verifier, drafters, mesh, rules)


def _speculative_call(
    verifier, v_params, drafters, prompts, d_prompts, *, rule, gamma, batch, new_tokens, **kw
):
    """`speculative_call` of `drafters` under `rule` at γ for `batch` rows (zero row keys):
    one chain for a one-chain rule, else one per drafter, every row the same slots; `kw`
    (state, reserve, return_state) passed on."""
    n_slots = 1 if registry.get(rule).one_chain else len(drafters)
    cfg = EngineConfig(gamma=gamma, rule=rule, n_slots=n_slots, max_new_tokens=new_tokens)
    slots = np.tile(np.arange(n_slots, dtype=np.int32), (batch, 1))
    return speculative_call(
        cfg,
        verifier,
        v_params,
        [d.spec for d in drafters],
        [d.data for d in drafters],
        prompts,
        d_prompts,
        np.zeros((batch, 2), np.uint32),
        slots=slots,
        **kw,
    )


@_for_tpu
def ar_program(verifier, v_params, mesh, rules, *, batch=1, prompt_len=64, new_tokens=64):
    """``(fn, statics, args)``: the autoregressive baseline from prompts, abstract."""
    fn, statics, args = autoregressive_call(
        verifier,
        v_params,
        _prompts(batch, prompt_len, verifier.vocab_size),
        np.zeros((batch, 2), np.uint32),
        temperature=1.0,
        max_new_tokens=new_tokens,
    )
    return fn, statics, _abstract_args(args, verifier, [], mesh, rules)


@_for_tpu
def state_programs(
    verifier,
    v_params,
    drafters,
    mesh,
    rules,
    *,
    rule='rejection',
    gamma=3,
    batch=1,
    prompt_len=64,
    new_tokens=32,
) -> dict[str, tuple]:
    """The plan runner's calls on carried state, ``{name: (fn, statics, args)}``:

    - ``plan_first``: a plan's first step (prompts in, the state out, later steps reserved);
    - ``plan_continue``: a later speculative step continuing that state;
    - ``plan_fallback``: a verifier-only (autoregressive) step continuing it;
    - ``state_rows``: the carried state's rows picked for the next call (`EngineState.rows`).
    """
    first = generate_program(
        verifier,
        v_params,
        drafters,
        mesh,
        rules,
        rule=rule,
        gamma=gamma,
        batch=batch,
        prompt_len=prompt_len,
        new_tokens=new_tokens,
        reserve=2 * new_tokens,
        return_state=True,
    )
    fn, statics, args = first
    out_shape = jax.eval_shape(lambda *a: fn(*a, **statics), *args)
    state: EngineState = out_shape['state']
    state_abs = abstract_tree(state, _named(mesh))
    # The continuation's host-side arguments come from the call builder with a stand-in
    # state of the same structure (its values are never read: only shapes go on).
    concrete = jax.tree.map(lambda s: np.zeros(s.shape, s.dtype), state)
    c_fn, c_statics, c_args = _speculative_call(
        verifier,
        v_params,
        drafters,
        None,
        None,
        rule=rule,
        gamma=gamma,
        batch=batch,
        new_tokens=new_tokens,
        state=concrete,
        return_state=True,
    )
    c_args = _abstract_args(c_args, verifier, drafters, mesh, rules)
    c_args = c_args[:6] + (state_abs,) + c_args[7:]
    a_fn, a_statics, a_args = autoregressive_call(
        verifier,
        v_params,
        None,
        np.zeros((batch, 2), np.uint32),
        temperature=1.0,
        max_new_tokens=new_tokens,
        state=concrete,
        return_state=True,
    )
    a_args = _abstract_args(a_args, verifier, [], mesh, rules)
    a_args = a_args[:1] + (state_abs,) + a_args[2:]
    rows_fn = jax.jit(lambda s, idx: s.rows(idx))
    idx = jax.ShapeDtypeStruct((batch,), jnp.int32, sharding=_named(mesh))
    return {
        'plan_first': first,
        'plan_continue': (c_fn, c_statics, c_args),
        'plan_fallback': (a_fn, a_statics, a_args),
        'state_rows': (rows_fn, {}, (state_abs, idx)),
    }
