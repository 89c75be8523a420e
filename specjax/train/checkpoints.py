"""Checkpoints: orbax directories for training, single ``.npz`` files for shipping.

Training checkpoints (:func:`save` / :func:`restore` / :func:`latest_step`) are orbax
``CheckpointManager`` step directories holding ``params`` and ``opt_state``
(``StandardSave`` / ``StandardRestore(abstract)``: bit-exact, sharding-aware, no
warnings) and a JSON ``metadata`` item. The metadata records a sha256 of every saved
array, so silent corruption of the array data is caught on restore, not only damage
that orbax itself notices.

Shipped model files (:func:`save_params_file` / :func:`load_params_file`) are one
uncompressed ``.npz``: a zip of raw arrays, one member per parameter (named by its
'/'-joined path), plus a JSON header with dtypes, shapes and the sha256. Why ``.npz``:
it is a single file (git- and manifest-friendly, unlike an orbax directory of many small
files), it loads with plain numpy in milliseconds without any flax or orbax version
coupling, and it is bit-exact because the bytes are stored raw (bfloat16 is stored as
its uint16 bit pattern). The zip's CRCs catch truncation; the sha256 catches the rest.

Every failure to find or read a checkpoint is a one-line ``ValueError`` naming the path.
"""

from __future__ import annotations

import hashlib
import json
import os
import zipfile
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath

from specjax.atomic import atomic_file

FORMAT = 'specjax-params-npz/1'
_META_KEY = '__specjax_meta__'


# ----------------------------------------------------------------------------------------
# Tree helpers
# ----------------------------------------------------------------------------------------


def _key_str(k) -> str:
    for attr in ('key', 'name', 'idx'):
        if hasattr(k, attr):
            return str(getattr(k, attr))
    return str(k)


def _flatten(tree) -> list[tuple[str, Any]]:
    flat, _ = jax.tree_util.tree_flatten_with_path(tree)
    return [('/'.join(_key_str(k) for k in path), leaf) for path, leaf in flat]


def _one_line(e: BaseException) -> str:
    msg = ' '.join(str(e).split())
    return f'{type(e).__name__}: {msg[:300]}'


def tree_sha256(tree) -> str:
    """sha256 over every leaf's path, dtype, shape and raw bytes, in flattening order."""
    h = hashlib.sha256()
    for path, leaf in _flatten(tree):
        arr = np.asarray(jax.device_get(leaf))
        h.update(f'{path}|{arr.dtype.name}|{arr.shape}|'.encode())
        h.update(np.ascontiguousarray(arr).tobytes())
    return h.hexdigest()


def _addressable(tree) -> bool:
    return all(getattr(x, 'is_fully_addressable', True) for x in jax.tree.leaves(tree))


def _as_abstract(tree):
    def f(x):
        if isinstance(x, jax.ShapeDtypeStruct):
            return x
        sharding = x.sharding if isinstance(x, jax.Array) else None
        return jax.ShapeDtypeStruct(np.shape(x), x.dtype, sharding=sharding)

    return jax.tree.map(f, tree)


# ----------------------------------------------------------------------------------------
# Orbax step directories
# ----------------------------------------------------------------------------------------


def _manager(directory: str, create: bool, max_to_keep: int | None = None):
    options = ocp.CheckpointManagerOptions(
        max_to_keep=max_to_keep, create=create, enable_async_checkpointing=False
    )
    return ocp.CheckpointManager(os.path.abspath(directory), options=options)


def save(
    directory: str,
    step: int,
    params,
    opt_state=None,
    metadata: dict | None = None,
    *,
    max_to_keep: int | None = None,
) -> str:
    """Saves one step (synchronously) and returns its directory.

    Args:
      directory: the checkpoint root (created if missing); steps are subdirectories.
      step: the training step (an int >= 0); an existing step is an error.
      params: pytree of arrays. opt_state: optional optax state pytree.
      metadata: JSON-serialisable dict (config, history, ...).
      max_to_keep: keep only the newest N steps (None: keep all).
    """
    metadata = dict(metadata or {})
    try:
        json.dumps(metadata)
    except TypeError as e:
        raise ValueError(
            f'checkpoint {directory}: metadata is not JSON-serialisable ({_one_line(e)})'
        ) from None
    items = {'params': params} if opt_state is None else {'params': params, 'opt_state': opt_state}
    if _addressable(items):
        metadata['_sha256'] = {k: tree_sha256(v) for k, v in items.items()}
    args = {k: ocp.args.StandardSave(v) for k, v in items.items()}
    args['metadata'] = ocp.args.JsonSave(metadata)
    with _manager(directory, create=True, max_to_keep=max_to_keep) as mngr:
        if step in mngr.all_steps():
            raise ValueError(f'checkpoint {directory}: step {step} already exists')
        mngr.save(int(step), args=ocp.args.Composite(**args))
        mngr.wait_until_finished()
    return os.path.join(os.path.abspath(directory), str(int(step)))


