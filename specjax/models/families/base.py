"""`ModelFamily`, the typed object a model family is, and the registry callers ask.

A family says which files are its own (GGUF ``general.architecture`` names, HF
``architectures`` classes and ``model_type`` names), how it reads a `TransformerConfig`
from a parsed HF ``config.json`` (`ModelFamily.config_from_hf`) and from GGUF metadata (by
way of the ``config.json`` the metadata stands for: `ModelFamily.hf_from_gguf`), the
transformer switches it fixes (`switches`: checked on export), its tensor names (HF per
layer: `hf_names`; GGUF per layer kind: `gguf_names`) and what a GGUF tensor needs at load
(`gguf_tensor`: llama.cpp's q/k row permutation, Gemma's norms stored as 1 + w).

`specjax.models.hf_config`, `specjax.models.hf` and `specjax.models.gguf` ask the registry
(`for_hf`, `for_gguf`, `get`) and never compare a family's name. The families register
themselves from their own modules (`specjax.models.families`: one import line).

Helpers every Llama-like family shares live here too: `decoder_fields` (the common HF
fields: widths, heads, rope, context) and `gguf_decoder` (the common GGUF metadata as a
``config.json``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from specjax.errors import ConfigError
from specjax.models.transformer import TransformerConfig

__all__ = [
    'ModelFamily',
    'register',
    'get',
    'names',
    'all_families',
    'for_hf',
    'for_gguf',
    'hf_architectures',
    'gguf_architectures',
    'decoder_fields',
    'gguf_decoder',
    'rope_fields',
    'LLAMA_HF_NAMES',
    'LLAMA_GGUF_NAMES',
]


#: The `TransformerConfig` fields that say which architecture a model is: a family fixes
#: them (`ModelFamily.switches`), reads them from its config (`ModelFamily.free`) or
#: leaves them at their defaults (checked when a model is written as the family).
ARCHITECTURE_FIELDS = (
    'qkv_bias',
    'embed_input_scale',
    'qk_norm',
    'post_norms',
    'norm_plus_one',
    'mlp_act',
    'query_pre_attn_scalar',
    'sliding_window',
    'local_layers',
    'rope_local_theta',
)
_CONFIG_DEFAULTS = {f.name: f.default for f in dataclasses.fields(TransformerConfig)}


def fail(msg: str) -> ConfigError:
    return ConfigError(' '.join(msg.split()))


#: specjax leaf inside ``layer_i`` -> HF tensor name inside ``model.layers.i`` (Llama's).
LLAMA_HF_NAMES = {
    ('attn_norm', 'scale'): 'input_layernorm.weight',
    ('attn', 'wq'): 'self_attn.q_proj.weight',
    ('attn', 'wk'): 'self_attn.k_proj.weight',
    ('attn', 'wv'): 'self_attn.v_proj.weight',
    ('attn', 'wo'): 'self_attn.o_proj.weight',
    ('attn', 'bq'): 'self_attn.q_proj.bias',
    ('attn', 'bk'): 'self_attn.k_proj.bias',
    ('attn', 'bv'): 'self_attn.v_proj.bias',
    ('mlp_norm', 'scale'): 'post_attention_layernorm.weight',
    ('mlp', 'w_gate'): 'mlp.gate_proj.weight',
    ('mlp', 'w_up'): 'mlp.up_proj.weight',
    ('mlp', 'w_down'): 'mlp.down_proj.weight',
}

#: GGUF per-layer tensor kind (``blk.i.<kind>.weight``) -> HF module inside ``model.layers.i``.
LLAMA_GGUF_NAMES = {
    'attn_norm': 'input_layernorm',
    'ffn_norm': 'post_attention_layernorm',
    'attn_q': 'self_attn.q_proj',
    'attn_k': 'self_attn.k_proj',
    'attn_v': 'self_attn.v_proj',
    'attn_output': 'self_attn.o_proj',
    'ffn_gate': 'mlp.gate_proj',
    'ffn_up': 'mlp.up_proj',
    'ffn_down': 'mlp.down_proj',
}


@dataclasses.dataclass(frozen=True)
class ModelFamily:
    """One model family (see the module docstring).

    ``read_hf(hf, where) -> dict``: the `TransformerConfig` fields of a parsed HF
    ``config.json`` (all but ``max_len`` / ``dtype`` / ``param_dtype``), with ``max_len``
    under the key ``'context'`` (the largest cache it allows, None: no cap beyond 4096)
    and optionally ``'window_cap'`` (a Mistral-style window specjax does not apply:
    ``max_len`` may not exceed it). ``read_gguf(meta, tensors, where) -> dict``: the HF
    ``config.json`` the GGUF metadata stands for (None: the family has no GGUF form).
    ``write_hf(cfg) -> dict``: the family's own ``config.json`` fields on export.
    """

    name: str
    hf_architectures: tuple[str, ...]  # the first is written on export
    hf_model_types: tuple[str, ...]  # the first is written on export
    gguf_architectures: tuple[str, ...]
    read_hf: Callable[[dict, str], dict]
    write_hf: Callable[[TransformerConfig], dict]
    read_gguf: Callable[[dict, dict, str], dict] | None = None
    switches: tuple = ()  # ((TransformerConfig field, value), ...) the family fixes
    free: tuple = ()  # `ARCHITECTURE_FIELDS` its config.json sets (others: their defaults)
    hf_names: dict = dataclasses.field(default_factory=lambda: dict(LLAMA_HF_NAMES))
    gguf_names: dict = dataclasses.field(default_factory=lambda: dict(LLAMA_GGUF_NAMES))
    gguf_tensor: Callable[[str, np.ndarray, TransformerConfig], np.ndarray] | None = None
    scales_embedding: bool = False  # inputs times sqrt(d_model) natively (no fold on export)
    gguf_sentencepiece: str = 'llama'  # a SentencePiece vocabulary's convention
    #                                    (`specjax.tokenizers.gguf.SENTENCEPIECE`)

    def config_from_hf(
        self,
        hf: dict,
        *,
        max_len: int | None = None,
        dtype: str = 'float32',
        param_dtype: str | None = None,
        where: str = 'config.json',
    ) -> TransformerConfig:
        """The `TransformerConfig` of a parsed ``config.json`` of this family."""
        fields = dict(self.read_hf(hf, where))
        context = fields.pop('context', None)
        window = fields.pop('window_cap', None)
        cap = min(int(context or 4096), 4096)
        if max_len is None:
            max_len = cap if window is None else min(cap, int(window))
        elif window is not None and max_len > window:
            raise fail(
                f'{where}: max_len={max_len} exceeds sliding_window={window}; specjax '
                f'attends to the whole context (allowed: max_len <= {window})'
            )
        try:
            return TransformerConfig(
                max_len=int(max_len), dtype=dtype, param_dtype=param_dtype or dtype, **fields
            )
        except ValueError as e:
            raise fail(f'{where}: {e}') from None

    def hf_from_gguf(self, meta: dict, tensors: dict, where: str) -> dict:
        """The HF ``config.json`` equivalent of a GGUF file's metadata (checked)."""
        if self.read_gguf is None:
            raise fail(f'{where}: the {self.name} family has no GGUF form')
        return self.read_gguf(meta, tensors, where)

    def hf_config(self, cfg: TransformerConfig) -> dict:
        """The ``config.json`` of ``cfg`` written as this family (`save_hf`). A switch the
        family fixes must hold (a Gemma-style tied input scale is folded on export by
        families without one: `specjax.models.hf.save_hf`)."""
        fixed = dict(self.switches)
        for field in ARCHITECTURE_FIELDS:
            if field in self.free:
                continue
            want = fixed.get(field, _CONFIG_DEFAULTS[field])
            have = getattr(cfg, field)
            if field == 'embed_input_scale' and not self.scales_embedding:
                continue  # folded into the exported tables
            if have != want:
                fits = [
                    f.name
                    for f in all_families()
                    if field in f.free
                    or dict(f.switches).get(field, _CONFIG_DEFAULTS[field]) == have
                ]
                raise fail(
                    f'hf export family: {self.name!r} needs {field}={want!r} but the model '
                    f'has {field}={have!r} (allowed: {", ".join(fits) or "no family"})'
                )
        return self.write_hf(cfg)


