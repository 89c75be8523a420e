"""The Qwen2 family: HF ``Qwen2ForCausalLM``, GGUF ``qwen2``: Llama with biases on the
q/k/v projections (GGUF rows not permuted)."""

from __future__ import annotations

from specjax.models.families.base import (
    ModelFamily,
    decoder_fields,
    decoder_json,
    gguf_decoder,
    register,
    rope_fields,
)

SWITCHES = (('qkv_bias', True), ('embed_input_scale', False))


def read_hf(hf: dict, where: str) -> dict:
    theta, scaling = rope_fields(hf.get('rope_parameters') or {}, hf, where)
    fields = dict(decoder_fields(hf, where), rope_theta=theta, rope_scaling=scaling)
    if hf.get('use_sliding_window') and hf.get('sliding_window') is not None:
        fields['window_cap'] = int(hf['sliding_window'])
    return dict(fields, **dict(SWITCHES))


def write_hf(cfg) -> dict:
    out = decoder_json(cfg, 'Qwen2ForCausalLM', 'qwen2')
    out.update(
        use_sliding_window=False,
        sliding_window=None,
        max_window_layers=cfg.n_layers,
        layer_types=['full_attention'] * cfg.n_layers,
    )
    return out


def read_gguf(meta: dict, tensors: dict, where: str) -> dict:
    return {'architectures': ['Qwen2ForCausalLM'], **gguf_decoder(meta, tensors, where)}


QWEN2 = register(
    ModelFamily(
        name='qwen2',
        hf_architectures=('Qwen2ForCausalLM',),
        hf_model_types=('qwen2',),
        gguf_architectures=('qwen2',),
        read_hf=read_hf,
        write_hf=write_hf,
        read_gguf=read_gguf,
        switches=SWITCHES,
    )
)
