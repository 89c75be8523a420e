"""The Gemma 3 family (text): HF ``Gemma3ForCausalLM`` (``model_type`` ``gemma3_text``),
GGUF ``gemma3``.

Gemma 3 is Llama with: RMS norms on each query and key head; four norms per block (before
and after the attention and the MLP), every norm scaled by ``1 + w``; GeGLU with the tanh
GELU; the tied embedding's rows times sqrt(d_model) in the activation dtype; queries
scaled by ``query_pre_attn_scalar^-1/2``; local layers attending to the last
``sliding_window`` positions with their own rotary base, one global layer in every
``sliding_window_pattern`` (6: five local, one global). The `TransformerConfig` switches
``qk_norm``, ``post_norms``, ``norm_plus_one``, ``mlp_act='gelu_tanh'``,
``query_pre_attn_scalar``, ``sliding_window``, ``local_layers`` and ``rope_local_theta``.

From GGUF. llama.cpp's converter stores every norm weight as ``1 + w`` (undone at load,
as transformers' GGUF loader does) and writes neither the layer pattern nor the local
rotary base nor the query scale: they are read from the metadata where a file has them
(``gemma3.attention.sliding_window_pattern``, ``gemma3.rope.freq_base_swa``) and are
otherwise llama.cpp's own constants for ``gemma3`` (pattern 6, local base 10,000, query
scale the key length, the 27B's embedding_length / head_count), which transformers'
defaults agree with for the released sizes.
"""

from __future__ import annotations

import numpy as np

from specjax.models.families.base import (
    LLAMA_GGUF_NAMES,
    LLAMA_HF_NAMES,
    ModelFamily,
    decoder_fields,
    fail,
    gguf_decoder,
    need,
    register,
    rope_fields,
)

SWITCHES = (
    ('qkv_bias', False),
    ('embed_input_scale', True),
    ('qk_norm', True),
    ('post_norms', True),
    ('norm_plus_one', True),
    ('mlp_act', 'gelu_tanh'),
)
PATTERN = 6  # one global layer in every 6 (llama.cpp's and transformers' default)
LOCAL_THETA = 10_000.0  # local layers' rotary base where a file does not say
_ACTS = ('gelu_pytorch_tanh', 'gelu_tanh')

HF_NAMES = {
    **LLAMA_HF_NAMES,
    ('attn', 'q_norm', 'scale'): 'self_attn.q_norm.weight',
    ('attn', 'k_norm', 'scale'): 'self_attn.k_norm.weight',
    ('attn_post_norm', 'scale'): 'post_attention_layernorm.weight',
    ('mlp_norm', 'scale'): 'pre_feedforward_layernorm.weight',
    ('mlp_post_norm', 'scale'): 'post_feedforward_layernorm.weight',
}
GGUF_NAMES = {
    **LLAMA_GGUF_NAMES,
    'attn_q_norm': 'self_attn.q_norm',
    'attn_k_norm': 'self_attn.k_norm',
    'post_attention_norm': 'post_attention_layernorm',
    'ffn_norm': 'pre_feedforward_layernorm',
    'post_ffw_norm': 'post_feedforward_layernorm',
}


def _layer_types(hf: dict, n_layers: int, where: str) -> list[str]:
    types = hf.get('layer_types')
    if types is None:
        pattern = hf.get('sliding_window_pattern', hf.get('_sliding_window_pattern', PATTERN))
        if isinstance(pattern, bool) or not isinstance(pattern, int) or pattern < 1:
            raise fail(f'{where}: sliding_window_pattern={pattern!r}, allowed: an integer >= 1')
        types = [
            'sliding_attention' if (i + 1) % pattern else 'full_attention' for i in range(n_layers)
        ]
    allowed = ('sliding_attention', 'full_attention')
    if not isinstance(types, list) or len(types) != n_layers or set(types) - set(allowed):
        raise fail(
            f'{where}: layer_types={types!r}, allowed: a list of num_hidden_layers='
            f'{n_layers} entries from {allowed}'
        )
    return types


def read_hf(hf: dict, where: str) -> dict:
    for field in ('attn_logit_softcapping', 'final_logit_softcapping'):
        if hf.get(field) is not None:
            raise fail(f'{where}: {field}={hf[field]!r} is not supported (allowed: null)')
    if hf.get('use_bidirectional_attention'):
        raise fail(f'{where}: use_bidirectional_attention=true is not supported (allowed: false)')
    if hf.get('tie_word_embeddings', True) is not True:
        raise fail(
            f'{where}: tie_word_embeddings={hf.get("tie_word_embeddings")!r} is not supported '
            f'for gemma3 (allowed: true)'
        )
    fields = decoder_fields(
        dict(hf, tie_word_embeddings=True),
        where,
        acts=_ACTS,
        act_field='hidden_activation',
        span=False,
    )
    hd = fields.get('head_size') or fields['d_model'] // fields['n_heads']
    fields['head_size'] = hd
    types = _layer_types(hf, fields['n_layers'], where)
    params = hf.get('rope_parameters') or {}
    if not isinstance(params, dict):
        raise fail(f'{where}: rope_parameters={params!r}, allowed: a JSON object or null')
    if 'full_attention' in params or 'sliding_attention' in params:  # transformers 5.x
        full = params.get('full_attention') or {}
        local = params.get('sliding_attention') or {}
        theta, scaling = rope_fields(full, {}, where)
        local_theta, local_scaling = rope_fields({'rope_theta': LOCAL_THETA, **local}, {}, where)
    else:  # transformers 4.x: rope_theta, rope_scaling (global), rope_local_base_freq
        theta, scaling = rope_fields({}, dict(hf, rope_theta=hf.get('rope_theta', 1e6)), where)
        local_theta, local_scaling = rope_fields(
            {'rope_theta': hf.get('rope_local_base_freq', LOCAL_THETA)}, {}, where
        )
    if local_scaling:
        raise fail(
            f'{where}: rope_parameters.sliding_attention.rope_type='
            f'{local_scaling.get("rope_type")!r} is not supported (allowed: default)'
        )
    local = tuple(i for i, t in enumerate(types) if t == 'sliding_attention')
    window = need(hf, 'sliding_window', where) if local else 0
    scalar = hf.get('query_pre_attn_scalar', hd)
    if isinstance(scalar, bool) or not isinstance(scalar, (int, float)) or scalar <= 0:
        raise fail(f'{where}: query_pre_attn_scalar={scalar!r}, allowed: a number > 0')
    return dict(
        fields,
        rope_theta=theta,
        rope_scaling=scaling,
        rope_local_theta=local_theta,
        sliding_window=window,
        local_layers=local,
        query_pre_attn_scalar=float(scalar),
        **dict(SWITCHES),
    )


