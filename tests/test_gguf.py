"""GGUF files (`specjax.models.gguf`), synthetic: tensors, layouts, errors and export; the
real SmolLM2-135M-Instruct file against transformers is `test_gguf_real`'s, the tokenizer
and chat template of synthetic files are `test_gguf_tokenizer`'s.

Synthetic files (`gguf_fixtures`) are written with ggml's own `gguf.GGUFWriter`: a tiny
Llama and a Qwen2 with q/k/v biases. Each tensor type the issue's models use (F32, F16,
BF16, Q8_0, Q4_0, Q4_1) is checked twice: bit for bit against the fixtures' block decoder,
written from the ggml block layouts, and, through llama.cpp's q/k row permutation,
against the same weights loaded from an HF folder (bit-identical parameters, and
transformers' logits within 1e-4).
"""

from __future__ import annotations

import struct

import jax
import jax.numpy as jnp
import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
from gguf import GGMLQuantizationType as GT  # noqa: E402
from gguf_fixtures import (
    FF,
    HD,
    D,
    H,
    V,
    decode,
    make_weights,  # noqa: E402
    one_line_error,
    permute,
    write_gguf,
    write_hf_folder,
)

from specjax.models import gguf as G  # noqa: E402
from specjax.models import (
    gguf_reader,  # noqa: E402
    hf,  # noqa: E402
)

ATOL = 1e-4


def test_decoder_matches_ggml_reference_values():
    """The fixtures' decoder on hand-made blocks (so it does not merely agree with
    gguf.quants)."""
    d = np.float16(0.5).tobytes()
    m = np.float16(-1.0).tobytes()
    nibbles = bytes((lo | (hi << 4)) for lo, hi in zip(range(16), range(15, -1, -1), strict=True))
    q40 = decode(np.frombuffer(d + nibbles, np.uint8), GT.Q4_0, (32,))
    np.testing.assert_array_equal(q40[:16], (np.arange(16) - 8) * 0.5)
    np.testing.assert_array_equal(q40[16:], (np.arange(15, -1, -1) - 8) * 0.5)
    q41 = decode(np.frombuffer(d + m + nibbles, np.uint8), GT.Q4_1, (32,))
    np.testing.assert_array_equal(q41[:16], np.arange(16) * 0.5 - 1.0)
    q8 = decode(
        np.frombuffer(d + np.arange(-16, 16, dtype=np.int8).tobytes(), np.uint8), GT.Q8_0, (32,)
    )
    np.testing.assert_array_equal(q8, np.arange(-16, 16) * 0.5)
    bf = decode(np.frombuffer(np.array([0x3F80, 0xC040], "<u2").tobytes(), np.uint8), GT.BF16, (2,))
    np.testing.assert_array_equal(bf, [1.0, -3.0])


