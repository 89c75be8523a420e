"""The Llama family: HF ``LlamaForCausalLM``, GGUF ``llama`` (Mistral files say 'llama'
too). llama.cpp's converter permutes the rows of ``attn_q`` / ``attn_k`` for its
interleaved rotary (pairs ``(2i, 2i+1)``); specjax rotates half-split pairs ``(i, i +
hd/2)`` as HF does, so the permutation is undone at load."""

from __future__ import annotations

from specjax.models.families.base import (
    ModelFamily,
    decoder_fields,
    decoder_json,
    gguf_decoder,
    register,
    rope_fields,
    unpermute_rows,
)

SWITCHES = (('qkv_bias', False), ('embed_input_scale', False))


def read_hf(hf: dict, where: str) -> dict:
    theta, scaling = rope_fields(hf.get('rope_parameters') or {}, hf, where)
    return dict(decoder_fields(hf, where), rope_theta=theta, rope_scaling=scaling, **dict(SWITCHES))


def write_hf(cfg) -> dict:
    out = decoder_json(cfg, 'LlamaForCausalLM', 'llama')
    out.update(attention_bias=False, mlp_bias=False, pretraining_tp=1)
    return out


def read_gguf(meta: dict, tensors: dict, where: str) -> dict:
    return {'architectures': ['LlamaForCausalLM'], **gguf_decoder(meta, tensors, where)}


def gguf_tensor(hf_name: str, w, cfg):
    """llama.cpp's q/k row permutation undone."""
    if hf_name.endswith(('q_proj.weight', 'q_proj.bias')):
        return unpermute_rows(w, cfg.n_heads)
    if hf_name.endswith(('k_proj.weight', 'k_proj.bias')):
        return unpermute_rows(w, cfg.n_kv_heads)
    return w


LLAMA = register(
    ModelFamily(
        name='llama',
        hf_architectures=('LlamaForCausalLM',),
        hf_model_types=('llama',),
        gguf_architectures=('llama',),
        read_hf=read_hf,
        write_hf=write_hf,
        read_gguf=read_gguf,
        switches=SWITCHES,
        gguf_tensor=gguf_tensor,
    )
)
