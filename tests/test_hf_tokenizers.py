"""tokenizer.json files through `HFTokenizer`: the three token-string conventions, exact
round trips, vocabulary maps between a byte-level and a SentencePiece-style vocabulary,
save/load, padding, and the tokenizer-vs-embedding check. Both tokenizers are built
locally (hf_fixtures), in the layouts Qwen2 / Llama 3 and Llama 2 / Mistral ship."""

from __future__ import annotations

import json

import hf_fixtures as F
import numpy as np
import pytest

from specjax.errors import ConfigError
from specjax.tokenizers import intersection_map, load_tokenizer, retokenization_table
from specjax.tokenizers.hf import HFTokenizer, load_hf_tokenizer, token_string_bytes

TEXTS = [
    "def f(x):\n    return x + 1\n",
    "  two  spaces\tand a tab\r\n",
    "naïve café 日本語 ✓ 🙂",
    "",
    " ",
    "\n\n",
    "<s> special </s> <|endoftext|>",
    "x" * 50,
]


@pytest.fixture(scope="module")
def byte_level():
    return HFTokenizer(json.loads(F.byte_level_tokenizer().to_str()), name="bl")


@pytest.fixture(scope="module")
def sentencepiece():
    return HFTokenizer(json.loads(F.sentencepiece_tokenizer().to_str()), name="sp")


def test_token_string_conventions():
    assert token_string_bytes("Ġthe", "byte_level") == b" the"
    assert token_string_bytes("Ċ", "byte_level") == b"\n"
    assert token_string_bytes("Ã©", "byte_level") == "é".encode()
    assert token_string_bytes("▁the", "sentencepiece") == b" the"
    assert token_string_bytes("<0x0A>", "sentencepiece", byte_fallback=True) == b"\n"
    assert token_string_bytes("<0x0A>", "sentencepiece", byte_fallback=False) == b"<0x0A>"
    assert token_string_bytes("é", "sentencepiece") == "é".encode()
    with pytest.raises(ValueError, match="byte-level alphabet"):
        token_string_bytes("▁x", "byte_level")


def test_styles_detected(byte_level, sentencepiece):
    assert byte_level.style == "byte_level" and not byte_level.byte_fallback
    assert sentencepiece.style == "sentencepiece" and sentencepiece.byte_fallback
    assert sentencepiece.token_bytes(3 + 0x0A) == b"\n"
    assert sentencepiece.special_tokens == {"<unk>": 0, "<s>": 1, "</s>": 2}


@pytest.mark.parametrize("text", TEXTS)
def test_exact_round_trips(byte_level, sentencepiece, text):
    for tok in (byte_level, sentencepiece):
        ids = tok.encode(text)
        assert tok.decode(ids) == text
        assert tok.encode_bytes(text.encode()) == ids


def test_sentencepiece_dummy_prefix_only_in_hf_encode(sentencepiece):
    # HF's pipeline prepends '▁' (a space) and a BOS; the exact encoding does not.
    hf_ids = sentencepiece.hf_encode("hello world")
    assert hf_ids[0] == 1 and sentencepiece.decode(hf_ids[1:]) == " hello world"
    assert sentencepiece.decode(sentencepiece.encode("hello world")) == "hello world"
    assert sentencepiece.encode(" the") == sentencepiece.encode_bytes(b" the")


def test_cut_characters_encode_exactly(byte_level, sentencepiece):
    data = "日本".encode()
    for cut in range(1, len(data)):
        for tok in (byte_level, sentencepiece):
            for part in (data[:cut], data[cut:]):
                assert tok.decode_bytes(tok.encode_bytes(part)) == part


def test_vocabulary_maps_between_conventions(byte_level, sentencepiece):
    # Drafter SentencePiece -> verifier byte-level: tokens meet through their bytes.
    to_v = intersection_map(sentencepiece, byte_level)
    ok = to_v >= 0
    assert ok.sum() > 100
    for i in np.nonzero(ok)[0]:
        assert sentencepiece.token_bytes(i) == byte_level.token_bytes(to_v[i])
    sp_the = sentencepiece.encode(" the")
    assert len(sp_the) == 1 and to_v[sp_the[0]] == byte_level.encode(" the")[0]
    # Byte-fallback ids map to the byte-level single-byte tokens.
    assert byte_level.token_bytes(to_v[3 + ord("x")]) == b"x"
    # Every verifier token re-spelt in drafter ids concatenates to its bytes.
    for src, dst in ((byte_level, sentencepiece), (sentencepiece, byte_level)):
        ids, lens = retokenization_table(src, dst)
        for i in range(src.vocab_size):
            assert dst.decode_bytes(ids[i, : lens[i]]) == src.token_bytes(i)


def test_save_load_and_padding(byte_level, tmp_path):
    byte_level.save(tmp_path / "t.json")
    again = load_tokenizer(tmp_path / "t.json")
    assert isinstance(again, HFTokenizer) and again.fingerprint() == byte_level.fingerprint()
    (tmp_path / "m").mkdir()
    byte_level.hf.save(str(tmp_path / "m" / "tokenizer.json"))
    padded = load_hf_tokenizer(tmp_path / "m", pad_to=byte_level.vocab_size + 4)
    assert padded.vocab_size == byte_level.vocab_size + 4
    assert padded.token_bytes(padded.vocab_size - 1) == b""
    assert (intersection_map(padded, byte_level)[-4:] == -1).all()
    with pytest.raises(ConfigError, match="pad_to=3 is below"):
        load_hf_tokenizer(tmp_path / "m", pad_to=3)


def test_tokenizer_vs_embedding_rows(tmp_path):
    pytest.importorskip("transformers")
    from specjax.models import hf

    tok = F.byte_level_tokenizer()
    n = tok.get_vocab_size()
    folder = F.save_folder(tmp_path / "big", F.hf_model("llama", n + 8), tok)
    with pytest.raises(
        ConfigError,
        match=rf"has {n} ids but vocab_size \(embedding rows of "
        rf"model\.embed_tokens\.weight\) is {n + 8}.*pad_vocab",
    ):
        hf.load_hf_model(folder)
    m = hf.load_hf_model(folder, pad_vocab=True)
    assert m.tokenizer.vocab_size == n + 8 == m.lm.vocab_size
    small = F.save_folder(tmp_path / "small", F.hf_model("qwen2", n - 8), tok)
    with pytest.raises(
        ConfigError, match=rf"has {n} ids but vocab_size .* is {n - 8}; allowed: equal$"
    ):
        hf.load_hf_model(small, pad_vocab=True)


def test_bad_tokenizer_files(tmp_path):
    with pytest.raises(ConfigError, match="missing"):
        load_hf_tokenizer(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        load_hf_tokenizer(tmp_path)
    spec = json.loads(F.byte_level_tokenizer().to_str())
    spec["normalizer"] = {"type": "Lowercase"}
    (tmp_path / "tokenizer.json").write_text(json.dumps(spec))
    with pytest.raises(ConfigError, match="normalizer Lowercase loses information"):
        load_hf_tokenizer(tmp_path)


def test_prompt_prefix_is_the_templates_bos(byte_level, sentencepiece):
    assert byte_level.prompt_prefix == ()  # no post-processor template
    assert sentencepiece.prompt_prefix == (1,)  # "<s> $A"
    assert sentencepiece.hf_encode("ab")[:1] == [1] and sentencepiece.encode("ab")[:1] != [1]
