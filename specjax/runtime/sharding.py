"""Device mesh, logical axis rules, and sharded placement of models and caches.

Parameters and activations are annotated with *logical* axis names ('vocab', 'embed',
'heads', 'mlp', 'batch', ...). A rules tuple maps each logical name to a mesh axis
('data', 'model') or to ``None`` (replicated). Changing the parallelism layout is a
config change (a different rules tuple), never a model change.

Today's API only: ``jax.make_mesh`` with Auto axis types, ``jax.set_mesh``,
``jax.jit(..., in_shardings=..., out_shardings=...)``, ``NamedSharding``/``PartitionSpec``.

Two conventions that make small models shard on any mesh:

- a dimension whose size is not divisible by its mesh axes is replicated instead
  (``jax.device_put`` refuses uneven shardings); a tiny model with 2 KV heads on a
  4-way 'model' axis therefore keeps K/V projections replicated and shards the rest;
- a mesh axis is used at most once per array: a later dimension mapping to an axis
  already used in the same spec is replicated.

This module imports nothing from ``specjax.models``: the model calls
:func:`with_logical_constraint`, and the helpers take any LM duck-typed.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

MESH_AXES = ('data', 'model')

LogicalAxes = tuple[str | None, ...]
Rules = tuple[tuple[str, str | tuple[str, ...] | None], ...]

# Logical name -> mesh axis. Batch is data-parallel; the wide dimensions (vocabulary,
# attention heads, MLP hidden units) are split over 'model' (Megatron-style); the model
# width 'embed', sequence positions and the cache's length stay replicated.
DEFAULT_RULES: Rules = (
    ('batch', 'data'),
    ('vocab', 'model'),
    ('embed', None),
    ('heads', 'model'),
    ('kv_heads', 'model'),
    ('head_dim', None),
    ('mlp', 'model'),
    ('length', None),
    ('cache_length', None),
    ('layers', None),
)


# Named rule sets, chosen in a config (`sharding.rules = 'fsdp_tp'`):
#   'tp'         tensor parallelism over 'model' (Megatron-style; DEFAULT_RULES), batch on 'data'
#   'fsdp'       fully sharded data parallelism: every parameter split over 'data' along
#                its model width ('embed'), gathered per layer by XLA; batch on 'data'
#   'fsdp_tp'    both: 'embed' over 'data', the wide dimensions over 'model'
#   'replicated' parameters on every device, batch on 'data' (plain data parallelism)
FSDP_RULES: Rules = (
    ('batch', 'data'),
    ('embed', 'data'),
    ('vocab', None),
    ('heads', None),
    ('kv_heads', None),
    ('head_dim', None),
    ('mlp', None),
    ('length', None),
    ('cache_length', None),
    ('layers', None),
)
FSDP_TP_RULES: Rules = tuple((n, 'data') if n == 'embed' else (n, a) for n, a in DEFAULT_RULES)
REPLICATED_RULES: Rules = (('batch', 'data'),)
RULE_SETS: dict[str, Rules] = {
    'tp': DEFAULT_RULES,
    'fsdp': FSDP_RULES,
    'fsdp_tp': FSDP_TP_RULES,
    'replicated': REPLICATED_RULES,
}


def decode_rules(rules) -> Rules:
    """``rules`` as a decode step is served: where a weight's width is split over 'data'
    (``fsdp``, ``fsdp_tp``), the batch is not.

    FSDP is a training layout: its weights are split over the axis the batch is split
    over, so a forward all-gathers every weight it reads. Decoding one token per step
    that is the whole model gathered per step (the TPU compiler hoists the gathers out of
    the decode loop, holding all of them at once: Llama-3.1-70B at batch 8 on a v5e-16
    under ``fsdp_tp`` needed 17 GiB of temporaries on 15.75 GiB chips). Served with the
    batch replicated over 'data', the weights stay where they are and each product
    reduces its partial sums over 'data' instead (activations, a few KiB per token,
    move; weights never do).
    """
    rules = resolve_rules(rules)
    table = dict(rules)
    if table.get('batch') is None:
        return rules
    batch_axes = set(table['batch'] if isinstance(table['batch'], tuple) else (table['batch'],))
    for name, axis in rules:
        if name == 'batch' or axis is None:
            continue
        if batch_axes & set(axis if isinstance(axis, tuple) else (axis,)):
            return tuple((n, None) if n == 'batch' else (n, a) for n, a in rules)
    return rules


def resolve_rules(rules) -> Rules:
    """A rule-set name (a key of `RULE_SETS`), a rules sequence, or None (the default)."""
    if isinstance(rules, str):
        if rules not in RULE_SETS:
            raise ValueError(
                f'sharding rules: got {rules!r}, allowed: one of '
                f'{", ".join(map(repr, RULE_SETS))} or a list of (logical, axis) pairs'
            )
        return RULE_SETS[rules]
    return normalize_rules(rules)


def make_mesh(data: int, model: int) -> Mesh:
    """A ('data', 'model') mesh of ``data * model`` devices with Auto axis types.

    Auto axes let XLA propagate shardings from the annotated inputs (an Explicit mesh,
    today's default in ``jax.make_mesh``, rejects the embedding gather).
    """
    for name, value in (('data', data), ('model', model)):
        if not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(f'make_mesh: {name}={value!r} must be an integer >= 1')
    n_dev = jax.device_count()
    if data * model > n_dev:
        raise ValueError(
            f'make_mesh: data*model={data}*{model}={data * model} exceeds the '
            f'{n_dev} available devices (allowed: data*model <= {n_dev})'
        )
    return jax.make_mesh(
        (data, model),
        MESH_AXES,
        axis_types=(AxisType.Auto,) * 2,
        devices=jax.devices()[: data * model],
    )


def normalize_rules(rules: Sequence[Sequence[Any]] | None) -> Rules:
    """Validates a rules sequence (e.g. a list of pairs read from a ConfigDict).

    Returns a hashable tuple of ``(logical_name, mesh_axis | tuple | None)`` pairs;
    ``None`` means :data:`DEFAULT_RULES`.
    """
    if rules is None:
        return DEFAULT_RULES
    out = []
    for i, rule in enumerate(rules):
        if len(rule) != 2 or not isinstance(rule[0], str):
            raise ValueError(
                f'sharding rules[{i}]={rule!r}: must be a pair (logical_name: str, '
                f'mesh axis in {MESH_AXES} | tuple of them | None)'
            )
        name, axis = rule
        axes = axis if isinstance(axis, (tuple, list)) else (axis,)
        for a in axes:
            if a is not None and a not in MESH_AXES:
                raise ValueError(
                    f'sharding rules[{i}]={rule!r}: mesh axis {a!r} is not one of '
                    f'{MESH_AXES} or None'
                )
        out.append((name, tuple(axis) if isinstance(axis, list) else axis))
    return tuple(out)


def _axes_size(mesh_shape: dict[str, int], axis) -> int:
    axes = axis if isinstance(axis, tuple) else (axis,)
    return int(np.prod([mesh_shape[a] for a in axes]))


def logical_to_spec(
    logical: LogicalAxes,
    rules: Rules = DEFAULT_RULES,
    shape: Sequence[int] | None = None,
    mesh_shape: dict[str, int] | None = None,
) -> PartitionSpec:
    """Maps one array's logical axis names to a ``PartitionSpec``.

    Unknown names and ``None`` are replicated. With ``shape`` and ``mesh_shape`` given, a
    dimension not divisible by its mesh axes is replicated (see the module docstring).
    """
    table = dict(rules)
    used: set[str] = set()
    spec = []
    for d, name in enumerate(logical):
        axis = table.get(name) if name is not None else None
        axes = axis if isinstance(axis, tuple) else (axis,)
        if axis is None or any(a in used for a in axes):
            spec.append(None)
            continue
        if mesh_shape is not None:
            if any(a not in mesh_shape for a in axes):
                spec.append(None)
                continue
            if shape is not None and shape[d] % _axes_size(mesh_shape, axis):
                spec.append(None)
                continue
        used.update(axes)
        spec.append(axis)
    return PartitionSpec(*spec)


def _is_logical(x) -> bool:
    return isinstance(x, tuple) and all(a is None or isinstance(a, str) for a in x)


def logical_to_sharding(
    tree_of_logical_names, mesh: Mesh, rules: Rules = DEFAULT_RULES, shapes=None
):
    """A tree of logical-name tuples -> a tree of ``NamedSharding`` on ``mesh``.

    Args:
      tree_of_logical_names: pytree whose leaves are tuples of logical names (or None).
      mesh: the device mesh.
      rules: logical -> mesh axis rules.
      shapes: optional pytree (same structure) of arrays / ``ShapeDtypeStruct``; when
        given, non-divisible dimensions are replicated.
    """
    rules = resolve_rules(rules)
    mesh_shape = dict(mesh.shape)
    if shapes is None:
        return jax.tree.map(
            lambda names: NamedSharding(mesh, logical_to_spec(names, rules, None, mesh_shape)),
            tree_of_logical_names,
            is_leaf=_is_logical,
        )
    return jax.tree.map(
        lambda names, x: NamedSharding(mesh, logical_to_spec(names, rules, x.shape, mesh_shape)),
        tree_of_logical_names,
        shapes,
        is_leaf=_is_logical,
    )


def shard_params(params, mesh: Mesh, rules: Rules = DEFAULT_RULES, *, logical_axes):
    """Places ``params`` on ``mesh`` by their logical axes (``lm.param_logical_axes()``)."""
    shardings = logical_to_sharding(logical_axes, mesh, resolve_rules(rules), shapes=params)
    return jax.device_put(params, shardings)


def param_shardings(lm, mesh: Mesh, rules=DEFAULT_RULES):
    """``NamedSharding`` per parameter of ``lm`` (a rules tuple or a `RULE_SETS` name)."""
    return logical_to_sharding(
        lm.param_logical_axes(), mesh, resolve_rules(rules), shapes=lm.abstract_params()
    )


def shard_lm_params(lm, params, mesh: Mesh, rules=DEFAULT_RULES):
    """``params`` of ``lm`` placed on ``mesh`` by ``rules`` (name or tuple)."""
    return jax.device_put(params, param_shardings(lm, mesh, rules))


# ----------------------------------------------------------------------------------------
# Activation constraints
# ----------------------------------------------------------------------------------------

_ACTIVE_RULES: contextvars.ContextVar[Rules | None] = contextvars.ContextVar(
    'specjax_activation_rules', default=None
)


@contextlib.contextmanager
def activation_rules(rules: Rules = DEFAULT_RULES) -> Iterator[None]:
    """While tracing inside this context, :func:`with_logical_constraint` is active."""
    token = _ACTIVE_RULES.set(resolve_rules(rules))
    try:
        yield
    finally:
        _ACTIVE_RULES.reset(token)


def with_logical_constraint(x: jax.Array, logical: LogicalAxes) -> jax.Array:
    """``with_sharding_constraint`` by logical names; a no-op without rules and a mesh.

    Active only while tracing under :func:`activation_rules` and ``jax.set_mesh``, so the
    model code is identical on one device and on a mesh.
    """
    rules = _ACTIVE_RULES.get()
    if rules is None:
        return x
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return x
    spec = logical_to_spec(logical, rules, x.shape, dict(mesh.shape))
    return jax.lax.with_sharding_constraint(x, spec)


# ----------------------------------------------------------------------------------------
# Sharded forward
# ----------------------------------------------------------------------------------------


def cache_shardings(lm, batch: int, mesh: Mesh, rules: Rules = DEFAULT_RULES):
    """Shardings for ``lm.init_cache(batch)`` (batch on 'data', KV heads on 'model')."""
    abstract = jax.eval_shape(lambda: lm.init_cache(batch))
    return cache_like_shardings(abstract, mesh, rules)


def per_field_axes(cache) -> list[tuple[Any, LogicalAxes]]:
    """(array, logical names) for every array of a cache dataclass whose
    ``logical_axes()`` gives one name tuple per field (a field may hold one array or a
    pytree of per-layer arrays, all with those names)."""
    axes = type(cache).logical_axes()
    out = []
    for field in dataclasses.fields(cache):
        names = getattr(axes, field.name)
        out += [(a, names) for a in jax.tree.leaves(getattr(cache, field.name))]
    return out


def cache_like_shardings(cache, mesh: Mesh, rules: Rules = DEFAULT_RULES):
    """``NamedSharding`` for every array of ``cache`` (arrays or ShapeDtypeStructs), by
    the logical names of its field."""
    rules = resolve_rules(rules)
    mesh_shape = dict(mesh.shape)
    axes = type(cache).logical_axes()

    def field(name):
        names = getattr(axes, name)
        return jax.tree.map(
            lambda x: NamedSharding(mesh, logical_to_spec(names, rules, x.shape, mesh_shape)),
            getattr(cache, name),
        )

    return cache.replace(**{f.name: field(f.name) for f in dataclasses.fields(cache)})


def make_sharded_forward(
    lm, mesh: Mesh, batch: int, block: int, rules: Rules = DEFAULT_RULES, param_layouts=None
) -> Callable:
    """``lm.forward`` jitted over ``mesh`` with explicit in/out shardings, under
    ``decode_rules(rules)`` (weights stay in place: see `decode_rules`).

    Returns ``fn(params, cache, tokens, positions, block_mask) -> (logits, cache)`` with
    the same contract as ``lm.forward``, except that the cache passed in is donated
    (updated in place: use the returned one).

    ``param_layouts='auto'``: the compiler chooses each weight's memory layout for this
    program (`jax.experimental.layout.Layout.AUTO`) instead of the device's default. On a
    TPU the default layouts made it relay the attention weights on every call scoring more
    than one row (Llama-3.1-70B on a v5p-8: 240 copies, 32 MiB each for wo, per call);
    with its own choice, none. The parameters must then be placed in the compiled
    program's input formats once (``compiled.input_formats``), as a loader does. Params go in sharded by their logical axes,
    tokens/positions/mask/logits by batch on 'data', and the logits' vocabulary on
    'model'. ``block`` (T) is needed for the divisibility checks of the activations.
    """
    rules = decode_rules(rules)
    mesh_shape = dict(mesh.shape)

    def named(logical, shape):
        return NamedSharding(mesh, logical_to_spec(logical, rules, shape, mesh_shape))

    p_shard = logical_to_sharding(lm.param_logical_axes(), mesh, rules, shapes=lm.abstract_params())
    c_shard = cache_shardings(lm, batch, mesh, rules)
    tok_shard = named(('batch', 'length'), (batch, block))
    mask_shard = named(('batch', 'length', None), (batch, block, block))
    logit_shard = named(('batch', 'length', 'vocab'), (batch, block, lm.vocab_size))

    def fn(params, cache, tokens, positions, block_mask):
        with activation_rules(rules):
            return lm.forward(params, cache, tokens, positions, block_mask)

    p_in = p_shard
    if param_layouts == 'auto':
        from jax.experimental.layout import Format, Layout  # pylint: disable=import-outside-toplevel

        p_in = jax.tree.map(lambda s: Format(Layout.AUTO, s), p_shard)
    elif param_layouts is not None:
        raise ValueError(f"param_layouts: got {param_layouts!r}; allowed: None or 'auto'")
    jitted = jax.jit(
        fn,
        in_shardings=(p_in, c_shard, tok_shard, tok_shard, mask_shard),
        out_shardings=(logit_shard, c_shard),
        donate_argnums=(1,),  # the cache is updated in place, not copied per call
    )

    def call(params, cache, tokens, positions, block_mask):
        with jax.set_mesh(mesh):
            return jitted(params, cache, tokens, positions, block_mask)

    call.param_shardings = p_shard
    call.cache_shardings = c_shard
    call.jitted = jitted  # for ahead-of-time lowering (`specjax.tpu.aot.compile_for`)
    return call


# ----------------------------------------------------------------------------------------
# Whole deployments on a mesh
# ----------------------------------------------------------------------------------------


def shard_deployment(dep, mesh: Mesh, rules=DEFAULT_RULES):
    """A deployment (``specjax.engine.deployment.Deployment``, duck-typed) with the
    verifier's and every drafter's parameters placed on ``mesh`` by ``rules``.

    Nothing else changes: the engine's jitted programs take their shardings from these
    inputs (Auto mesh axes), so `speculative_generate`, `autoregressive_generate` and the
    plan runner run sharded as they are. Synthetic LMs (no logical axes) stay as they are.

    No activation constraints are added: `activation_rules` acts while tracing, and the
    engine's programs are cached by their static arguments and input avals, so a program
    traced under one rules tuple would be reused under another.
    """

    def place(lm, params):
        if not hasattr(lm, 'param_logical_axes'):
            return params
        return shard_lm_params(lm, params, mesh, rules)

    d_data = tuple(
        d.replace(params=place(s.lm, d.params)) for s, d in zip(dep.drafters, dep.d_data)
    )
    return dataclasses.replace(dep, v_params=place(dep.verifier, dep.v_params), d_data=d_data)
