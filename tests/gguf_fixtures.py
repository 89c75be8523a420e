"""Synthetic GGUF files for the GGUF tests (`test_gguf`, `test_gguf_real`, `test_gguf_tokenizer`).

Written with ggml's own `gguf.GGUFWriter`: a tiny Llama (d 64, 2 layers, 4 query heads
over 2 KV heads, head size 16) and a Qwen2 with q/k/v biases, with a byte-level BPE
vocabulary (+ merges, control and user-defined tokens) and a chat template in the
metadata. Tensors are quantized by ``gguf.quants`` and read back by a block decoder
written here from the ggml block layouts (independent of the module under test).
Import it after ``pytest.importorskip("gguf")``.
"""

from __future__ import annotations

import json

import gguf
import hf_fixtures as F
import numpy as np
import pytest
import tokenizers
from gguf import GGMLQuantizationType as GT
from tokenizers import AddedToken, decoders, models, pre_tokenizers, trainers

from specjax.errors import ConfigError

D, LAYERS, H, KV, FF, CTX = 64, 2, 4, 2, 128, 128
HD = D // H
EPS = float(np.float32(1e-5))  # GGUF stores f32; an HF config with this value matches
THETA = 10000.0
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")  # ids 0, 1, 2 (bos 1, eos 2)
USER_TOKEN = "<think>"  # token_type 4, last id
CHATML = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a tiny test model.<|im_end|>\\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# HF name -> GGUF name, written out here (independent of the module's own table).
_GGUF_LAYER = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
_GGUF_GLOBAL = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}


def gguf_name(hf_name: str) -> str:
    if hf_name in _GGUF_GLOBAL:
        return _GGUF_GLOBAL[hf_name]
    _, _, i, rest = hf_name.split(".", 3)
    return f"blk.{i}.{_GGUF_LAYER[rest]}"


