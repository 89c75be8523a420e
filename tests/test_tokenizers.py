"""Tokenizers: exact round trips, special tokens, raw-byte encoding, vocabulary maps,
fingerprints and error messages. Trains small BPEs on the shipped held-out text (fast)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tokenizers as hf_tokenizers

from specjax.data import DOMAINS, REASONING_SPECIAL_TOKENS, load_heldout
from specjax.tokenizers import (
    BPETokenizer,
    ByteTokenizer,
    Tokenizer,
    intersection_map,
    load_tokenizer,
    retokenization_table,
    same_group,
    train_bpe,
)

SPECIALS = REASONING_SPECIAL_TOKENS  # ("<think>", "</think>")
TRICKY = [
    "",
    " ",
    "\n",
    "  leading and trailing  \n\n",
    "tabs\tand\r\nwindows\rlines\x0c",
    "héllo wörld — “quotes” … 你好，世界 🙂🚀 ﬁ ẞ \u200b zero-width",
    "<think>x</think><think></think> <think> a</think>\n",
    "<think<think>>",
    "</think",
    "<<think>>",
    "a<think>b</think>c",
    "def f(x):\n    return x ** 2  # comment\n",
]


@pytest.fixture(scope="module")
def heldout() -> dict[str, str]:
    return {d: load_heldout(d) for d in DOMAINS}


@pytest.fixture(scope="module")
def bpes(heldout) -> dict[int, BPETokenizer]:
    texts = list(heldout.values())
    return {v: train_bpe(texts, v, SPECIALS, name=f"bpe{v}") for v in (300, 512)}


@pytest.fixture(scope="module")
def tokenizers(bpes) -> dict[str, Tokenizer]:
    return {
        "byte": ByteTokenizer(),
        "byte+special": ByteTokenizer(SPECIALS),
        "bpe300": bpes[300],
        "bpe512": bpes[512],
    }


def _all_substrings_bytes(s: str):
    data = s.encode("utf-8")
    for i in range(len(data)):
        for j in range(i + 1, len(data) + 1):
            yield data[i:j]


def test_vocab_sizes(tokenizers, bpes):
    assert tokenizers["byte"].vocab_size == 256
    assert tokenizers["byte+special"].vocab_size == 258
    assert bpes[300].vocab_size == 300 and bpes[512].vocab_size == 512


@pytest.mark.parametrize("domain", DOMAINS)
@pytest.mark.parametrize("tok_name", ["byte", "byte+special", "bpe300", "bpe512"])
def test_round_trip_heldout(tokenizers, heldout, tok_name, domain):
    tok, text = tokenizers[tok_name], heldout[domain]
    ids = tok.encode(text)
    assert all(0 <= i < tok.vocab_size for i in ids)
    assert tok.decode(ids) == text
    assert tok.decode_bytes(ids) == text.encode("utf-8")
    if tok_name == "bpe512":
        assert len(ids) < 0.75 * len(text.encode("utf-8"))  # it actually compresses


@pytest.mark.parametrize("tok_name", ["byte", "byte+special", "bpe300", "bpe512"])
def test_round_trip_tricky(tokenizers, tok_name):
    tok = tokenizers[tok_name]
    for s in TRICKY:
        assert tok.decode(tok.encode(s)) == s, repr(s)


@pytest.mark.parametrize("tok_name", ["byte+special", "bpe300", "bpe512"])
def test_special_tokens_are_single_ids(tokenizers, tok_name):
    tok = tokenizers[tok_name]
    specials = tok.special_tokens
    assert set(specials) == set(SPECIALS)
    for s, sid in specials.items():
        assert tok.encode(s) == [sid]
        assert tok.token_bytes(sid) == s.encode()
        assert tok.decode([sid]) == s
        ids = tok.encode(f"Q: 2 + 2?\n{s} 4 {s}x")
        assert ids.count(sid) == 2
    ids = tok.encode("a <think>\nb\n</think>\nA: 4")
    assert specials["<think>"] in ids and specials["</think>"] in ids
    assert tok.decode(ids) == "a <think>\nb\n</think>\nA: 4"


@pytest.mark.parametrize("tok_name", ["byte", "byte+special", "bpe300", "bpe512"])
def test_encode_bytes_agrees_with_encode(tokenizers, heldout, tok_name):
    tok = tokenizers[tok_name]
    lines = [ln for d in DOMAINS for ln in heldout[d].splitlines(keepends=True)[:150]]
    for s in TRICKY + lines:
        assert tok.encode_bytes(s.encode("utf-8")) == tok.encode(s), repr(s)


@pytest.mark.parametrize("tok_name", ["byte", "bpe300", "bpe512"])
def test_encode_bytes_exact_on_invalid_utf8(tokenizers, tok_name):
    tok = tokenizers[tok_name]
    # Every byte slice of multi-byte text, including slices cutting characters.
    for data in _all_substrings_bytes("é你🙂 <think>ab"):
        ids = tok.encode_bytes(data)
        assert tok.decode_bytes(ids) == data, data
    for data in (bytes(range(256)), b"\xff\xfe<think>\x80", b"\xed\xa0\x80"):
        assert tok.decode_bytes(tok.encode_bytes(data)) == data


def test_token_bytes_cover_all_single_bytes(bpes):
    for tok in bpes.values():
        table = tok.all_token_bytes()
        assert table == [tok.token_bytes(i) for i in range(tok.vocab_size)]
        assert {bytes([b]) for b in range(256)} <= set(table)
        assert all(table)  # no empty token


@pytest.mark.parametrize(
    "pair",
    [
        ("bpe300", "bpe512"),
        ("bpe512", "bpe300"),
        ("byte", "bpe512"),
        ("bpe512", "byte+special"),
        ("byte+special", "bpe300"),
    ],
)
def test_intersection_map(tokenizers, pair):
    src, dst = tokenizers[pair[0]], tokenizers[pair[1]]
    m = intersection_map(src, dst)
    assert m.shape == (src.vocab_size,) and m.dtype == np.int32
    dst_bytes = set(dst.all_token_bytes())
    for i in range(src.vocab_size):
        b = src.token_bytes(i)
        if m[i] >= 0:
            assert dst.token_bytes(int(m[i])) == b
        else:
            assert b not in dst_bytes
    assert (m >= 0).sum() >= 256 - (src.vocab_size - len(set(src.all_token_bytes())))


def test_intersection_map_special_tokens_and_identity(tokenizers):
    bpe, byte = tokenizers["bpe512"], tokenizers["byte+special"]
    m = intersection_map(byte, bpe)
    for s in SPECIALS:
        assert m[byte.special_tokens[s]] == bpe.special_tokens[s]
    # 300 is a prefix of 512's training (same data, fewer merges): every token maps.
    assert (intersection_map(tokenizers["bpe300"], bpe) >= 0).all()
    np.testing.assert_array_equal(intersection_map(bpe, bpe), np.arange(bpe.vocab_size))


@pytest.mark.parametrize(
    "pair",
    [("bpe512", "byte"), ("bpe512", "bpe300"), ("bpe300", "bpe512"), ("byte+special", "bpe512")],
)
def test_retokenization_table(tokenizers, pair):
    src, dst = tokenizers[pair[0]], tokenizers[pair[1]]
    ids, lengths = retokenization_table(src, dst)
    assert ids.dtype == np.int32 and lengths.dtype == np.int32
    assert ids.shape == (src.vocab_size, int(lengths.max()))
    for i in range(src.vocab_size):
        row = ids[i, : lengths[i]]
        assert dst.decode_bytes(row) == src.token_bytes(i)
        assert list(row) == dst.encode_bytes(src.token_bytes(i))
        assert (ids[i, lengths[i] :] == 0).all()
    if pair == ("bpe512", "byte"):
        np.testing.assert_array_equal(
            lengths, [len(src.token_bytes(i)) for i in range(src.vocab_size)]
        )


def test_fingerprint_determinism(heldout, bpes, tmp_path):
    texts = list(heldout.values())
    again = train_bpe(texts, 512, SPECIALS, name="other-name")
    assert again.fingerprint() == bpes[512].fingerprint()
    assert same_group(again, bpes[512])
    assert again.encode(texts[0]) == bpes[512].encode(texts[0])
    assert not same_group(bpes[300], bpes[512])
    assert not same_group(train_bpe(texts, 512, (), name="x"), bpes[512])
    assert ByteTokenizer().fingerprint() != ByteTokenizer(SPECIALS).fingerprint()
    assert same_group(ByteTokenizer(name="a"), ByteTokenizer(name="b"))
    # A fresh process (new hash seeds, thread scheduling) trains the same tokenizer.
    corpus = tmp_path / "corpus.json"
    corpus.write_text(json.dumps(texts))
    code = (
        "import json,sys; from specjax.tokenizers import train_bpe; "
        "t=json.load(open(sys.argv[1])); "
        "print(train_bpe(t, 512, ('<think>','</think>')).fingerprint())"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run(
        [sys.executable, "-c", code, str(corpus)],
        capture_output=True,
        text=True,
        env=env,
        check=True,
        timeout=120,
    )
    assert out.stdout.strip() == bpes[512].fingerprint()


@pytest.mark.parametrize("tok_name", ["byte", "byte+special", "bpe300", "bpe512"])
def test_save_load(tokenizers, heldout, tok_name, tmp_path):
    tok = tokenizers[tok_name]
    path = tmp_path / "tok.json"
    tok.save(path)
    back = load_tokenizer(path)
    assert type(back) is type(tok) and back.name == tok.name
    assert back.fingerprint() == tok.fingerprint()
    text = heldout["reasoning"][:3000]
    assert back.encode(text) == tok.encode(text)
    assert type(tok).load(path).fingerprint() == tok.fingerprint()


def test_load_raw_hf_tokenizer_json(bpes, tmp_path):
    path = tmp_path / "tokenizer.json"
    path.write_text(bpes[300].hf.to_str())
    back = load_tokenizer(path)
    assert isinstance(back, BPETokenizer) and same_group(back, bpes[300])


def _one_line_error(fn, *match: str) -> str:
    with pytest.raises(ValueError) as e:
        fn()
    msg = str(e.value)
    assert "\n" not in msg, msg
    for m in match:
        assert m in msg, msg
    return msg


def test_errors(tmp_path, bpes):
    _one_line_error(lambda: load_tokenizer(tmp_path / "nope.json"), "not found", "nope.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    _one_line_error(lambda: load_tokenizer(bad), "bad.json", "not a valid tokenizer JSON")
    bad.write_text(json.dumps({"kind": "wordpiece", "name": "w"}))
    _one_line_error(lambda: load_tokenizer(bad), "unknown tokenizer kind", "wordpiece")
    bad.write_text("[1, 2]")
    _one_line_error(lambda: load_tokenizer(bad), "must be an object")
    bad.write_text(json.dumps({"kind": "bpe", "name": "b", "tokenizer": {"model": 3}}))
    _one_line_error(lambda: load_tokenizer(bad), "invalid HF tokenizer spec")
    bad.write_text(json.dumps({"kind": "bpe", "name": "b"}))
    _one_line_error(lambda: load_tokenizer(bad), "lacks a 'tokenizer'")
    bad.write_text(json.dumps({"kind": "byte", "format_version": 99}))
    _one_line_error(lambda: load_tokenizer(bad), "format_version 99")
    ByteTokenizer().save(bad)
    _one_line_error(lambda: BPETokenizer.load(bad), "not a BPETokenizer")
    _one_line_error(lambda: ByteTokenizer().token_bytes(256), "out of range")
    _one_line_error(lambda: bpes[300].token_bytes(-1), "out of range")
    _one_line_error(lambda: train_bpe(["abc"], 257, SPECIALS), "vocab_size 257")
    _one_line_error(lambda: ByteTokenizer(["<a>", "<a>"]), "duplicate")
    # A normalizer would make round trips lossy: refused.
    lossy = hf_tokenizers.Tokenizer.from_str(bpes[300].hf.to_str())
    lossy.normalizer = hf_tokenizers.normalizers.Lowercase()
    _one_line_error(lambda: BPETokenizer(lossy), "normalizer")
