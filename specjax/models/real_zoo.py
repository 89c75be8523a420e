"""Drafters of the real verifier (SmolLM2-135M-Instruct), shipped as package data.

``specjax/zoo_smollm2/`` holds one ``{name}.npz`` (parameters, bf16 floats) and one
``{name}.json`` (config, recipe, training record, held-out α) per distilled drafter, made
by ``make train-drafters`` (`experiments/train_drafters.py`, `specjax.train.distill`)::

    lm, params, info = load_drafter('code')              # the shipped code drafter
    lm, params, info = load_drafter('runs/drafters/drafter_code.npz')

The drafters are `SubsetVocabLM`s in the verifier's token ids (its tokenizer, identity
maps). The deployment that puts them beside the verifier is
`specjax.engine.deployment.from_smollm2`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

from specjax.atomic import atomic_file, atomic_write_text
from specjax.errors import NPZ_ERRORS, ConfigError
from specjax.models.api import order_weights
from specjax.models.cache import table_values
from specjax.models.eagle import EAGLE, EagleLM, order_eagle
from specjax.models.subset_vocab import SubsetVocabLM
from specjax.models.transformer import TransformerConfig

__all__ = [
    'DRAFTER_DIR',
    'DISTILLED',
    'GEMMA3_DIR',
    'save_drafter',
    'load_drafter',
    'drafter_path',
    'export_hf',
    'save_eagle',
    'load_eagle',
]

#: The shipped drafters' folder (package data).
DRAFTER_DIR = Path(__file__).resolve().parents[1] / 'zoo_smollm2'
#: Gemma-3-270M's shipped feature drafter's folder (`specjax.runner.deployments.gemma3`).
GEMMA3_DIR = Path(__file__).resolve().parents[1] / 'zoo_gemma3'
#: The distilled drafters, in priority order.
DISTILLED = ('code', 'prose')


def drafter_path(name_or_path, folder: Path | None = None) -> Path:
    """A shipped drafter's ``.npz`` by name (in ``folder``, default `DRAFTER_DIR`), or the
    path given."""
    p = Path(name_or_path)
    if p.suffix == '.npz':
        return p
    return (DRAFTER_DIR if folder is None else Path(folder)) / f'{name_or_path}.npz'


def save_drafter(
    path, lm: SubsetVocabLM, params, info: dict[str, Any], dtype: str | None = None
) -> Path:
    """Writes ``path`` (.npz: parameters, floats cast to ``dtype`` if given) and its
    ``.json`` (config + ``info``), each atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    flat = {}
    for kp, v in jax.tree_util.tree_flatten_with_path(params)[0]:
        a = np.asarray(v)
        if dtype is not None and a.dtype.kind == 'f':
            a = a.astype(ml_dtypes.bfloat16 if dtype == 'bfloat16' else dtype)
        if a.dtype == ml_dtypes.bfloat16:  # npz has no bf16: stored as its raw bits
            a = a.view(np.uint16)
            flat['bf16:' + '/'.join(str(getattr(k, 'key', k)) for k in kp)] = a
        else:
            flat['/'.join(str(getattr(k, 'key', k)) for k in kp)] = a
    with atomic_file(path) as f:
        np.savez(f, **flat)
    meta = {'config': lm.config.to_dict(), 'verifier_vocab': lm.verifier_vocab, **info}
    atomic_write_text(path.with_suffix('.json'), json.dumps(meta, indent=1))
    return path