def latest_step(directory: str) -> int | None:
    """The newest complete step in ``directory``, or None if there is none."""
    if not os.path.isdir(directory):
        return None
    with _manager(directory, create=False) as mngr:
        return mngr.latest_step()


def restore(
    directory: str, abstract, step: int | None = None, *, opt_state_abstract=None
) -> dict[str, Any]:
    """Restores a step bit-exactly into the structure (and shardings) of ``abstract``.

    Args:
      directory: the checkpoint root.
      abstract: params pytree of ``jax.ShapeDtypeStruct`` (e.g. ``lm.abstract_params()``)
        or of arrays (their shapes, dtypes and shardings are used).
      step: which step (default: the latest).
      opt_state_abstract: also restore the optimizer state into this structure.

    Returns:
      ``{'step', 'params', 'opt_state' (None unless requested), 'metadata'}``.
    """
    if not os.path.isdir(directory):
        raise ValueError(f'checkpoint {directory}: no such directory')
    with _manager(directory, create=False) as mngr:
        steps = mngr.all_steps()
        if not steps:
            raise ValueError(f'checkpoint {directory}: no complete checkpoint step in it')
        step = max(steps) if step is None else int(step)
        if step not in steps:
            raise ValueError(f'checkpoint {directory}: no step {step} (available: {sorted(steps)})')
        where = os.path.join(os.path.abspath(directory), str(step))
        items = {'params': abstract}
        if opt_state_abstract is not None:
            items['opt_state'] = opt_state_abstract
        args = {k: ocp.args.StandardRestore(_as_abstract(v)) for k, v in items.items()}
        args['metadata'] = ocp.args.JsonRestore()
        for name, tree in items.items():
            _check_item(where, name, tree)
        try:
            out = mngr.restore(step, args=ocp.args.Composite(**args))
        except Exception as e:  # orbax / tensorstore raise many types
            raise ValueError(
                f'checkpoint {where}: unreadable or incompatible ({_one_line(e)})'
            ) from e
    metadata = dict(out['metadata'] or {})
    digests = metadata.pop('_sha256', {})
    for name in items:
        if name in digests and _addressable(out[name]) and tree_sha256(out[name]) != digests[name]:
            raise ValueError(f'checkpoint {where}: {name} data is corrupt (sha256 mismatch)')
    return {
        'step': step,
        'params': out['params'],
        'opt_state': out.get('opt_state'),
        'metadata': metadata,
    }


def _check_item(where: str, name: str, abstract) -> None:
    """Compares an item's stored tree (names, shapes, dtypes) with ``abstract``.

    Done before restoring because a mismatch inside orbax's restore leaves its asyncio
    machinery dangling (an 'Event loop is closed' error at garbage collection), and
    because this names the offending parameter.
    """
    path = os.path.join(where, name)
    if not os.path.isdir(path):
        raise ValueError(f'checkpoint {where}: has no {name!r} item')
    try:
        stored = ocp.StandardCheckpointHandler().metadata(epath.Path(path)).tree
    except Exception as e:
        raise ValueError(f'checkpoint {where}: {name} is unreadable ({_one_line(e)})') from e
    have = {k: v for k, v in _flatten(stored)}
    want = _flatten(abstract)
    missing = [k for k, _ in want if k not in have]
    extra = sorted(set(have) - {k for k, _ in want})
    if missing or extra:
        raise ValueError(
            f'checkpoint {where}: {name} names differ from the requested structure '
            f'(missing {missing[:4]}, unexpected {extra[:4]})'
        )
    for key, ref in want:
        got = have[key]
        if tuple(got.shape) != tuple(ref.shape) or np.dtype(got.dtype) != np.dtype(ref.dtype):
            raise ValueError(
                f'checkpoint {where}: {name}/{key} is stored as '
                f'{np.dtype(got.dtype).name}{list(got.shape)}, requested '
                f'{np.dtype(ref.dtype).name}{list(ref.shape)}'
            )


