"""The Mistral family (HF ``MistralForCausalLM``): Llama with a sliding window, which
specjax does not apply to this family: ``max_len`` is capped at the window (below it,
sliding-window attention is full attention, so the model is exact for every context
specjax holds). Its GGUF files say ``llama`` and load as that family."""

from __future__ import annotations

from specjax.models.families.base import (
    ModelFamily,
    decoder_fields,
    decoder_json,
    register,
    rope_fields,
)

SWITCHES = (('qkv_bias', False), ('embed_input_scale', False))


def read_hf(hf: dict, where: str) -> dict:
    theta, scaling = rope_fields(hf.get('rope_parameters') or {}, hf, where)
    fields = dict(decoder_fields(hf, where), rope_theta=theta, rope_scaling=scaling)
    if hf.get('sliding_window') is not None:
        fields['window_cap'] = int(hf['sliding_window'])
    return dict(fields, **dict(SWITCHES))


def write_hf(cfg) -> dict:
    return dict(decoder_json(cfg, 'MistralForCausalLM', 'mistral'), sliding_window=None)


MISTRAL = register(
    ModelFamily(
        name='mistral',
        hf_architectures=('MistralForCausalLM',),
        hf_model_types=('mistral',),
        gguf_architectures=(),
        read_hf=read_hf,
        write_hf=write_hf,
        switches=SWITCHES,
    )
)