_REGISTRY: dict[str, ModelFamily] = {}


def register(family: ModelFamily) -> ModelFamily:
    """Adds ``family`` to the registry (its names must be new)."""
    for other in _REGISTRY.values():
        for attr in ('hf_architectures', 'hf_model_types', 'gguf_architectures'):
            clash = set(getattr(other, attr)) & set(getattr(family, attr))
            if clash:
                raise ValueError(f'model family {family.name}: {attr} {clash} are {other.name}s')
    if family.name in _REGISTRY:
        raise ValueError(f'model family {family.name!r} is registered twice')
    _REGISTRY[family.name] = family
    return family


def names() -> list[str]:
    return sorted(_REGISTRY)


def all_families() -> list[ModelFamily]:
    return [_REGISTRY[n] for n in names()]


def get(name, where: str = 'family') -> ModelFamily:
    """The family named ``name`` (a `ModelFamily` passes through)."""
    if isinstance(name, ModelFamily):
        return name
    if name not in _REGISTRY:
        raise fail(f'{where}: got {name!r}; allowed: one of {names()}')
    return _REGISTRY[name]


def hf_architectures() -> dict[str, str]:
    """HF ``architectures`` class -> family name."""
    return {a: f.name for f in all_families() for a in f.hf_architectures}


def gguf_architectures() -> dict[str, str]:
    """GGUF ``general.architecture`` -> family name."""
    return {a: f.name for f in all_families() for a in f.gguf_architectures}


