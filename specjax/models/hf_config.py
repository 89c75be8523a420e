"""Hugging Face ``config.json`` <-> `TransformerConfig`, through the model families.

`config_from_hf` asks the registry (`specjax.models.families`) which family a parsed
``config.json`` is and lets the family read it (transformers 4.x and 5.x spellings of the
RoPE fields) into specjax's config; `hf_config` writes one back for
`specjax.models.hf.save_hf`. Every unsupported field fails in one `ConfigError` line
naming the file and the field.
"""

from __future__ import annotations

import json
from pathlib import Path

from specjax.errors import ConfigError
from specjax.models import families
from specjax.models.transformer import TransformerConfig

__all__ = ['FAMILIES', 'config_from_hf', 'hf_config', 'read_config_json', 'context_length']

#: ``architectures[0]`` -> family name (the registry's, for callers that list them).
FAMILIES = families.hf_architectures()


def _fail(msg: str) -> ConfigError:
    return ConfigError(' '.join(msg.split()))


def read_config_json(path) -> dict:
    """The parsed ``config.json`` at ``path`` (a file, or a folder holding one): one
    `ConfigError` line naming the file when it is missing, unreadable, not JSON or not a
    JSON object."""
    p = Path(path)
    if p.is_dir():
        p = p / 'config.json'
    try:
        hf = json.loads(p.read_text(encoding='utf-8'))
    except FileNotFoundError:
        raise _fail(f'{p}: missing (allowed: a Hugging Face config.json)') from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise _fail(
            f'{p}: not valid JSON ({type(e).__name__}: {e}); allowed: a JSON object'
        ) from None
    if not isinstance(hf, dict):
        raise _fail(f'{p}: a JSON {type(hf).__name__}, allowed: a JSON object (config.json)')
    return hf


def context_length(hf: dict) -> int | None:
    """The model's context, ``max_position_embeddings`` (None when the config has none)."""
    v = hf.get('max_position_embeddings')
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None


def config_from_hf(
    hf: dict,
    *,
    max_len: int | None = None,
    dtype: str = 'float32',
    param_dtype: str | None = None,
    where: str = 'config.json',
) -> tuple[TransformerConfig, str]:
    """(TransformerConfig, family name) from a parsed HF ``config.json``: the family is
    the registry's (`specjax.models.families.for_hf`), which reads the config.

    Args:
      hf: the parsed config.
      max_len: KV-cache capacity (default: ``max_position_embeddings``, capped at 4096, and
        for a family whose window specjax does not apply (Mistral) at ``sliding_window``:
        below the window, sliding-window attention is full attention).
      dtype / param_dtype: compute and storage dtypes (param_dtype defaults to dtype).
      where: names the file in errors.
    """
    if not isinstance(hf, dict):
        raise _fail(f'{where}: a JSON {type(hf).__name__}, allowed: a JSON object')
    family = families.for_hf(hf, where)
    cfg = family.config_from_hf(
        hf, max_len=max_len, dtype=dtype, param_dtype=param_dtype, where=where
    )
    return cfg, family.name


def hf_config(cfg: TransformerConfig, family: str = 'llama') -> dict:
    """The ``config.json`` of ``cfg`` as an HF ``family`` model (a registered family's
    name: `specjax.models.families.names`).

    A Gemma-style tied model (inputs scaled by sqrt(d_model)) written as a family without
    that scale is written untied: the scale is folded into ``embed_tokens`` and
    ``lm_head`` keeps the unscaled table (see `save_hf`).
    """
    return families.get(family, 'hf export family').hf_config(cfg)