def _read(path: Path, dtype: str, make_lm):
    """(lm, params, info) from ``path`` and its ``.json``; ``make_lm(cfg, info)``."""
    jpath = path.with_suffix('.json')
    if not path.is_file() or not jpath.is_file():
        raise ConfigError(
            f'drafter {path}: missing (and/or {jpath.name}); allowed: a drafter '
            f'written by experiments/train_drafters.py or train_eagle.py, or a shipped '
            f'name {list(DISTILLED) + ["eagle"]}'
        )
    try:
        info = json.loads(jpath.read_text())
        if not isinstance(info, dict):
            raise TypeError(f'a JSON {type(info).__name__}, not an object')
        cfg = TransformerConfig.from_dict(dict(info['config'], dtype=dtype, param_dtype=dtype))
        lm = make_lm(cfg, info)
    except (OSError, json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
        raise ConfigError(f'drafter {jpath}: unreadable ({type(e).__name__}: {e})') from None
    return lm, _read_params(path, dtype), info


def load_drafter(name_or_path, dtype: str = 'float32', out_first: bool = False):
    """(SubsetVocabLM, params, info) of a drafter file; floats as ``dtype``; with
    ``out_first`` its projection weights stored ``[out, in]`` (`api.order_weights`).

    Raises:
      ConfigError: one line naming the file (missing, unreadable, inconsistent).
    """
    path = drafter_path(name_or_path)
    lm, params, info = _read(
        path, dtype, lambda cfg, info: SubsetVocabLM(cfg, int(info['verifier_vocab']))
    )
    want = jax.tree.map(lambda s: s.shape, lm.abstract_params())
    got = jax.tree.map(lambda a: a.shape, params)
    if want != got:
        raise ConfigError(f'drafter {path}: parameters do not match its config {info["config"]}')
    if bool(out_first) != bool(lm.config.out_first):
        inner, p = order_weights(lm.inner, params['inner'], out_first)
        lm, params = SubsetVocabLM(inner.config, lm.verifier_vocab), dict(params, inner=p)
    return lm, params, info


def save_eagle(path, lm, params, info: dict[str, Any], dtype: str | None = None) -> Path:
    """A feature drafter (`specjax.models.eagle`): its trained ``net`` and ``keep`` only
    (the verifier's table and head rows are rebuilt at load)."""
    info = {'kind': EAGLE.name, **info, 'feature_layers': list(lm.feature_layers)}
    return save_drafter(path, lm, {'net': params['net'], 'keep': params['keep']}, info, dtype)


def load_eagle(
    name_or_path,
    verifier,
    dtype: str = 'float32',
    out_first: bool = False,
    folder: Path | None = None,
):
    """(EagleLM, params, info) of a feature drafter file, its frozen table and head the
    verifier's (``verifier``: a model with ``.params['embed']``, e.g. `gguf.smollm2`);
    with ``out_first`` its projections stored ``[out, in]`` (`eagle.order_eagle`); a name
    is looked up in ``folder`` (default `DRAFTER_DIR`; `GEMMA3_DIR` for Gemma-3-270M's)."""
    path = drafter_path(name_or_path, folder)
    lm, saved, info = _read(
        path,
        dtype,
        lambda cfg, info: EagleLM(
            cfg, int(info['verifier_vocab']), tuple(info.get('feature_layers', ()))
        ),
    )
    if info.get('kind') != EAGLE.name or set(saved) != {'net', 'keep'}:
        raise ConfigError(f'drafter {path}: not a feature drafter (train_eagle.py writes those)')
    table = verifier.params['embed']
    if isinstance(table, jax.ShapeDtypeStruct):  # a verifier loaded without weights
        abstract = lm.abstract_params()
        lm, params = order_eagle(
            lm, {**abstract, 'net': saved['net'], 'keep': saved['keep']}, out_first
        )
        return lm, params, info
    embed = table_values(jnp.asarray(table), verifier.lm.config.param_dtype)
    embed = embed.astype(jnp.dtype(dtype))
    try:
        params = lm.attach(saved['net'], embed, saved['keep'])
    except ValueError as e:
        raise ConfigError(f'drafter {path}: does not fit this verifier ({e})') from None
    want = jax.tree.map(lambda s: s.shape, lm.abstract_params())
    if want != jax.tree.map(lambda a: a.shape, params):
        raise ConfigError(f'drafter {path}: parameters do not match its config {info["config"]}')
    lm, params = order_eagle(lm, params, out_first)
    return lm, params, info


def _read_params(path: Path, dtype: str) -> dict:
    params: dict = {}
    try:
        with np.load(path) as z:
            for k in z.files:
                v = z[k]
                if k.startswith('bf16:'):
                    k, v = k[5:], v.view(ml_dtypes.bfloat16)
                if v.dtype.kind == 'f' or v.dtype == ml_dtypes.bfloat16:
                    v = v.astype(jnp.dtype(dtype))
                node = params
                *head, last = k.split('/')
                for h in head:
                    node = node.setdefault(h, {})
                node[last] = jnp.asarray(v)
    except NPZ_ERRORS as e:  # a truncated zip is a BadZipFile, a bad member a zlib.error
        raise ConfigError(
            f'drafter {path}: unreadable ({type(e).__name__}: {" ".join(str(e).split())}); '
            f'allowed: a drafter .npz written by experiments/train_drafters.py or train_eagle.py'
        ) from None
    return params


def export_hf(path, lm: SubsetVocabLM, params) -> Path:
    """The drafter as a Hugging Face Llama folder over the verifier's whole vocabulary
    (for a peer's assisted generation on the same weights).

    The input embedding of every verifier id is its inner row (the "other" row for ids
    outside the subset). HF has no head bias to give those ids probability 0, so their
    head rows are the "other" row's: a greedy HF assistant proposes what specjax's
    drafter proposes except where the "other" logit is the largest — there it proposes
    the first id outside the subset, which the verifier then rejects.
    """
    import dataclasses  # pylint: disable=import-outside-toplevel

    from specjax.models.api import TransformerLM  # pylint: disable=import-outside-toplevel
    from specjax.models.hf import save_hf  # pylint: disable=import-outside-toplevel

    cfg = dataclasses.replace(
        lm.config,
        vocab_size=lm.verifier_vocab,
        tie_embeddings=False,
        embed_input_scale=False,
        dtype='float32',
        param_dtype='float32',
    )
    inner = jax.tree.map(lambda a: np.asarray(a, np.float32), params['inner'])
    table = inner['embed'][np.asarray(params['to_inner'])]  # [V, d]
    head = inner['embed'] if lm.config.tie_embeddings else inner['lm_head'].T
    full_head = head[np.asarray(params['to_inner'])]  # [V, d]
    out = {k: v for k, v in inner.items() if k not in ('embed', 'lm_head')}
    out['embed'] = table
    out['lm_head'] = np.ascontiguousarray(full_head.T)
    return save_hf(path, TransformerLM(cfg), jax.tree.map(jnp.asarray, out), family='llama')
