"""The shipped model zoo: one verifier and three drafters, and the loader that checks them.

Layout (built by ``experiments/train_zoo.py``)::

    zoo/manifest.json             what every file is, its sha256, and how it was made
    zoo/tokenizers/<name>.json    `Tokenizer.save` files
    zoo/models/<name>.npz         `checkpoints.save_params_file` files (f32)

The manifest's ``models`` map each model name to a record: ``role`` ('verifier' or
'drafter'), ``file`` and ``sha256`` (of the file's bytes), ``params_sha256`` (of the
arrays, `checkpoints.tree_sha256`), ``config`` (`TransformerConfig.to_dict`),
``n_params``, ``tokenizer`` (a key of ``tokenizers``), ``domains``, ``train`` (steps,
seed, wall-clock seconds, ...), ``heldout`` (per-domain losses and the unigram
baseline) and, for drafters, ``temperature``, ``cost`` and ``acceptance``. Drafters are
listed in ``drafter_order`` (code, prose, reasoning: the seed's 1.5B / 3B / 7B).

`load_zoo` verifies every file it reads against the manifest before using it; every
failure is a one-line `ConfigError` naming the file or model and what is wrong.
The zoo only loads; `specjax.engine.deployment.from_zoo` assembles a deployment from the
loaded models (the models layer never imports the engine), and `specjax.measure.evaluation`
measures them (held-out loss, unigram baseline, acceptance in verifier space, decode speed:
what the training script records and the tests re-measure).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from specjax.errors import ConfigError, env_value
from specjax.models.api import TransformerLM, count_params
from specjax.models.transformer import TransformerConfig
from specjax.tokenizers import Tokenizer, load_tokenizer
from specjax.train import checkpoints

__all__ = [
    'ZOO_FORMAT',
    'DRAFTER_ORDER',
    'Zoo',
    'ZooModel',
    'load_zoo',
    'default_zoo_path',
    'file_sha256',
]

ZOO_FORMAT = 'specjax-zoo/1'
MANIFEST = 'manifest.json'
VERIFIER = 'verifier'
#: The seed's drafters in priority order (its 1.5B code, 3B prose and 7B reasoning models).
DRAFTER_ORDER = ('code', 'prose', 'reasoning')
#: The zoo shipped as package data (``specjax/zoo/``: manifest, tokenizers, weights).
SHIPPED_ZOO = Path(__file__).resolve().parents[1] / 'zoo'
_REBUILD = 'rebuild it with `python experiments/train_zoo.py --out <zoo>`'


def default_zoo_path() -> Path:
    """``$SPECJAX_ZOO`` if set, else the zoo shipped inside the package (``specjax/zoo/``)."""
    env = env_value('SPECJAX_ZOO')  # a ConfigError naming the variable (a file, ~nosuchuser)
    if env is not None:
        return env
    return SHIPPED_ZOO


def _resolve(path) -> Path:
    if path is None:
        return default_zoo_path()
    p = Path(path)
    if not p.exists() and not p.is_absolute():
        # A relative path that is not under the working directory: try the repository.
        alt = Path(__file__).resolve().parents[2] / p
        if alt.exists():
            return alt
    return p


def file_sha256(path: str | os.PathLike) -> str:
    """sha256 (hex) of a file's bytes."""
    h = hashlib.sha256()
    with open(path, 'rb') as f:
        for chunk in iter(lambda: f.read(1 << 20), b''):
            h.update(chunk)
    return h.hexdigest()


# ----------------------------------------------------------------------------------------
# Loaded objects
# ----------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, eq=False)
class ZooModel:
    """One loaded model.

    Attributes:
      name: its manifest name ('verifier', 'code', 'prose', 'reasoning').
      role: 'verifier' or 'drafter'.
      lm: the functional LM (`TransformerLM`). params: its parameters (dict of arrays).
      tokenizer: its own tokenizer; tokenizer_name: the tokenizer's manifest key.
      domains: the domains it was trained on.
      temperature: default sampling temperature (1.0 for the verifier).
      cost: c_i = its parameter count / the verifier's (1.0 for the verifier).
      n_params: parameter count. record: its manifest record (read-only use).
    """

    name: str
    role: str
    lm: TransformerLM
    params: Any
    tokenizer: Tokenizer
    tokenizer_name: str
    domains: tuple[str, ...]
    temperature: float
    cost: float
    n_params: int
    record: Mapping[str, Any]

    @property
    def domain(self) -> str:
        """The drafter's domain (the first of ``domains``; 'mixed' for several)."""
        return self.domains[0] if len(self.domains) == 1 else 'mixed'

    def __repr__(self) -> str:
        return (
            f'ZooModel({self.name!r}, role={self.role}, n_params={self.n_params}, '
            f'tokenizer={self.tokenizer_name!r}, domains={self.domains}, '
            f'temperature={self.temperature}, cost={self.cost:.4f})'
        )