def _number(x: float):
    """An integral value as an int (transformers' config checks the type)."""
    return int(x) if float(x).is_integer() else float(x)


def write_hf(cfg) -> dict:
    full = {'rope_type': 'default', 'rope_theta': cfg.rope_theta, **dict(cfg.rope_scaling)}
    local = {'rope_type': 'default', 'rope_theta': cfg.rope_local_theta or cfg.rope_theta}
    return {
        'architectures': ['Gemma3ForCausalLM'],
        'model_type': 'gemma3_text',
        'vocab_size': cfg.vocab_size,
        'hidden_size': cfg.d_model,
        'intermediate_size': cfg.d_ff,
        'num_hidden_layers': cfg.n_layers,
        'num_attention_heads': cfg.n_heads,
        'num_key_value_heads': cfg.n_kv_heads,
        'head_dim': cfg.head_dim,
        'hidden_activation': 'gelu_pytorch_tanh',
        'max_position_embeddings': cfg.max_len,
        'rms_norm_eps': cfg.norm_eps,
        'tie_word_embeddings': True,
        'query_pre_attn_scalar': _number(cfg.query_pre_attn_scalar or cfg.head_dim),
        'sliding_window': cfg.sliding_window or cfg.max_len,
        'layer_types': [
            'sliding_attention' if i in cfg.local_layers else 'full_attention'
            for i in range(cfg.n_layers)
        ],
        'rope_parameters': {'full_attention': full, 'sliding_attention': local},
        'attn_logit_softcapping': None,
        'final_logit_softcapping': None,
        'attention_bias': False,
        'attention_dropout': 0.0,
        'use_cache': True,
        'torch_dtype': cfg.param_dtype,
        'dtype': cfg.param_dtype,
    }


def read_gguf(meta: dict, tensors: dict, where: str) -> dict:
    hf = gguf_decoder(meta, tensors, where, span=False)
    arch = meta['general.architecture']
    n_layers = hf['num_hidden_layers']
    window = meta.get(f'{arch}.attention.sliding_window')
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise fail(
            f'{where}: metadata {arch}.attention.sliding_window={window!r} is missing '
            f'or not an integer >= 1'
        )
    # llama.cpp's gemma3 constants where the file has no field (see the module docstring).
    pattern = meta.get(f'{arch}.attention.sliding_window_pattern', PATTERN)
    if isinstance(pattern, (list, tuple, np.ndarray)):  # per layer: true where local
        hf['layer_types'] = [
            'sliding_attention' if bool(b) else 'full_attention' for b in list(pattern)
        ]
        pattern = PATTERN
    local_theta = meta.get(f'{arch}.rope.freq_base_swa', LOCAL_THETA)
    d, heads = hf['hidden_size'], hf['num_attention_heads']
    scalar = d // heads if n_layers == 62 else hf['head_dim']  # llama.cpp: the 27B's d / H
    hf.update(
        architectures=['Gemma3ForCausalLM'],
        model_type='gemma3_text',
        hidden_activation='gelu_pytorch_tanh',
        sliding_window=window,
        sliding_window_pattern=pattern,
        query_pre_attn_scalar=scalar,
        rope_parameters={
            'full_attention': {'rope_type': 'default', 'rope_theta': hf.pop('rope_theta')},
            'sliding_attention': {'rope_type': 'default', 'rope_theta': float(local_theta)},
        },
    )
    if 'rope_scaling' in hf:
        hf['rope_parameters']['full_attention'].update(hf.pop('rope_scaling'))
    if not hf['tie_word_embeddings']:
        raise fail(f'{where}: tensor output.weight: gemma3 files tie the head (allowed: none)')
    return hf


def gguf_tensor(hf_name: str, w, cfg):
    """llama.cpp stores Gemma's norm weights as 1 + w: back to w (as transformers does)."""
    return w - 1.0 if hf_name.endswith('norm.weight') else w


GEMMA3 = register(
    ModelFamily(
        name='gemma3',
        hf_architectures=('Gemma3ForCausalLM',),
        hf_model_types=('gemma3_text',),
        gguf_architectures=('gemma3',),
        read_hf=read_hf,
        write_hf=write_hf,
        read_gguf=read_gguf,
        switches=SWITCHES,
        free=('query_pre_attn_scalar', 'sliding_window', 'local_layers', 'rope_local_theta'),
        hf_names=HF_NAMES,
        gguf_names=GGUF_NAMES,
        gguf_tensor=gguf_tensor,
        scales_embedding=True,
        gguf_sentencepiece='gemma',
    )
)
