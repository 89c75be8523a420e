"""Abstract models for planning: a `TransformerLM` and its parameters as shapes only.

A model comes from a GGUF file's header (no tensor read), a Hugging Face ``config.json``
(a folder or the file) or a named preset — the published ``config.json`` fields of the
models the field report's deployment is sized like, written out here so that planning
needs no download. The parameters are ``jax.ShapeDtypeStruct`` leaves: no weights, no
memory, what `jax.jit(...).lower` takes.
"""

from __future__ import annotations

import json
from pathlib import Path

from specjax.errors import ConfigError
from specjax.models.api import TransformerLM
from specjax.models.gguf import load_gguf_model
from specjax.models.hf_config import config_from_hf

__all__ = ['PRESETS', 'abstract_model']


def _llama(
    v, d, layers, heads, kv, ff, theta, tied, ctx, eps, scaling=None, arch='LlamaForCausalLM'
):
    cfg = dict(
        architectures=[arch],
        vocab_size=v,
        hidden_size=d,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        intermediate_size=ff,
        rope_theta=theta,
        tie_word_embeddings=tied,
        max_position_embeddings=ctx,
        rms_norm_eps=eps,
        hidden_act='silu',
    )
    if scaling is not None:
        cfg['rope_scaling'] = scaling
    return cfg


_LLAMA3_SCALING = dict(
    rope_type='llama3',
    high_freq_factor=4.0,
    low_freq_factor=1.0,
    original_max_position_embeddings=8192,
)

#: The published ``config.json`` fields (huggingface.co/<repo>/blob/main/config.json).
PRESETS: dict[str, dict] = {
    # HuggingFaceTB/SmolLM2-135M-Instruct
    'smollm2-135m': _llama(49152, 576, 30, 9, 3, 1536, 100000.0, True, 8192, 1e-5),
    # meta-llama/Llama-3.1-70B(-Instruct)
    'llama-3.1-70b': _llama(
        128256,
        8192,
        80,
        64,
        8,
        28672,
        500000.0,
        False,
        131072,
        1e-5,
        dict(_LLAMA3_SCALING, factor=8.0),
    ),
    # meta-llama/Llama-3.2-3B(-Instruct)
    'llama-3.2-3b': _llama(
        128256,
        3072,
        28,
        24,
        8,
        8192,
        500000.0,
        True,
        131072,
        1e-5,
        dict(_LLAMA3_SCALING, factor=32.0),
    ),
    # Qwen/Qwen2.5-Coder-1.5B(-Instruct)
    'qwen2.5-coder-1.5b': _llama(
        151936,
        1536,
        28,
        12,
        2,
        8960,
        1000000.0,
        True,
        32768,
        1e-6,
        arch='Qwen2ForCausalLM',
    ),
    # mistralai/Mistral-7B-v0.3 (no sliding window)
    'mistral-7b': _llama(
        32768,
        4096,
        32,
        32,
        8,
        14336,
        1000000.0,
        False,
        32768,
        1e-5,
        arch='MistralForCausalLM',
    ),
}


def abstract_model(
    source: str, *, max_len: int = 4096, dtype: str = 'bfloat16'
) -> tuple[TransformerLM, dict]:
    """``(lm, params)`` with ``params`` as ``jax.ShapeDtypeStruct`` leaves.

    ``source``: a preset name (`PRESETS`), a ``.gguf`` file (its header only), or a HF
    folder / ``config.json``. ``max_len``: the KV-cache capacity the plan is for;
    ``dtype``: compute and storage dtype.
    """
    if source in PRESETS:
        cfg, _ = config_from_hf(
            PRESETS[source], max_len=max_len, dtype=dtype, where=f'preset {source!r}'
        )
        lm = TransformerLM(cfg)
        return lm, lm.abstract_params()
    path = Path(source)
    if path.suffix == '.gguf' and path.is_file():
        m = load_gguf_model(path, max_len=max_len, dtype=dtype, weights=False)
        return m.lm, m.lm.abstract_params()
    cfg_path = path / 'config.json' if path.is_dir() else path
    if cfg_path.name == 'config.json' and cfg_path.is_file():
        try:
            hf = json.loads(cfg_path.read_text(encoding='utf-8'))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ConfigError(f'model {cfg_path}: not a readable JSON config ({e})') from None
        if not isinstance(hf, dict):
            raise ConfigError(f'model {cfg_path}: a JSON {type(hf).__name__}; allowed: an object')
        cfg, _ = config_from_hf(hf, max_len=max_len, dtype=dtype, where=str(cfg_path))
        lm = TransformerLM(cfg)
        return lm, lm.abstract_params()
    raise ConfigError(
        f'model: got {source!r}; allowed: a preset ({", ".join(PRESETS)}), a .gguf file '
        'or a Hugging Face folder / config.json'
    )