def for_hf(hf: dict, where: str) -> ModelFamily:
    """The family of a parsed ``config.json``: by ``architectures[0]``, else by
    ``model_type``; one line naming the field, the value and the families otherwise."""
    archs = hf.get('architectures') or []
    if not isinstance(archs, list) or not all(isinstance(a, str) for a in archs):
        raise fail(f'{where}: architectures={archs!r}, allowed: a list of class names')
    mt = hf.get('model_type')
    for f in all_families():
        if (archs[0] in f.hf_architectures) if archs else (mt in f.hf_model_types):
            return f
    raise fail(
        f'{where}: architectures={archs!r} (model_type={mt!r}) is not supported '
        f'(allowed families: {", ".join(names())}; classes: '
        f'{", ".join(sorted(hf_architectures()))})'
    )


def for_gguf(meta: dict, where: str) -> ModelFamily:
    """The family of a GGUF file's metadata, by ``general.architecture``."""
    arch = meta.get('general.architecture')
    known = gguf_architectures()
    if arch not in known:
        raise fail(
            f'{where}: general.architecture={arch!r} is not supported (allowed: '
            f'{", ".join(map(repr, sorted(known)))}; families {", ".join(names())})'
        )
    return _REGISTRY[known[arch]]


# ----------------------------------------------------------------------------------------
# Shared readers (Llama-like families)
# ----------------------------------------------------------------------------------------


def need(hf: dict, field: str, where: str, kind=int, default=None):
    """``hf[field]`` checked to be a ``kind`` (an int >= 1 for int)."""
    v = hf.get(field, default)
    if not isinstance(v, kind) or isinstance(v, bool):
        raise fail(f'{where}: {field}={v!r} is missing or not a {kind.__name__}')
    if kind is int and v < 1:
        raise fail(f'{where}: {field}={v!r}, allowed: an integer >= 1')
    return v


