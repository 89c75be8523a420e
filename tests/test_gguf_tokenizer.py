"""GGUF tokenizers and chat templates (`specjax.tokenizers.gguf`, through
`specjax.models.gguf`): the tokenizer rebuilt from ``tokenizer.ggml.*`` metadata (byte-level
BPE and SentencePiece vocabularies, BOS, special and user-defined tokens), the chat template
rendered as transformers does, and one-line errors for missing or unsupported metadata.

Synthetic files come from `gguf_fixtures` (a byte-level BPE vocabulary trained here with
SmolLM2's pre-tokenizer, written by ggml's own `gguf.GGUFWriter`); the real SmolLM2 file's
tokenizer is checked against transformers in `test_gguf_real`, with its model.
"""

from __future__ import annotations

import json

import pytest

gguf = pytest.importorskip("gguf")
import hf_fixtures as F  # noqa: E402
from gguf import GGMLQuantizationType as GT  # noqa: E402
from gguf_fixtures import (
    CHATML,
    ROUND_TRIP,
    SPECIALS,
    TOKEN_TYPES,
    TOKENIZER,  # noqa: E402
    TOKENS,
    USER_TOKEN,
    V,
    gpt2_bytes_to_unicode,
    make_weights,
    one_line_error,
    write_gguf,
)

from specjax.data import shipped  # noqa: E402
from specjax.errors import ConfigError  # noqa: E402
from specjax.models import gguf as G  # noqa: E402
from specjax.tokenizers import gguf as gguf_tok  # noqa: E402


@pytest.mark.parametrize(
    "key", ["tokenizer.ggml.tokens", "tokenizer.ggml.model", "tokenizer.ggml.merges"]
)
def test_missing_tokenizer_metadata(tmp_path, key):
    path = tmp_path / "notok.gguf"
    write_gguf(path, make_weights("llama", True, 0), drop_keys=[key])
    one_line_error(lambda: G.load_gguf_model(path), path, f"metadata {key} is missing")
    one_line_error(lambda: G.gguf_tokenizer(path), path, f"metadata {key} is missing")
    lm, _, family = G.load_gguf(path)  # the model alone needs no tokenizer
    assert family == "llama" and lm.vocab_size == V


def test_unsupported_pre_tokenizer(tmp_path):
    path = tmp_path / "pre.gguf"
    write_gguf(path, make_weights("llama", True, 0), pre="deepseek-llm")
    one_line_error(
        lambda: G.load_gguf_model(path), path, "tokenizer.ggml.pre='deepseek-llm' is not supported"
    )


# ----------------------------------------------------------------------------------------
# Tokenizer and chat template
# ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def synthetic_model(tmp_path_factory):
    """A tied Llama in SmolLM2's mix (Q4_1, a Q8_0 embedding) with the BPE vocabulary."""
    path = tmp_path_factory.mktemp("gguf_tok") / "Q4_1.gguf"
    write_gguf(path, make_weights("llama", True, 5), kind=GT.Q4_1, embed_kind=GT.Q8_0)
    return G.load_gguf_model(path)


def test_tokenizer_rebuilt_from_metadata(synthetic_model):
    tok = synthetic_model.tokenizer
    assert tok.vocab_size == V
    assert tok.special_tokens == {s: i for i, s in enumerate(SPECIALS)}
    to_byte = {c: b for b, c in gpt2_bytes_to_unicode().items()}
    for i, t in enumerate(TOKENS):  # every id spells its bytes
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
    types = [
        2 if t == "<unk>" else 3 if t in ("<s>", "</s>") else 6 if t.startswith("<0x") else 1
        for t in tokens
    ]
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
    texts = (
        [
            line
            for d in ("code", "prose", "reasoning")
            for line in shipped.load_heldout(d).splitlines()[:200]
        ]
        + ROUND_TRIP
        + [" lead", "<s>a</s> b"]
    )
    for text in texts:
        assert tok.hf_encode(text) == source.encode(text).ids, text[:40]
        assert tok.decode_bytes(tok.encode(text)) == text.encode("utf-8"), text[:40]


def test_bos_prefix_follows_add_bos_token(synthetic_model, tmp_path):
    assert synthetic_model.tokenizer.prompt_prefix == ()  # BPE default: no BOS
    path = tmp_path / "bos.gguf"
    write_gguf(
        path,
        make_weights("llama", True, 0),
        set_keys={"tokenizer.ggml.add_bos_token": (True, gguf.GGUFValueType.BOOL)},
    )
    assert G.gguf_tokenizer(path).prompt_prefix == (1,)


def test_chat_template(synthetic_model):
    m = synthetic_model
    assert m.chat_template == CHATML and (m.bos_id, m.eos_id) == (1, 2)
    assert m.chat("Hi there") == (
        "<|im_start|>system\nYou are a tiny test model.<|im_end|>\n"
        "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n"
    )
    assert m.chat("Q", system="S") == (
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n"
    )
    # Without a template, the text itself.
    assert G.GGUFModel(m.path, m.family, m.lm, m.params, m.tokenizer, None).chat("x") == "x"


def test_chat_template_matches_transformers():
    transformers = pytest.importorskip("transformers")
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=TOKENIZER, bos_token="<|im_start|>", eos_token="<|im_end|>"
    )
    # trim/lstrip blocks, loop controls, tojson (non-ASCII kept), bos_token, raise_exception
    template = (
        "{{ bos_token }}\n"
        "{% for m in messages %}\n"
        "    {% if m['role'] == 'stop' %}{% break %}{% endif %}\n"
        "    {% if m['role'] == 'skip' %}{% continue %}{% endif %}\n"
        "    {% if m['role'] == 'bad' %}{{ raise_exception('bad role') }}{% endif %}\n"
        "<{{ m['role'] }}>{{ m['content'] | tojson }}{{ m['content'] | tojson(indent=2) }}\n"
        "{% endfor %}\n"
        "{% if add_generation_prompt %}<assistant>{% endif %}"
    )
    messages = [
        {"role": "system", "content": "sé <b>"},
        {"role": "skip", "content": "x"},
        {"role": "user", "content": "日本 \"q\""},
        {"role": "stop", "content": ""},
        {"role": "user", "content": "never"},
    ]
    for tpl in (template, CHATML):
        for gen in (True, False):
            want = fast.apply_chat_template(
                messages[:3], chat_template=tpl, tokenize=False, add_generation_prompt=gen
            )
            got = gguf_tok.render_chat(
                tpl,
                messages[:3],
                add_generation_prompt=gen,
                bos_token="<|im_start|>",
                eos_token="<|im_end|>",
            )
            assert got == want
    got = gguf_tok.render_chat(template, messages, bos_token="B")
    assert "never" not in got and "skip" not in got
    with pytest.raises(ConfigError, match="chat template: bad role"):
        gguf_tok.render_chat(template, [{"role": "bad", "content": ""}])
    with pytest.raises(ConfigError, match="chat template: TemplateSyntaxError"):
        gguf_tok.render_chat("{% for %}", [])
