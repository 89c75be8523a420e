"""Hugging Face checkpoints (every registered family, `specjax.models.families`: Llama,
Qwen2, Mistral, Gemma 3) in and out of specjax's transformer.

A Hugging Face model folder is ``config.json`` plus ``model.safetensors`` or shards
``model-0000i-of-0000n.safetensors`` listed in ``model.safetensors.index.json``::

    lm, params, family = load_hf('/models/qwen2-0.5b', max_len=2048)
    params = load_hf(path, mesh=mesh, rules='fsdp_tp')[1]     # straight into shards
    save_hf('/tmp/out', lm, params, family='llama')            # back to HF format

Local paths only: nothing here reaches a hub.

Loading streams. The safetensors files are memory-mapped and read one tensor at a
time (`specjax.models.safetensors_io`); each tensor is transformed (transposed / split
into heads) as a numpy *view* of the mapping, and only the slice a device holds is copied
out, converted to the parameter dtype and handed to that device
(``jax.make_array_from_callback``); its pages then leave the resident set. At no point is
there a second full copy of the model on the host: the peak beyond the final parameters
is one tensor. Exporting writes tensor by tensor the same way.

Layouts (HF ``nn.Linear`` weights are ``[out, in]``; specjax keeps ``[in, out]`` with
heads split out)::

    model.embed_tokens.weight           [V, D]      -> embed [V, D]
    layers.i.self_attn.q_proj.weight    [H*hd, D]   -> layer_i/attn/wq [D, H, hd]
    layers.i.self_attn.{k,v}_proj.weight[KV*hd, D]  -> layer_i/attn/w{k,v} [D, KV, hd]
    layers.i.self_attn.{q,k,v}_proj.bias            -> layer_i/attn/b{q,k,v} [N, hd]  (Qwen2)
    layers.i.self_attn.o_proj.weight    [D, H*hd]   -> layer_i/attn/wo [H, hd, D]
    layers.i.mlp.{gate,up}_proj.weight  [F, D]      -> layer_i/mlp/w_{gate,up} [D, F]
    layers.i.mlp.down_proj.weight       [D, F]      -> layer_i/mlp/w_down [F, D]
    layers.i.{input,post_attention}_layernorm.weight -> layer_i/{attn,mlp}_norm/scale
    model.norm.weight                   [D]         -> final_norm/scale
    lm_head.weight                      [V, D]      -> lm_head [D, V]  (absent when tied)
    (Gemma 3: self_attn.{q,k}_norm -> attn/{q,k}_norm, post_attention_layernorm ->
    attn_post_norm, pre_/post_feedforward_layernorm -> mlp_norm / mlp_post_norm: its
    family's `hf_names`)

Every problem with a folder (missing file or tensor, wrong shape or dtype, unknown
architecture or unsupported field, truncated or corrupt safetensors file) raises one
`specjax.errors.ConfigError` line naming the file and the tensor or field.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jax
import ml_dtypes
import numpy as np

from specjax.atomic import atomic_write_bytes, atomic_write_text
from specjax.models import families
from specjax.models.api import TransformerLM
from specjax.models.fused import separate_leaf
from specjax.models.hf_config import FAMILIES, _fail, config_from_hf, hf_config, read_config_json
from specjax.models.safetensors_io import ST_NAMES, TensorInfo, TensorMaps, read_header, write_file
from specjax.models.transformer import TransformerConfig
from specjax.runtime import sharding as shd

__all__ = [
    'FAMILIES',
    'HFCheckpoint',
    'HFModel',
    'config_from_hf',
    'hf_config',
    'read_checkpoint',
    'load_hf',
    'load_hf_model',
    'check_hf_model',
    'load_hf_params',
    'save_hf',
    'estimate_bytes',
]

INDEX = 'model.safetensors.index.json'
SINGLE = 'model.safetensors'
# Tensors some checkpoints carry that are recomputed, not parameters.
_IGNORED_SUFFIXES = ('.rotary_emb.inv_freq',)


# ----------------------------------------------------------------------------------------
# Tensor names and layouts
# ----------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Entry:
    """One specjax leaf: its path, the HF tensor it comes from, and the layout change."""

    path: tuple[str, ...]
    hf_name: str
    hf_shape: tuple[int, ...]
    to_jax: Callable[[np.ndarray], np.ndarray]  # HF view -> specjax view (no copy)
    to_hf: Callable[[np.ndarray], np.ndarray]  # specjax array -> HF layout


def _entries(cfg: TransformerConfig, family=None) -> list[_Entry]:
    """Every leaf of ``cfg``'s params with its HF tensor, named as ``family`` names them
    (a registered family or its name; None: Llama's names)."""
    names = families.get(family or 'llama').hf_names
    d, h, kv, hd, f, v = (
        cfg.d_model,
        cfg.n_heads,
        cfg.n_kv_heads,
        cfg.head_dim,
        cfg.d_ff,
        cfg.vocab_size,
    )
    ident = lambda x: x  # noqa: E731
    tr = lambda x: x.T  # noqa: E731

    def heads_in(n):  # [n*hd, d] -> [d, n, hd]
        return (lambda x: x.T.reshape(d, n, hd)), (lambda x: x.reshape(d, n * hd).T)

    out = [_Entry(('embed',), 'model.embed_tokens.weight', (v, d), ident, ident)]
    for i in range(cfg.n_layers):
        p, L = f'layer_{i}', f'model.layers.{i}'
        qf, qb = heads_in(h)
        kf, kb = heads_in(kv)
        layer = [
            ((p, 'attn_norm', 'scale'), (d,), ident, ident),
            ((p, 'attn', 'wq'), (h * hd, d), qf, qb),
            ((p, 'attn', 'wk'), (kv * hd, d), kf, kb),
            ((p, 'attn', 'wv'), (kv * hd, d), kf, kb),
            (
                (p, 'attn', 'wo'),
                (d, h * hd),
                lambda x: x.T.reshape(h, hd, d),
                lambda x: x.reshape(h * hd, d).T,
            ),
        ]
        if cfg.qk_norm:
            layer += [((p, 'attn', n, 'scale'), (hd,), ident, ident) for n in ('q_norm', 'k_norm')]
        if cfg.post_norms:
            layer.append(((p, 'attn_post_norm', 'scale'), (d,), ident, ident))
        layer += [
            ((p, 'mlp_norm', 'scale'), (d,), ident, ident),
            ((p, 'mlp', 'w_gate'), (f, d), tr, tr),
            ((p, 'mlp', 'w_up'), (f, d), tr, tr),
            ((p, 'mlp', 'w_down'), (d, f), tr, tr),
        ]
        if cfg.post_norms:
            layer.append(((p, 'mlp_post_norm', 'scale'), (d,), ident, ident))
        if cfg.qkv_bias:
            for name, n in (('q', h), ('k', kv), ('v', kv)):
                layer.append(
                    (
                        (p, 'attn', f'b{name}'),
                        (n * hd,),
                        (lambda x, n=n: x.reshape(n, hd)),
                        (lambda x, n=n: x.reshape(n * hd)),
                    )
                )
        out += [_Entry(path, f'{L}.{names[path[1:]]}', *rest) for path, *rest in layer]
    out.append(_Entry(('final_norm', 'scale'), 'model.norm.weight', (d,), ident, ident))
    if not cfg.tie_embeddings:
        out.append(_Entry(('lm_head',), 'lm_head.weight', (v, d), tr, tr))
    return out


# ----------------------------------------------------------------------------------------
# safetensors: headers, memory maps, writing
# ----------------------------------------------------------------------------------------


@dataclasses.dataclass
class HFCheckpoint:
    """A checked HF folder: its config, family and every tensor's location."""

    path: Path
    hf: dict
    config: TransformerConfig
    family: str
    tensors: dict[str, TensorInfo]

    @property
    def lm(self) -> TransformerLM:
        return TransformerLM(self.config)


def read_checkpoint(
    path, *, max_len: int | None = None, dtype: str = 'float32', param_dtype: str | None = None
) -> HFCheckpoint:
    """Reads ``config.json`` and the safetensors headers, and checks every tensor the
    model needs is present with its shape (no tensor data is read)."""
    root = Path(path)
    if not root.is_dir():
        raise _fail(
            f'hf checkpoint {root}: no such directory (a local folder holding '
            f'config.json and *.safetensors)'
        )
    cpath = root / 'config.json'
    if not cpath.is_file():
        raise _fail(f'hf checkpoint {root}: missing config.json')
    hf = read_config_json(cpath)
    cfg, family = config_from_hf(
        hf, max_len=max_len, dtype=dtype, param_dtype=param_dtype, where=str(cpath)
    )
    if (root / INDEX).is_file():
        try:
            weight_map = json.loads((root / INDEX).read_text(encoding='utf-8'))['weight_map']
            if not isinstance(weight_map, dict) or not all(
                isinstance(v, str) and v and '/' not in v for v in weight_map.values()
            ):
                raise TypeError('weight_map is not an object of tensor -> file name')
        except (OSError, json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError) as e:
            raise _fail(f'{root / INDEX}: corrupt index ({e!r})') from None
        files = sorted(set(weight_map.values()))
    elif (root / SINGLE).is_file():
        weight_map, files = None, [SINGLE]
    else:
        raise _fail(f'hf checkpoint {root}: no {SINGLE} or {INDEX} (only safetensors are read)')
    tensors: dict[str, TensorInfo] = {}
    for name in files:
        fpath = root / name
        if not fpath.is_file():
            raise _fail(f'{root / INDEX}: lists {name}, which is missing')
        tensors.update(read_header(fpath))
    if weight_map is not None:
        for name, fname in weight_map.items():
            if name in tensors and tensors[name].file.name != fname:
                raise _fail(
                    f'{root / INDEX}: tensor {name} is listed in {fname} but stored '
                    f'in {tensors[name].file.name}'
                )
    entries = _entries(cfg, family)
    wanted = {e.hf_name for e in entries}
    for e in entries:
        t = tensors.get(e.hf_name)
        if t is None:
            raise _fail(
                f'hf checkpoint {root}: missing tensor {e.hf_name} (config.json '
                f'describes a {family} model that needs it)'
            )
        if t.shape != e.hf_shape:
            raise _fail(
                f'{t.file}: tensor {e.hf_name} has shape {list(t.shape)}, config.json '
                f'implies {list(e.hf_shape)}'
            )
    extra = sorted(
        n
        for n in tensors
        if n not in wanted
        and not n.endswith(_IGNORED_SUFFIXES)
        and not (n == 'lm_head.weight' and cfg.tie_embeddings)
    )
    if extra:
        raise _fail(
            f'hf checkpoint {root}: unexpected tensor {extra[0]}'
            f'{f" (and {len(extra) - 1} more)" if len(extra) > 1 else ""} for a '
            f'{family} model with this config.json'
        )
    return HFCheckpoint(root, hf, cfg, family, tensors)


def _set(tree: dict, path: tuple[str, ...], value) -> None:
    for k in path[:-1]:
        tree = tree.setdefault(k, {})
    tree[path[-1]] = value


def _get(tree, path):
    for k in path:
        tree = tree[k]
    return tree


def place_leaf(
    params: dict, path: tuple[str, ...], view: np.ndarray, dtype, shardings=None
) -> None:
    """Puts one host array (often a view of a memory map) at ``path`` of ``params``: on
    the default device, or — with a params-shaped tree of ``shardings`` — each device
    copies out and converts only its own slice."""
    if shardings is None:
        arr = jax.device_put(np.array(view, dtype=dtype))
    else:
        arr = jax.make_array_from_callback(
            view.shape, _get(shardings, path), lambda idx: np.array(view[idx], dtype=dtype)
        )
    _set(params, path, jax.block_until_ready(arr))


def load_hf_params(ckpt: HFCheckpoint, shardings=None) -> dict:
    """Streams the checkpoint's tensors into specjax params.

    Args:
      ckpt: from `read_checkpoint`.
      shardings: None (default device) or a params-shaped pytree of ``jax.sharding``
        objects (e.g. from `specjax.runtime.sharding.param_shardings`): each device then receives
        only its slice, read straight from the memory map.

    Returns:
      The params pytree (``lm.abstract_params()`` structure, ``param_dtype`` leaves).
    """
    cfg = ckpt.config
    dtype = (
        np.dtype(ml_dtypes.bfloat16) if cfg.param_dtype == 'bfloat16' else np.dtype(cfg.param_dtype)
    )
    params: dict = {}
    maps = TensorMaps()
    try:
        for e in _entries(cfg, ckpt.family):
            t = ckpt.tensors[e.hf_name]
            place_leaf(params, e.path, e.to_jax(maps.view(t)), dtype, shardings)  # a view, no copy
            maps.release(t)
    finally:
        maps.close()
    return params


def load_hf(
    path,
    *,
    max_len: int | None = None,
    dtype: str = 'float32',
    param_dtype: str | None = None,
    mesh=None,
    rules=None,
):
    """(TransformerLM, params, family) from a local HF folder.

    Args:
      path: the folder (``config.json`` + safetensors).
      max_len: KV-cache capacity (see `config_from_hf`).
      dtype / param_dtype: compute and storage dtypes.
      mesh / rules: place the parameters on ``mesh`` by logical-axis ``rules`` (a rules
        tuple or a name in `specjax.runtime.sharding.RULE_SETS`) while streaming.
    """
    ckpt = read_checkpoint(path, max_len=max_len, dtype=dtype, param_dtype=param_dtype)
    lm = ckpt.lm
    shardings = None
    if mesh is not None:
        shardings = shd.param_shardings(lm, mesh, rules)
    return lm, load_hf_params(ckpt, shardings), ckpt.family


# ----------------------------------------------------------------------------------------
# Export
# ----------------------------------------------------------------------------------------


def _host(x) -> np.ndarray:
    """One leaf on the host (gathering its shards if needed)."""
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
        from jax.experimental import multihost_utils  # pylint: disable=import-outside-toplevel

        x = multihost_utils.process_allgather(x, tiled=True)
    return np.asarray(x)


def _folds(cfg: TransformerConfig, family) -> bool:
    """Whether a tied table with Gemma's input scale is exported untied with the scale
    folded into ``embed_tokens`` (a family with no input scale of its own)."""
    return cfg.tie_embeddings and cfg.embed_input_scale and not family.scales_embedding


def _export_tensors(
    lm: TransformerLM, params, family='llama'
) -> Iterator[tuple[str, Callable[[], np.ndarray], tuple, np.dtype]]:
    """(hf name, producer of its array, shape, dtype) in checkpoint order."""
    cfg = lm.config
    family = families.get(family, 'hf export family')
    fold = _folds(cfg, family)  # Gemma-style scale, a family without it: untie on export
    export_cfg = dataclasses.replace(
        cfg,
        tie_embeddings=cfg.tie_embeddings and not fold,
        fused_projections=False,
        out_first=False,
    )
    entries = _entries(export_cfg, family)
    dt = np.dtype(lm.abstract_params()['embed'].dtype)
    for e in entries:
        leaf_path = e.path

        def make(e=e, leaf_path=leaf_path):
            if leaf_path == ('lm_head',) and fold:  # the unscaled table, [V, D] as HF keeps it
                return np.ascontiguousarray(_host(separate_leaf(cfg, params, ('embed',))))
            x = _host(separate_leaf(cfg, params, leaf_path))
            if leaf_path == ('embed',) and fold:
                # The forward pass computes embed[tok] * sqrt(d) in the compute dtype; doing
                # the same product here keeps the exported model's inputs bit-identical.
                x = (x.astype(cfg.dtype) * np.asarray(cfg.d_model**0.5, cfg.dtype)).astype(x.dtype)
            return np.ascontiguousarray(e.to_hf(x))

        yield e.hf_name, make, e.hf_shape, dt


def save_hf(
    path,
    lm: TransformerLM,
    params,
    family: str = 'llama',
    *,
    max_shard_bytes: int = 2 << 30,
    tokenizer_json: str | None = None,
) -> Path:
    """Writes ``lm``/``params`` as an HF ``family`` folder (config.json + safetensors).

    Tensors are written one at a time (each gathered to the host, written, dropped), into
    files of at most ``max_shard_bytes`` (several files get a
    ``model.safetensors.index.json``). ``tokenizer_json``: a tokenizer.json to copy beside.
    """
    root = Path(path)
    root.mkdir(parents=True, exist_ok=True)
    cfg_json = hf_config(lm.config, family)
    if _folds(lm.config, families.get(family, 'hf export family')):
        cfg_json['tie_word_embeddings'] = False
    items = list(_export_tensors(lm, params, family))
    # Plan the files: consecutive tensors up to max_shard_bytes each.
    shards: list[list] = [[]]
    size = 0
    for it in items:
        nbytes = math.prod(it[2]) * it[3].itemsize
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(it)
        size += nbytes
    names = (
        [SINGLE]
        if len(shards) == 1
        else [f'model-{i + 1:05d}-of-{len(shards):05d}.safetensors' for i in range(len(shards))]
    )
    weight_map, total = {}, 0
    for fname, group in zip(names, shards):
        header, off = {'__metadata__': {'format': 'pt'}}, 0
        for name, _, shape, dt in group:
            n = math.prod(shape) * dt.itemsize
            header[name] = {
                'dtype': ST_NAMES[dt],
                'shape': list(shape),
                'data_offsets': [off, off + n],
            }
            off += n
            weight_map[name] = fname
        total += off
        write_file(root / fname, header, [(name, make) for name, make, _, _ in group])
    if len(shards) > 1:
        atomic_write_text(
            root / INDEX,
            json.dumps({'metadata': {'total_size': total}, 'weight_map': weight_map}, indent=2),
        )
    elif (root / INDEX).exists():
        (root / INDEX).unlink()
    atomic_write_text(root / 'config.json', json.dumps(cfg_json, indent=2))
    if tokenizer_json is not None:
        atomic_write_bytes(root / 'tokenizer.json', Path(tokenizer_json).read_bytes())
    return root


# ----------------------------------------------------------------------------------------
# Memory estimates
# ----------------------------------------------------------------------------------------


def estimate_bytes(
    cfg: TransformerConfig, batch: int = 1, mesh_shape: dict | None = None, rules=None
) -> dict[str, int]:
    """Per-device bytes of parameters and KV cache under ``rules`` on a mesh of
    ``mesh_shape`` (``{'data': n, 'model': m}``; None: one device).

    Counts each array's largest per-device slice (dimensions that do not divide their
    mesh axes are replicated, as `specjax.runtime.sharding` places them).
    """
    lm = TransformerLM(cfg)
    rules = shd.resolve_rules(rules)
    mesh_shape = dict(mesh_shape or {'data': 1, 'model': 1})

    def per_device(shape, logical, itemsize):
        spec = shd.logical_to_spec(logical, rules, shape, mesh_shape)
        n = 1
        for dim, axis in zip(shape, tuple(spec) + (None,) * (len(shape) - len(spec))):
            div = (
                1
                if axis is None
                else int(
                    np.prod([mesh_shape[a] for a in (axis if isinstance(axis, tuple) else (axis,))])
                )
            )
            n *= -(-dim // div)
        return n * itemsize

    p_item = np.dtype(
        ml_dtypes.bfloat16 if cfg.param_dtype == 'bfloat16' else cfg.param_dtype
    ).itemsize
    params = sum(
        per_device(a.shape, names, p_item)
        for a, names in zip(
            jax.tree.leaves(lm.abstract_params()),
            jax.tree.leaves(lm.param_logical_axes(), is_leaf=lambda x: isinstance(x, tuple)),
        )
    )
    cache = jax.eval_shape(lambda: lm.init_cache(batch))
    kv = sum(per_device(a.shape, names, a.dtype.itemsize) for a, names in shd.per_field_axes(cache))
    return {'params': int(params), 'kv_cache': int(kv), 'total': int(params + kv)}


# ----------------------------------------------------------------------------------------
# Model + tokenizer
# ----------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, eq=False)
class HFModel:
    """A loaded folder: functional LM, parameters, tokenizer and family."""

    path: Path
    family: str
    lm: TransformerLM
    params: Any
    tokenizer: Any

    @property
    def n_params(self) -> int:
        return int(sum(math.prod(x.shape) for x in jax.tree.leaves(self.params)))


def load_hf_model(
    path,
    *,
    tokenizer: str | os.PathLike | None = None,
    pad_vocab: bool = False,
    max_len: int | None = None,
    dtype: str = 'float32',
    param_dtype: str | None = None,
    mesh=None,
    rules=None,
) -> HFModel:
    """Model and tokenizer of a folder (``tokenizer.json`` beside ``config.json`` unless
    ``tokenizer`` names another file or folder).

    The tokenizer's ids must equal the embedding rows; with ``pad_vocab`` a tokenizer
    with fewer ids is padded with byte-less ids (real checkpoints often round their
    vocabulary up; `specjax.tokenizers.hf`). Checked before any tensor is read.
    """
    ckpt, tok = check_hf_model(
        path,
        tokenizer=tokenizer,
        pad_vocab=pad_vocab,
        max_len=max_len,
        dtype=dtype,
        param_dtype=param_dtype,
    )
    lm = ckpt.lm
    shardings = None if mesh is None else shd.param_shardings(lm, mesh, rules)
    return HFModel(ckpt.path, ckpt.family, lm, load_hf_params(ckpt, shardings), tok)


def check_hf_model(
    path,
    *,
    tokenizer: str | os.PathLike | None = None,
    pad_vocab: bool = False,
    max_len: int | None = None,
    dtype: str = 'float32',
    param_dtype: str | None = None,
) -> tuple[HFCheckpoint, Any]:
    """Everything `load_hf_model` checks, without reading a weight: ``config.json``
    (family, heads, rope, context), the safetensors headers (every shard present and
    complete, every tensor with its shape) and the tokenizer (present, its ids matching
    the embedding rows). Returns (checkpoint, tokenizer); raises one `ConfigError` line
    naming the file and the field."""
    from specjax.tokenizers.hf import load_hf_tokenizer  # pylint: disable=import-outside-toplevel

    ckpt = read_checkpoint(path, max_len=max_len, dtype=dtype, param_dtype=param_dtype)
    tok_path = Path(tokenizer) if tokenizer is not None else ckpt.path / 'tokenizer.json'
    if not tok_path.exists():
        raise _fail(
            f'hf checkpoint {ckpt.path}: no tokenizer ({tok_path} is missing; allowed: a '
            f'folder holding tokenizer.json beside config.json)'
        )
    tok = load_hf_tokenizer(tok_path, name=ckpt.path.name)
    rows = ckpt.config.vocab_size
    if tok.vocab_size != rows and not (pad_vocab and tok.vocab_size < rows):
        hint = ' (pad_vocab=True pads a smaller tokenizer)' if tok.vocab_size < rows else ''
        raise _fail(
            f'hf checkpoint {ckpt.path}: tokenizer {tok_path} has {tok.vocab_size} ids '
            f'but vocab_size (embedding rows of model.embed_tokens.weight) is {rows}; '
            f'allowed: equal{hint}'
        )
    if tok.vocab_size < rows:
        tok = load_hf_tokenizer(tok_path, pad_to=rows, name=ckpt.path.name)
    return ckpt, tok