def rope_fields(params: dict, hf: dict, where: str) -> tuple[float, dict]:
    """(rope_theta, rope_scaling dict or {}) from a transformers 4.x or 5.x config
    (``params``: the ``rope_parameters`` block to read, ``hf``: the config)."""
    for field, v in (('rope_parameters', params), ('rope_scaling', hf.get('rope_scaling') or {})):
        if not isinstance(v, dict):
            raise fail(f'{where}: {field}={v!r}, allowed: a JSON object or null')
    theta = params.get('rope_theta', hf.get('rope_theta', 10000.0))
    if isinstance(theta, bool) or not isinstance(theta, (int, float)) or not theta > 0:
        raise fail(f'{where}: rope_theta={theta!r}, allowed: a number > 0')
    scaling = dict(hf.get('rope_scaling') or {})
    if params and params.get('rope_type', 'default') != 'default':
        scaling = {k: v for k, v in params.items() if k != 'rope_theta'}
    kind = scaling.get('rope_type', scaling.get('type', 'default'))
    if kind == 'default':
        return float(theta), {}
    if kind not in ('linear', 'llama3'):
        raise fail(
            f"{where}: rope_scaling.rope_type={kind!r} is not supported (allowed: "
            f"'default', 'linear', 'llama3')"
        )
    return float(theta), scaling


def decoder_fields(
    hf: dict, where: str, *, acts: tuple = ('silu',), act_field: str = 'hidden_act', span=True
) -> dict:
    """The `TransformerConfig` fields every Llama-like ``config.json`` spells alike, plus
    ``context`` (``max_position_embeddings``). ``span``: head_dim must be hidden_size /
    heads (families whose transformers class assumes it)."""
    d, heads = need(hf, 'hidden_size', where), need(hf, 'num_attention_heads', where)
    kv = (
        need(hf, 'num_key_value_heads', where)
        if hf.get('num_key_value_heads') is not None
        else heads
    )
    if heads % kv:
        raise fail(
            f'{where}: num_key_value_heads={kv} does not divide num_attention_heads={heads} '
            f'(allowed: a divisor of it)'
        )
    hd = need(hf, 'head_dim', where) if hf.get('head_dim') is not None else d // heads
    if span and hd * heads != d:
        raise fail(
            f'{where}: head_dim={hd} with num_attention_heads={heads} does not span '
            f'hidden_size={d} (allowed: head_dim = hidden_size / num_attention_heads)'
        )
    act = hf.get(act_field, acts[0])
    if act not in acts:
        raise fail(f'{where}: {act_field}={act!r} is not supported (allowed: {acts})')
    for field in ('attention_bias', 'mlp_bias'):
        if hf.get(field):
            raise fail(f'{where}: {field}=true is not supported (allowed: false)')
    if hf.get('pretraining_tp', 1) not in (1, None):
        raise fail(
            f"{where}: pretraining_tp={hf['pretraining_tp']!r} is not supported (allowed: 1)"
        )
    if hf.get('max_position_embeddings') is not None:
        need(hf, 'max_position_embeddings', where)
    out = dict(
        vocab_size=need(hf, 'vocab_size', where),
        d_model=d,
        n_layers=need(hf, 'num_hidden_layers', where),
        n_heads=heads,
        n_kv_heads=kv,
        d_ff=need(hf, 'intermediate_size', where),
        tie_embeddings=bool(hf.get('tie_word_embeddings', False)),
        norm_eps=float(hf.get('rms_norm_eps', 1e-6)),
        context=hf.get('max_position_embeddings'),
    )
    if hd * heads != d:
        out['head_size'] = hd
    return out


def decoder_json(cfg: TransformerConfig, arch: str, model_type: str) -> dict:
    """The ``config.json`` fields every Llama-like family writes alike."""
    rope = {'rope_theta': cfg.rope_theta, 'rope_type': 'default'}
    if cfg.rope_scaling:
        rope = {'rope_theta': cfg.rope_theta, **dict(cfg.rope_scaling)}
    out = {
        'architectures': [arch],
        'model_type': model_type,
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
        'tie_word_embeddings': cfg.tie_embeddings and not cfg.embed_input_scale,
        'rope_theta': cfg.rope_theta,
        'rope_parameters': rope,
        'attention_dropout': 0.0,
        'use_cache': True,
        'torch_dtype': cfg.param_dtype,
        'dtype': cfg.param_dtype,
    }
    if cfg.rope_scaling:
        out['rope_scaling'] = dict(cfg.rope_scaling)
    return out