def gpt2_bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table (openai/gpt-2 encoder.py)."""
    bs = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs), strict=True))


def permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf.py `LlamaModel.permute` (q rows with n_head, k rows
    with n_head_kv): half-split rotary pairs -> interleaved pairs."""
    hd = w.shape[0] // n_head
    return w.reshape(n_head, 2, hd // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


# ----------------------------------------------------------------------------------------
# An independent decoder of the ggml block formats
# ----------------------------------------------------------------------------------------


def _f16(b: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(b).view("<f2").astype(np.float32)


def decode(raw: np.ndarray, kind: GT, shape: tuple[int, ...]) -> np.ndarray:
    """f32 ``shape`` (rows, columns) from the raw little-endian bytes of a ggml tensor."""
    raw = np.ascontiguousarray(raw).view(np.uint8).reshape(-1)
    if kind == GT.F32:
        return raw.view("<f4").reshape(shape).copy()
    if kind == GT.F16:
        return raw.view("<f2").astype(np.float32).reshape(shape)
    if kind == GT.BF16:
        return (raw.view("<u2").astype(np.uint32) << 16).view(np.float32).reshape(shape)
    nb = raw.size // {GT.Q8_0: 34, GT.Q4_0: 18, GT.Q4_1: 20}[kind]
    blocks = raw.reshape(nb, -1)
    if kind == GT.Q8_0:  # f16 scale, 32 x int8
        d = _f16(blocks[:, 0:2])
        q = blocks[:, 2:34].view(np.int8).astype(np.float32)
        return (d * q).reshape(shape)
    if kind == GT.Q4_0:  # f16 d, 16 bytes: low nibbles 0..15, high 16..31; (q-8)*d
        d = _f16(blocks[:, 0:2])
        qs = blocks[:, 2:18]
        q = np.concatenate([qs & 0x0F, qs >> 4], axis=1).astype(np.float32)
        return (d * (q - 8.0)).reshape(shape)
    if kind == GT.Q4_1:  # f16 d, f16 m, 16 bytes as Q4_0; q*d + m
        d, m = _f16(blocks[:, 0:2]), _f16(blocks[:, 2:4])
        qs = blocks[:, 4:20]
        q = np.concatenate([qs & 0x0F, qs >> 4], axis=1).astype(np.float32)
        return (d * q + m).reshape(shape)
    raise AssertionError(kind)


def encode(w: np.ndarray, kind: GT) -> tuple[np.ndarray, GT | None]:
    """(payload for GGUFWriter.add_tensor, raw_dtype)."""
    if kind == GT.F32:
        return w.astype(np.float32), None
    if kind == GT.F16:
        return w.astype(np.float16), None
    return gguf.quants.quantize(w.astype(np.float32), kind), kind


# ----------------------------------------------------------------------------------------
# Synthetic files
# ----------------------------------------------------------------------------------------


def _train_tokenizer() -> tokenizers.Tokenizer:
    """SmolLM2's pipeline (digits split one by one, then GPT-2's byte-level split)."""
    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=319,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[AddedToken(s, special=True, normalized=False) for s in SPECIALS],
        show_progress=False,
    )
    tok.train_from_iterator(F.corpus(), trainer=trainer)
    tok.add_tokens([AddedToken(USER_TOKEN, special=False, normalized=False)])
    return tok


TOKENIZER = _train_tokenizer()
_SPEC = json.loads(TOKENIZER.to_str())
TOKENS = [
    t for t, _ in sorted(TOKENIZER.get_vocab(with_added_tokens=True).items(), key=lambda kv: kv[1])
]
V = len(TOKENS)
TOKEN_TYPES = [3 if t in SPECIALS else 4 if t == USER_TOKEN else 1 for t in TOKENS]
MERGES = [" ".join(m) if isinstance(m, list) else m for m in _SPEC["model"]["merges"]]


def make_weights(family: str, tied: bool, seed: int) -> dict[str, np.ndarray]:
    """HF-layout f32 tensors of a random tiny model."""
    rng = np.random.default_rng(seed)
    w = {"model.embed_tokens.weight": rng.normal(0, 0.3, (V, D))}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = rng.uniform(0.5, 1.5, D)
        w[p + "self_attn.q_proj.weight"] = rng.normal(0, 0.3, (H * HD, D))
        w[p + "self_attn.k_proj.weight"] = rng.normal(0, 0.3, (KV * HD, D))
        w[p + "self_attn.v_proj.weight"] = rng.normal(0, 0.3, (KV * HD, D))
        w[p + "self_attn.o_proj.weight"] = rng.normal(0, 0.3, (D, H * HD))
        if family == "qwen2":
            w[p + "self_attn.q_proj.bias"] = rng.normal(0, 0.3, H * HD)
            w[p + "self_attn.k_proj.bias"] = rng.normal(0, 0.3, KV * HD)
            w[p + "self_attn.v_proj.bias"] = rng.normal(0, 0.3, KV * HD)
        w[p + "post_attention_layernorm.weight"] = rng.uniform(0.5, 1.5, D)
        w[p + "mlp.gate_proj.weight"] = rng.normal(0, 0.3, (FF, D))
        w[p + "mlp.up_proj.weight"] = rng.normal(0, 0.3, (FF, D))
        w[p + "mlp.down_proj.weight"] = rng.normal(0, 0.3, (D, FF))
    w["model.norm.weight"] = rng.uniform(0.5, 1.5, D)
    if not tied:
        w["lm_head.weight"] = rng.normal(0, 0.3, (V, D))
    return {k: v.astype(np.float32) for k, v in w.items()}


def tensor_kind(hf_name: str, kind: GT, embed_kind: GT) -> GT:
    if hf_name.endswith(("norm.weight", ".bias")):
        return GT.F32  # 1-D tensors stay f32, as llama.cpp writes them
    return embed_kind if hf_name == "model.embed_tokens.weight" else kind


def write_gguf(
    path,
    weights: dict[str, np.ndarray],
    *,
    arch: str = "llama",
    kind: GT = GT.F32,
    embed_kind: GT | None = None,
    drop_keys=(),
    drop_tensors=(),
    set_keys: dict | None = None,
    raw: dict | None = None,
    pre: str = "smollm",
    template: str | None = CHATML,
):
    """Writes ``weights`` (HF layout) as llama.cpp's converter would: GGUF names, q/k rows
    permuted for ``llama``, 2-D tensors as ``kind`` (the embedding as ``embed_kind``).

    ``raw``: GGUF name -> (payload, raw_dtype) written instead of the encoded tensor.
    ``set_keys``: metadata key -> (value, GGUFValueType) added or replaced.
    Returns {hf name: the HF-layout f32 tensor the file's bytes stand for}.
    """
    embed_kind = kind if embed_kind is None else embed_kind
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(LAYERS)
    w.add_context_length(CTX)
    w.add_embedding_length(D)
    w.add_feed_forward_length(FF)
    w.add_head_count(H)
    w.add_head_count_kv(KV)
    w.add_rope_freq_base(THETA)
    w.add_layer_norm_rms_eps(EPS)
    w.add_rope_dimension_count(HD)
    w.add_vocab_size(V)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(TOKENS)
    w.add_token_types(TOKEN_TYPES)
    w.add_token_merges(MERGES)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    if template is not None:
        w.add_chat_template(template)
    for key, (value, vtype) in (set_keys or {}).items():
        w.kv_data[0].pop(key, None)
        w.add_key_value(key, value, vtype)
    for key in drop_keys:
        del w.kv_data[0][key]
    expected = {}
    for name, t in weights.items():
        g = gguf_name(name)
        k = tensor_kind(name, kind, embed_kind)
        payload, raw_dtype = encode(t, k)
        # Quantization is row-local (blocks never span rows), so the bytes of the permuted
        # tensor stand for the permuted dequantized tensor: decode(encode(W)) is the HF view.
        expected[name] = decode(payload, k, t.shape)
        if arch == "llama" and "q_proj" in name:
            payload = permute(payload, H)
        elif arch == "llama" and "k_proj" in name:
            payload = permute(payload, KV)
        if g in (raw or {}):
            payload, raw_dtype = raw[g]
        if g in drop_tensors:
            continue
        w.add_tensor(g, np.ascontiguousarray(payload), raw_dtype=raw_dtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return expected


def write_hf_folder(path, family: str, tensors: dict[str, np.ndarray], tied: bool):
    """An HF folder (config.json + model.safetensors) written without specjax."""
    from safetensors.numpy import save_file

    path.mkdir(parents=True, exist_ok=True)
    save_file(
        {k: np.ascontiguousarray(v) for k, v in tensors.items()},
        str(path / "model.safetensors"),
        metadata={"format": "pt"},
    )
    cfg = {
        "architectures": [{"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}[family]],
        "model_type": family,
        "vocab_size": V,
        "hidden_size": D,
        "intermediate_size": FF,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": H,
        "num_key_value_heads": KV,
        "hidden_act": "silu",
        "max_position_embeddings": CTX,
        "rms_norm_eps": EPS,
        "rope_theta": THETA,
        "rope_parameters": {"rope_type": "default", "rope_theta": THETA},
        "tie_word_embeddings": tied,
        "torch_dtype": "float32",
    }
    (path / "config.json").write_text(json.dumps(cfg))
    return path


ROUND_TRIP = [
    "Hello, world! 12345 + 0.5 = 12345.5 and x2 = 2x.",
    "Ünïcödé: 日本語のテキスト, emoji 🙂👍🏽, Ελληνικά, עברית, क्षत्रिय, e\u0301 vs é",
    "tabs\tand  double  spaces\r\nwindows lines\n\n\nand trailing   ",
    "digits: 0123456789 ٣٤٥ ²½ 2024-01-01T12:34:56Z 0x1F",
    "<|im_start|>user\nhi<|im_end|>\n<think>some thought</think><|endoftext|>",
    "",
    " ",
    "\n",
    "a",
    "🙂",
]


def one_line_error(fn, path, *needles) -> str:
    """`fn()` raises a one-line ConfigError naming `path` and every needle; returns it."""
    with pytest.raises(ConfigError) as info:
        fn()
    msg = str(info.value)
    assert "\n" not in msg, msg
    assert str(path) in msg, msg
    for needle in needles:
        assert needle in msg, msg
    return msg
