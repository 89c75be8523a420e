"""Hugging Face ``config.json`` <-> `TransformerConfig` (Llama, Qwen2, Mistral).

`config_from_hf` reads a parsed ``config.json`` (transformers 4.x and 5.x spellings of the
RoPE fields) into specjax's config and the family name; `hf_config` writes one back for
`specjax.models.hf.save_hf`. Every unsupported field fails in one `ConfigError` line
naming the file and the field.
"""

from __future__ import annotations

import json
from pathlib import Path

from specjax.errors import ConfigError
from specjax.models.transformer import TransformerConfig

__all__ = ['FAMILIES', 'config_from_hf', 'hf_config', 'read_config_json', 'context_length']

#: ``architectures[0]`` -> family name.
FAMILIES = {
    'LlamaForCausalLM': 'llama',
    'Qwen2ForCausalLM': 'qwen2',
    'MistralForCausalLM': 'mistral',
}
_ARCH = {v: k for k, v in FAMILIES.items()}


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


def _rope(hf: dict, where: str) -> tuple[float, dict]:
    """(rope_theta, rope_scaling dict or {}) from a transformers 4.x or 5.x config."""
    params = hf.get('rope_parameters') or {}
    for field, v in (('rope_parameters', params), ('rope_scaling', hf.get('rope_scaling') or {})):
        if not isinstance(v, dict):
            raise _fail(f'{where}: {field}={v!r}, allowed: a JSON object or null')
    theta = params.get('rope_theta', hf.get('rope_theta', 10000.0))
    if isinstance(theta, bool) or not isinstance(theta, (int, float)) or not theta > 0:
        raise _fail(f'{where}: rope_theta={theta!r}, allowed: a number > 0')
    scaling = dict(hf.get('rope_scaling') or {})
    if params and params.get('rope_type', 'default') != 'default':
        scaling = {k: v for k, v in params.items() if k != 'rope_theta'}
    kind = scaling.get('rope_type', scaling.get('type', 'default'))
    if kind == 'default':
        return float(theta), {}
    if kind not in ('linear', 'llama3'):
        raise _fail(
            f"{where}: rope_scaling.rope_type={kind!r} is not supported (allowed: "
            f"'default', 'linear', 'llama3')"
        )
    return float(theta), scaling


def config_from_hf(
    hf: dict,
    *,
    max_len: int | None = None,
    dtype: str = 'float32',
    param_dtype: str | None = None,
    where: str = 'config.json',
) -> tuple[TransformerConfig, str]:
    """(TransformerConfig, family) from a parsed HF ``config.json``.

    Args:
      hf: the parsed config.
      max_len: KV-cache capacity (default: ``max_position_embeddings``, capped at 4096, and
        at ``sliding_window``: below the window, sliding-window attention is full attention,
        so a Mistral model is exact for every context specjax can hold).
      dtype / param_dtype: compute and storage dtypes (param_dtype defaults to dtype).
      where: names the file in errors.
    """
    if not isinstance(hf, dict):
        raise _fail(f'{where}: a JSON {type(hf).__name__}, allowed: a JSON object')
    archs = hf.get('architectures') or []
    if not isinstance(archs, list) or not all(isinstance(a, str) for a in archs):
        raise _fail(f'{where}: architectures={archs!r}, allowed: a list of class names')
    arch = archs[0] if archs else None
    if arch not in FAMILIES:
        mt = hf.get('model_type')
        arch = _ARCH.get(mt) if arch is None else arch
        if arch not in FAMILIES:
            raise _fail(
                f'{where}: architectures={archs!r} (model_type={mt!r}) is not supported '
                f'(allowed: {", ".join(sorted(FAMILIES))})'
            )
    family = FAMILIES[arch]

    def need(field, kind=int, default=None):
        v = hf.get(field, default)
        if not isinstance(v, kind) or isinstance(v, bool):
            raise _fail(f'{where}: {field}={v!r} is missing or not a {kind.__name__}')
        if kind is int and v < 1:
            raise _fail(f'{where}: {field}={v!r}, allowed: an integer >= 1')
        return v

    d, heads = need('hidden_size'), need('num_attention_heads')
    kv = (
        need('num_key_value_heads', default=heads)
        if hf.get('num_key_value_heads') is not None
        else heads
    )
    if heads % kv:
        raise _fail(
            f'{where}: num_key_value_heads={kv} does not divide num_attention_heads={heads} '
            f'(allowed: a divisor of it)'
        )
    hd = need('head_dim') if hf.get('head_dim') is not None else d // heads
    if hd * heads != d:
        raise _fail(
            f'{where}: head_dim={hd} with num_attention_heads={heads} does not span '
            f'hidden_size={d} (allowed: head_dim = hidden_size / num_attention_heads)'
        )
    act = hf.get('hidden_act', 'silu')
    if act != 'silu':
        raise _fail(f"{where}: hidden_act={act!r} is not supported (allowed: 'silu')")
    for field in ('attention_bias', 'mlp_bias'):
        if hf.get(field):
            raise _fail(f'{where}: {field}=true is not supported (allowed: false)')
    if hf.get('pretraining_tp', 1) not in (1, None):
        raise _fail(
            f"{where}: pretraining_tp={hf['pretraining_tp']!r} is not supported (allowed: 1)"
        )
    theta, scaling = _rope(hf, where)
    if hf.get('max_position_embeddings') is not None:
        need('max_position_embeddings')
    cap = min(int(hf.get('max_position_embeddings') or 4096), 4096)
    window = (
        hf.get('sliding_window') if (family == 'mistral' or hf.get('use_sliding_window')) else None
    )
    if max_len is None:
        max_len = cap if window is None else min(cap, int(window))
    elif window is not None and max_len > window:
        raise _fail(
            f'{where}: max_len={max_len} exceeds sliding_window={window}; specjax '
            f'attends to the whole context (allowed: max_len <= {window})'
        )
    try:
        cfg = TransformerConfig(
            vocab_size=need('vocab_size'),
            d_model=d,
            n_layers=need('num_hidden_layers'),
            n_heads=heads,
            n_kv_heads=kv,
            d_ff=need('intermediate_size'),
            max_len=int(max_len),
            rope_theta=theta,
            tie_embeddings=bool(hf.get('tie_word_embeddings', False)),
            dtype=dtype,
            param_dtype=param_dtype or dtype,
            norm_eps=float(hf.get('rms_norm_eps', 1e-6)),
            rope_scaling=scaling,
            qkv_bias=family == 'qwen2',
            embed_input_scale=False,
        )
    except ValueError as e:
        raise _fail(f'{where}: {e}') from None
    return cfg, family