@dataclasses.dataclass(frozen=True, eq=False)
class Zoo:
    """A verified zoo: ``verifier`` and ``drafters`` (in ``drafter_order``)."""

    path: Path
    manifest: Mapping[str, Any]
    verifier: ZooModel
    drafters: tuple[ZooModel, ...]

    @property
    def names(self) -> tuple[str, ...]:
        """The loaded drafters' names, in priority order."""
        return tuple(d.name for d in self.drafters)

    def drafter(self, name: str) -> ZooModel:
        for d in self.drafters:
            if d.name == name:
                return d
        raise ConfigError(
            f'zoo drafter: got {name!r}; allowed: one of {", ".join(map(repr, self.names))}',
            field='drafter',
            value=name,
            allowed=self.names,
        )

    def model(self, name: str) -> ZooModel:
        return self.verifier if name == VERIFIER else self.drafter(name)


# ----------------------------------------------------------------------------------------
# Loading
# ----------------------------------------------------------------------------------------


def read_manifest(path=None) -> tuple[Path, dict]:
    """(zoo directory, parsed manifest), checking its format and top-level structure."""
    root = _resolve(path)
    mpath = root / MANIFEST
    if not root.is_dir():
        raise ConfigError(f'zoo {root}: no such directory ({_REBUILD})')
    if not mpath.is_file():
        raise ConfigError(f'zoo {root}: missing {MANIFEST} ({_REBUILD})')
    try:
        manifest = json.loads(mpath.read_text(encoding='utf-8'))
    except (ValueError, RecursionError) as e:  # not JSON, not UTF-8, nested too deep
        raise ConfigError(f'zoo manifest {mpath}: corrupt, not valid JSON ({_line(e)})') from None
    if not isinstance(manifest, dict):
        raise ConfigError(f'zoo manifest {mpath}: corrupt, expected a JSON object')
    if manifest.get('format') != ZOO_FORMAT:
        raise ConfigError(
            f'zoo manifest {mpath}: format {manifest.get("format")!r}, expected {ZOO_FORMAT!r}'
        )
    for key, kind in (('models', dict), ('tokenizers', dict), ('drafter_order', list)):
        if not isinstance(manifest.get(key), kind):
            raise ConfigError(
                f'zoo manifest {mpath}: missing or malformed {key!r} '
                f'(expected a JSON {"object" if kind is dict else "list"})'
            )
    _check_manifest(mpath, manifest)
    return root, manifest


_SHA256_HEX = frozenset('0123456789abcdef')


def _check_manifest(mpath: Path, manifest: dict) -> None:
    """Every field `load_zoo` reads, checked before any file is: one `ConfigError` naming
    the manifest, the field (``models.code.temperature``), the value and what is allowed."""
    tokenizers, models = manifest['tokenizers'], manifest['models']
    for name, rec in tokenizers.items():
        _check_file_record(mpath, f'tokenizers.{name}', rec)
        v = rec.get('vocab_size')
        if v is not None and not (_is_int(v) and v >= 1):
            raise _bad(mpath, f'tokenizers.{name}.vocab_size', v, 'an integer >= 1 (or absent)')
    for name, rec in models.items():
        _check_model(mpath, name, rec, tokenizers)
    if VERIFIER not in models:
        raise ConfigError(f'zoo manifest {mpath}: no model {VERIFIER!r} with role "verifier"')
    _check_drafter_lists(mpath, manifest, [n for n, r in models.items() if r['role'] == 'drafter'])


def _bad(mpath: Path, field: str, value, allowed: str) -> ConfigError:
    """The error for one manifest field: the manifest, the field, the value, what is allowed."""
    text = repr(value)
    text = text if len(text) <= 80 else text[:77] + '...'
    return ConfigError(
        f'zoo manifest {mpath}: {field}: got {text}, allowed: {allowed}',
        field=field,
        value=value,
        allowed=allowed,
    )


def _is_int(x) -> bool:
    """An int that is not a bool."""
    return isinstance(x, int) and not isinstance(x, bool)