# name -> (arch, 2-D tensor type, embedding type, tied)
CASES = {
    "F32": ("llama", GT.F32, GT.F32, False),
    "F16": ("llama", GT.F16, GT.F16, True),
    "BF16": ("llama", GT.BF16, GT.BF16, False),
    "Q8_0": ("llama", GT.Q8_0, GT.Q8_0, False),
    "Q4_0": ("llama", GT.Q4_0, GT.Q4_0, False),
    "Q4_1": ("llama", GT.Q4_1, GT.Q8_0, True),  # SmolLM2's mix
    "qwen2_Q8_0": ("qwen2", GT.Q8_0, GT.F16, False),  # q/k/v biases, no permutation
}


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    """name -> (gguf path, HF folder of the same dequantized weights, family)."""
    root = tmp_path_factory.mktemp("gguf")
    out = {}
    for seed, (name, (arch, kind, embed_kind, tied)) in enumerate(CASES.items()):
        path = root / f"{name}.gguf"
        expected = write_gguf(
            path, make_weights(arch, tied, seed), arch=arch, kind=kind, embed_kind=embed_kind
        )
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
        got = gguf_reader.dequantize(t)
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
    np.testing.assert_array_equal(
        np.asarray(lm.logits_full(params, tokens)),
        np.asarray(lm_ref.logits_full(params_ref, tokens)),
    )


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
        a, b = x[: hd // 2], x[hd // 2 :]
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


def _cut(src, dst, n):
    dst.write_bytes(src.read_bytes()[:n])
    return dst


def test_truncated_files(good_file, tmp_path):
    r = gguf.GGUFReader(str(good_file))
    names = list(r.fields)
    tokens_field = r.fields["tokenizer.ggml.tokens"]
    before_tokens = names[names.index("tokenizer.ggml.tokens") - 1]
    t3, last = r.tensors[3], r.tensors[-1]
    cuts = {  # where -> (byte count kept, what the message names)
        "magic": (2, "truncated"),
        "header": (10, "the header"),
        "metadata": (tokens_field.offset + 300, f"metadata field after {before_tokens}"),
        "tensor table": (
            r.tensors[2].field.offset + 5,
            f"tensor table (the entry after {r.tensors[1].name})",
        ),
        "before data": (int(r.data_offset), f"tensor {r.tensors[0].name} "),
        "tensor data": (int(t3.data_offset) + 7, f"tensor {t3.name} "),
        "last byte": (int(last.data_offset + last.n_bytes) - 1, f"tensor {last.name} "),
    }
    size = good_file.stat().st_size
    for where, (n, needle) in cuts.items():
        assert 0 < n < size, where
        bad = _cut(good_file, tmp_path / f"cut_{where.replace(' ', '_')}.gguf", n)
        one_line_error(lambda bad=bad: G.read_gguf(bad), bad, "truncated", needle)
    one_line_error(lambda: G.load_gguf_model(bad), bad, "truncated")
    one_line_error(lambda: G.gguf_tokenizer(bad), bad, "truncated")


def test_unknown_tensor_types(good_file, tmp_path):
    # A ggml type outside TENSOR_TYPES (IQ4_NL: 32 weights in 18 bytes).
    assert "IQ4_NL" not in gguf_reader.TENSOR_TYPES
    path = tmp_path / "iq4.gguf"
    payload = np.random.default_rng(0).integers(0, 255, (H * HD, D // 32 * 18), dtype=np.uint8)
    write_gguf(
        path,
        make_weights("llama", False, 0),
        kind=GT.Q8_0,
        raw={"blk.0.attn_q.weight": (payload, GT.IQ4_NL)},
    )
    one_line_error(
        lambda: G.read_gguf(path),
        path,
        "tensor blk.0.attn_q.weight",
        "type IQ4_NL",
        "not supported",
    )
    # A type id that is no ggml type at all (patched in the tensor table).
    data = bytearray(good_file.read_bytes())
    name = b"blk.1.attn_k.weight"
    at = data.index(name) + len(name)
    n_dims = struct.unpack_from("<I", data, at)[0]
    struct.pack_into("<I", data, at + 4 + 8 * n_dims, 99)
    bad = tmp_path / "type99.gguf"
    bad.write_bytes(bytes(data))
    one_line_error(lambda: G.read_gguf(bad), bad, "tensor blk.1.attn_k.weight", "type id 99")


@pytest.mark.parametrize("arch", ["gpt2", "phi3"])
def test_unsupported_architecture(tmp_path, arch):
    path = tmp_path / f"{arch}.gguf"
    write_gguf(path, make_weights("llama", False, 0), arch=arch)
    one_line_error(
        lambda: G.read_gguf(path), path, f"general.architecture={arch!r}", "not supported"
    )


def test_missing_and_misshapen_tensors_and_fields(tmp_path):
    weights = make_weights("llama", False, 0)
    path = tmp_path / "missing.gguf"
    write_gguf(path, weights, drop_tensors=["blk.1.ffn_up.weight"])
    one_line_error(lambda: G.read_gguf(path), path, "missing tensor blk.1.ffn_up.weight")
    path = tmp_path / "noembed.gguf"
    write_gguf(path, weights, drop_tensors=["token_embd.weight"])
    one_line_error(lambda: G.read_gguf(path), path, "missing tensor token_embd.weight")
    path = tmp_path / "nolayers.gguf"
    write_gguf(path, weights, drop_keys=["llama.block_count"])
    one_line_error(lambda: G.read_gguf(path), path, "metadata llama.block_count")
    path = tmp_path / "shape.gguf"
    write_gguf(
        path, weights, raw={"blk.0.ffn_up.weight": (np.zeros((FF - 32, D), np.float32), None)}
    )
    one_line_error(lambda: G.read_gguf(path), path, "tensor blk.0.ffn_up.weight has shape")


def test_not_gguf_and_missing_files(tmp_path, good_file):
    text = tmp_path / "model.gguf"
    text.write_text("this is not a model\n" * 10)
    one_line_error(lambda: G.read_gguf(text), text, "not a GGUF file")
    empty = tmp_path / "empty.gguf"
    empty.write_bytes(b"")
    one_line_error(lambda: G.read_gguf(empty), empty, "not a GGUF file")
    folder = hf.save_hf(tmp_path / "hf", *G.load_gguf(good_file)[:2])
    st = folder / "model.safetensors"
    one_line_error(lambda: G.load_gguf_model(st), st, "not a GGUF file")
    missing = tmp_path / "nowhere.gguf"
    one_line_error(lambda: G.read_gguf(missing), missing, "no such file")
    one_line_error(lambda: G.load_gguf_model(tmp_path), tmp_path, "no such file")
    # A string that is not UTF-8 (the chat template's first byte)
    data = bytearray(good_file.read_bytes())
    data[data.index(b"{% for message")] = 0xFF
    bad = tmp_path / "utf8.gguf"
    bad.write_bytes(bytes(data))
    one_line_error(
        lambda: G.read_gguf(bad),
        bad,
        "metadata tokenizer.chat_template is unreadable",
        "UnicodeDecodeError",
    )
    # A corrupt version number: still one line naming the file.
    data = bytearray(good_file.read_bytes())
    struct.pack_into("<I", data, 4, 77)
    bad = tmp_path / "version.gguf"
    bad.write_bytes(bytes(data))
    one_line_error(lambda: G.read_gguf(bad), bad, "not a readable GGUF file")


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
    np.testing.assert_array_equal(
        np.asarray(lm.logits_full(params, tokens)), np.asarray(m.lm.logits_full(m.params, tokens))
    )