def gguf_decoder(meta: dict, tensors: dict, where: str, *, span: bool = True) -> dict:
    """The HF ``config.json`` fields of a Llama-like GGUF file's metadata (the keys
    ``<arch>.*``); the caller adds ``architectures`` and its own fields. ``span``: the
    head size must be embedding_length / head_count (no ``head_dim`` field)."""
    arch = meta.get('general.architecture')

    def want(field, kind=int):
        key = f'{arch}.{field}'
        v = meta.get(key)
        if not isinstance(v, kind) or isinstance(v, bool):
            raise fail(f'{where}: metadata {key}={v!r} is missing or not a {kind.__name__}')
        return v

    d, heads = want('embedding_length'), want('attention.head_count')
    kv = meta.get(f'{arch}.attention.head_count_kv', heads)
    if isinstance(kv, (list, np.ndarray)):
        raise fail(
            f'{where}: metadata {arch}.attention.head_count_kv is per layer '
            f'({list(kv)[:4]}...); allowed: one integer for every layer'
        )
    hd = d // heads if heads else 0
    if not span:
        hd = meta.get(f'{arch}.attention.key_length', hd)
    rot = meta.get(f'{arch}.rope.dimension_count', hd)
    if rot != hd:
        raise fail(
            f'{where}: metadata {arch}.rope.dimension_count={rot} (partial rotary) is '
            f'not supported (allowed: the head size {hd})'
        )
    for key in (f'{arch}.attention.key_length', f'{arch}.attention.value_length'):
        if key in meta and meta[key] != hd:
            raise fail(
                f'{where}: metadata {key}={meta[key]} is not supported (allowed: '
                f'{"embedding_length / head_count" if span else "key_length"} = {hd})'
            )
    if 'rope_freqs.weight' in tensors:
        raise fail(
            f"{where}: tensor rope_freqs.weight (llama3 rope scaling as stored by "
            f"llama.cpp) is not supported (allowed: files without it)"
        )
    hf = {
        'hidden_size': d,
        'num_attention_heads': heads,
        'num_key_value_heads': kv,
        'num_hidden_layers': want('block_count'),
        'intermediate_size': want('feed_forward_length'),
        'max_position_embeddings': meta.get(f'{arch}.context_length', 4096),
        'rms_norm_eps': float(meta.get(f'{arch}.attention.layer_norm_rms_epsilon', 1e-6)),
        'rope_theta': float(meta.get(f'{arch}.rope.freq_base', 10000.0)),
        'tie_word_embeddings': 'output.weight' not in tensors,
    }
    if not span:
        hf['head_dim'] = hd
    emb = tensors.get('token_embd.weight')
    if emb is None:
        raise fail(f'{where}: missing tensor token_embd.weight')
    hf['vocab_size'] = int(meta.get(f'{arch}.vocab_size', int(emb.shape[-1])))
    scaling = meta.get(f'{arch}.rope.scaling.type')
    if scaling not in (None, 'none'):
        factor = meta.get(f'{arch}.rope.scaling.factor')
        if scaling != 'linear' or not isinstance(factor, (int, float)):
            raise fail(
                f'{where}: metadata {arch}.rope.scaling.type={scaling!r} is not '
                f"supported (allowed: 'none', 'linear' with rope.scaling.factor)"
            )
        hf['rope_scaling'] = {'rope_type': 'linear', 'factor': float(factor)}
    return hf


def unpermute_rows(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Undoes llama.cpp's converter permutation of q/k rows (weights ``[n·hd, in]`` or
    biases ``[n·hd]``): GGUF row ``h·hd + 2i + j`` holds HF row ``h·hd + j·hd/2 + i``."""
    rows = w.shape[0]
    hd = rows // n_heads
    rest = w.shape[1:]
    return w.reshape(n_heads, hd // 2, 2, *rest).swapaxes(1, 2).reshape(rows, *rest)