def _is_number(x) -> bool:
    """A finite int or float that is not a bool."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _is_sha(x) -> bool:
    """A SHA-256 digest in 64 lowercase hex digits."""
    return isinstance(x, str) and len(x) == 64 and set(x) <= _SHA256_HEX


def _check_file_record(mpath: Path, field: str, rec) -> None:
    """A manifest entry naming a file: a JSON object with a file path and its sha256."""
    if not isinstance(rec, dict):
        raise _bad(mpath, field, rec, 'a JSON object')
    if not (isinstance(rec.get('file'), str) and rec['file'].strip()):
        raise _bad(
            mpath, f'{field}.file', rec.get('file'), 'a file path relative to the zoo folder'
        )
    if not _is_sha(rec.get('sha256')):
        raise _bad(mpath, f'{field}.sha256', rec.get('sha256'), '64 lowercase hex digits')


def _check_model(mpath: Path, name: str, rec, tokenizers: dict) -> None:
    """One ``models`` entry: its file, role, tokenizer, config, digests, size, domains, τ, cost."""
    field = f'models.{name}'
    _check_file_record(mpath, field, rec)
    role = rec.get('role')
    if role not in ('verifier', 'drafter'):
        raise _bad(mpath, f'{field}.role', role, "'verifier' or 'drafter'")
    if (role == 'verifier') != (name == VERIFIER):
        raise _bad(
            mpath,
            f'{field}.role',
            role,
            f"'verifier' for the model named {VERIFIER!r} only, 'drafter' for every other",
        )
    if rec.get('tokenizer') not in tokenizers:
        raise _bad(
            mpath,
            f'{field}.tokenizer',
            rec.get('tokenizer'),
            f'a key of tokenizers: {", ".join(map(repr, tokenizers)) or "(none)"}',
        )
    if not isinstance(rec.get('config', {}), dict):
        raise _bad(
            mpath, f'{field}.config', rec.get('config'), 'a JSON object of TransformerConfig fields'
        )
    if 'params_sha256' in rec and not (
        rec['params_sha256'] is None or _is_sha(rec['params_sha256'])
    ):
        raise _bad(mpath, f'{field}.params_sha256', rec['params_sha256'], '64 lowercase hex digits')
    n = rec.get('n_params')
    if n is not None and not (_is_int(n) and n >= 1):
        raise _bad(mpath, f'{field}.n_params', n, 'an integer >= 1 (or absent)')
    domains = rec.get('domains', [])
    if not (isinstance(domains, list) and all(isinstance(d, str) for d in domains)):
        raise _bad(mpath, f'{field}.domains', domains, 'a list of domain names')
    for key, allowed in (
        ('temperature', 'a finite number >= 0 (or absent: 1.0)'),
        ('cost', 'a finite number >= 0 (or absent: its parameter count over the verifier\'s)'),
    ):
        if key in rec and not (_is_number(rec[key]) and rec[key] >= 0):
            raise _bad(mpath, f'{field}.{key}', rec[key], allowed)


def _check_drafter_lists(mpath: Path, manifest: dict, drafters: list[str]) -> None:
    """``drafter_order`` (required, non-empty) and ``extra_drafters``: distinct drafter names."""
    allowed = (
        f'a list of distinct drafter names, each a model with role "drafter": '
        f'{", ".join(map(repr, drafters)) or "(none)"}'
    )
    for key, required in (('drafter_order', True), ('extra_drafters', False)):
        names = manifest.get(key, [])
        if key not in manifest and not required:
            continue
        if not isinstance(names, list) or (required and not names):
            raise _bad(mpath, key, names, ('a non-empty ' if required else 'a ') + allowed[2:])
        if len(set(map(repr, names))) != len(names):
            raise _bad(mpath, key, names, allowed)
        for n in names:
            if not isinstance(n, str) or n not in drafters:
                raise _bad(mpath, key, n, allowed)


def _line(e: BaseException) -> str:
    return ' '.join(str(e).split())[:300] or type(e).__name__


def _verified_file(root: Path, rec: Mapping[str, Any], what: str) -> Path:
    rel, sha = rec.get('file'), rec.get('sha256')
    if not isinstance(rel, str) or not isinstance(sha, str):
        raise ConfigError(f'zoo manifest {root / MANIFEST}: {what} lacks "file" or "sha256"')
    path = root / rel
    if not path.is_file():
        raise ConfigError(f'zoo file {path}: missing ({what}; {_REBUILD})')
    got = file_sha256(path)
    if got != sha:
        raise ConfigError(
            f'zoo file {path}: sha256 mismatch, corrupt or modified ({what}: '
            f'file {got[:12]}…, manifest {sha[:12]}…)'
        )
    return path


def _load_model(
    root: Path,
    manifest: dict,
    name: str,
    tokenizers: dict[str, Tokenizer],
    verifier_params: int | None,
) -> ZooModel:
    mpath = root / MANIFEST
    rec = manifest['models'][name]
    tok_name = rec.get('tokenizer')
    if tok_name not in manifest['tokenizers']:
        raise ConfigError(
            f'zoo manifest {mpath}: model {name!r} names tokenizer {tok_name!r}; '
            f'known: {", ".join(map(repr, manifest["tokenizers"]))}'
        )
    if tok_name not in tokenizers:
        trec = manifest['tokenizers'][tok_name]
        tpath = _verified_file(root, trec, f'tokenizer {tok_name!r}')
        try:
            tok = load_tokenizer(tpath)
        except ValueError as e:
            raise ConfigError(f'zoo file {tpath}: corrupt tokenizer ({_line(e)})') from None
        if trec.get('vocab_size') not in (None, tok.vocab_size):
            raise ConfigError(
                f'zoo file {tpath}: vocabulary size {tok.vocab_size}, the manifest '
                f'says {trec.get("vocab_size")}'
            )
        tokenizers[tok_name] = tok
    tok = tokenizers[tok_name]
    try:
        config = TransformerConfig.from_dict(dict(rec.get('config') or {}))
    except (TypeError, ValueError) as e:
        raise ConfigError(f'zoo model {name!r}: bad config in {mpath} ({_line(e)})') from None
    if config.vocab_size != tok.vocab_size:
        raise ConfigError(
            f'zoo model {name!r}: vocabulary mismatch, model vocab_size '
            f'{config.vocab_size} != tokenizer {tok_name!r} vocab_size '
            f'{tok.vocab_size}'
        )
    lm = TransformerLM(config)
    ppath = _verified_file(root, rec, f'model {name!r} parameters')
    try:
        params = checkpoints.load_params_file(
            str(ppath), lm.abstract_params(), expected_sha256=rec.get('params_sha256')
        )
    except ValueError as e:
        raise ConfigError(f'zoo model {name!r}: {_line(e)}') from None
    n = count_params(params)
    if rec.get('n_params') not in (None, n):
        raise ConfigError(
            f'zoo model {name!r}: {n} parameters, the manifest says {rec.get("n_params")}'
        )
    role = rec['role']
    cost = 1.0 if role == 'verifier' else float(rec.get('cost', n / verifier_params))
    return ZooModel(
        name=name,
        role=role,
        lm=lm,
        params=params,
        tokenizer=tok,
        tokenizer_name=tok_name,
        domains=tuple(rec.get('domains') or ()),
        temperature=float(rec.get('temperature', 1.0)),
        cost=cost,
        n_params=n,
        record=rec,
    )


def load_zoo(path: str | os.PathLike | None = None, names: Sequence[str] | None = None) -> Zoo:
    """Loads and verifies the zoo.

    Args:
      path: the zoo directory (default: `default_zoo_path`, i.e. ``$SPECJAX_ZOO`` or the
        repository's ``zoo/``; a relative path missing from the working directory is also
        looked up at the repository root).
      names: drafters to load, in the priority order wanted (default: the manifest's
        ``drafter_order``). The verifier is always loaded ('verifier' may be listed).

    Returns:
      The `Zoo`.

    Raises:
      ConfigError: one line naming the problem: missing manifest, unknown model name
        (the known ones are listed), missing or corrupt file, sha256 mismatch, model /
        tokenizer vocabulary mismatch.
    """
    root, manifest = read_manifest(path)
    order = list(manifest['drafter_order'])
    loadable = order + [n for n in manifest.get('extra_drafters', []) if n not in order]
    if isinstance(names, str):
        names = (names,)
    wanted = order if names is None else [n for n in names if n != VERIFIER]
    known = [VERIFIER] + loadable
    for n in wanted:
        if n not in loadable:
            raise ConfigError(
                f'zoo model: got {n!r}; allowed: one of {", ".join(map(repr, known))}',
                field='model',
                value=n,
                allowed=known,
            )
    if len(set(wanted)) != len(wanted):
        raise ConfigError(f'zoo model names: got {list(names)}; allowed: distinct names')
    tokenizers: dict[str, Tokenizer] = {}
    verifier = _load_model(root, manifest, VERIFIER, tokenizers, None)
    drafters = tuple(_load_model(root, manifest, n, tokenizers, verifier.n_params) for n in wanted)
    return Zoo(path=root, manifest=manifest, verifier=verifier, drafters=drafters)