# ----------------------------------------------------------------------------------------
# Single-file params (.npz)
# ----------------------------------------------------------------------------------------


def _storable(arr: np.ndarray) -> np.ndarray:
    """Numpy-native dtypes as they are; others (bfloat16, ...) as their raw bits."""
    if arr.dtype.kind in 'biuf' and arr.dtype.type.__module__ == 'numpy':
        return arr
    return arr.view(np.dtype(f'u{arr.dtype.itemsize}'))


def save_params_file(path: str, params) -> str:
    """Writes ``params`` to one ``.npz`` file (atomically) and returns its sha256."""
    arrays = {}
    header = {'format': FORMAT, 'arrays': {}}
    for key, leaf in _flatten(params):
        arr = np.ascontiguousarray(np.asarray(jax.device_get(leaf)))
        arrays[key] = _storable(arr)
        header['arrays'][key] = {'dtype': arr.dtype.name, 'shape': list(arr.shape)}
    header['sha256'] = tree_sha256(params)
    arrays[_META_KEY] = np.frombuffer(json.dumps(header).encode(), np.uint8)
    os.makedirs(os.path.dirname(os.path.abspath(path)) or '.', exist_ok=True)
    with atomic_file(path) as f:
        np.savez(f, **arrays)
    return header['sha256']


def load_params_file(path: str, abstract, expected_sha256: str | None = None):
    """Loads a :func:`save_params_file` file into the structure of ``abstract``.

    Shapes and dtypes must match exactly; the stored sha256 (and ``expected_sha256``,
    e.g. from a model manifest, if given) must match the loaded arrays.
    """
    if not os.path.isfile(path):
        raise ValueError(f'params file {path}: no such file')
    try:
        with np.load(path, allow_pickle=False) as z:
            header = json.loads(bytes(z[_META_KEY]).decode())
            stored = {k: z[k] for k in z.files if k != _META_KEY}
    except (
        zipfile.BadZipFile,
        ValueError,
        KeyError,
        OSError,
        EOFError,
        json.JSONDecodeError,
        UnicodeDecodeError,
    ) as e:
        raise ValueError(
            f'params file {path}: corrupt or not a specjax params file ({_one_line(e)})'
        ) from None
    if header.get('format') != FORMAT:
        raise ValueError(
            f'params file {path}: format {header.get("format")!r}, expected {FORMAT!r}'
        )
    want = _flatten(abstract)
    want_keys, have_keys = [k for k, _ in want], set(stored)
    missing, extra = (
        [k for k in want_keys if k not in have_keys],
        sorted(have_keys - set(want_keys)),
    )
    if missing or extra:
        raise ValueError(
            f'params file {path}: parameter names differ from the model '
            f'(missing {missing[:4]}, unexpected {extra[:4]})'
        )
    leaves = []
    for key, ref in want:
        info = header['arrays'][key]
        dtype = np.dtype(jax.numpy.dtype(info['dtype']))
        arr = stored[key].view(dtype).reshape(info['shape'])
        if tuple(arr.shape) != tuple(ref.shape) or arr.dtype != np.dtype(ref.dtype):
            raise ValueError(
                f'params file {path}: {key} is {arr.dtype.name}{list(arr.shape)}, '
                f'the model expects {np.dtype(ref.dtype).name}{list(ref.shape)}'
            )
        leaves.append(arr)
    tree = jax.tree.unflatten(jax.tree.structure(abstract), leaves)
    digest = tree_sha256(tree)
    if digest != header.get('sha256'):
        raise ValueError(
            f'params file {path}: corrupt (sha256 {digest[:12]}… does not match the '
            f'recorded {str(header.get("sha256"))[:12]}…)'
        )
    if expected_sha256 is not None and digest != expected_sha256:
        raise ValueError(
            f'params file {path}: sha256 {digest[:12]}… is not the expected {expected_sha256[:12]}…'
        )

    def place(arr, ref):
        sharding = getattr(ref, 'sharding', None)
        return jax.device_put(arr, sharding) if sharding is not None else jax.numpy.asarray(arr)

    return jax.tree.map(place, tree, abstract)