def hf_config(cfg: TransformerConfig, family: str = 'llama') -> dict:
    """The ``config.json`` of ``cfg`` as an HF ``family`` model ('llama', 'qwen2', 'mistral').

    A Gemma-style tied model (inputs scaled by sqrt(d_model)) is written untied: the scale
    is folded into ``embed_tokens`` and ``lm_head`` keeps the unscaled table (see
    `save_hf`), since these families have no input scale.
    """
    if family not in _ARCH:
        raise _fail(f'hf export family: got {family!r}; allowed: one of {sorted(_ARCH)}')
    if cfg.qkv_bias != (family == 'qwen2'):
        raise _fail(
            f'hf export family: {family!r} {"lacks" if cfg.qkv_bias else "needs"} '
            f'q/k/v biases but the model has qkv_bias={cfg.qkv_bias} (allowed: '
            f'{"qwen2" if cfg.qkv_bias else "llama or mistral"})'
        )
    tied = cfg.tie_embeddings and not cfg.embed_input_scale
    rope = {'rope_theta': cfg.rope_theta, 'rope_type': 'default'}
    if cfg.rope_scaling:
        rope = {'rope_theta': cfg.rope_theta, **dict(cfg.rope_scaling)}
    out = {
        'architectures': [_ARCH[family]],
        'model_type': family,
        'vocab_size': cfg.vocab_size,
        'hidden_size': cfg.d_model,
        'intermediate_size': cfg.d_ff,
        'num_hidden_layers': cfg.n_layers,
        'num_attention_heads': cfg.n_heads,
        'num_key_value_heads': cfg.n_kv_heads,
        'head_dim': cfg.head_dim,
        'hidden_act': 'silu',
        'max_position_embeddings': cfg.max_len,
        'rms_norm_eps': cfg.norm_eps,
        'tie_word_embeddings': tied,
        'rope_theta': cfg.rope_theta,
        'rope_parameters': rope,
        'attention_dropout': 0.0,
        'use_cache': True,
        'torch_dtype': cfg.param_dtype,
        'dtype': cfg.param_dtype,
    }
    if cfg.rope_scaling:
        out['rope_scaling'] = dict(cfg.rope_scaling)
    if family == 'llama':
        out.update(attention_bias=False, mlp_bias=False, pretraining_tp=1)
    if family == 'mistral':
        out['sliding_window'] = None
    if family == 'qwen2':
        out.update(
            use_sliding_window=False,
            sliding_window=None,
            max_window_layers=cfg.n_layers,
            layer_types=['full_attention'] * cfg.n_layers,
        )
    return out
