"""Hugging Face checkpoints: logit parity with transformers (PyTorch CPU, f32), export
round trips, greedy generations, streaming into shards, and one-line errors.

Tolerance 1e-4 absolute on logits of O(1..10) magnitude: both sides compute in f32 with
different contraction orders (XLA vs. PyTorch/oneDNN); measured differences are ~1e-6.
"""

from __future__ import annotations

import copy
import json
import math
import shutil
import struct

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import hf_fixtures as F  # noqa: E402

from specjax.engine import generate as gen  # noqa: E402
from specjax.engine.autoregressive import autoregressive_generate  # noqa: E402
from specjax.errors import ConfigError  # noqa: E402
from specjax.models import hf  # noqa: E402
from specjax.models.api import TransformerLM, advance, causal_block_mask  # noqa: E402
from specjax.models.transformer import TransformerConfig  # noqa: E402
from specjax.runtime import sharding as shd  # noqa: E402

ATOL = 1e-4
V = 96
# name -> (family, extra config): every feature the importer maps.
CASES = {
    "llama3_rope": (
        "llama",
        dict(
            rope_scaling={
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 16,
            }
        ),
    ),
    "llama_linear_tied": (
        "llama",
        dict(rope_scaling={"rope_type": "linear", "factor": 2.0}, tie_word_embeddings=True),
    ),
    "qwen2_tied_bias": ("qwen2", dict(tie_word_embeddings=True)),
    "mistral": ("mistral", dict(sliding_window=64, rope_theta=500.0)),
}
PARITY: dict[str, dict[str, float]] = {}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    out = {}
    for i, (name, (family, extra)) in enumerate(CASES.items()):
        model = F.hf_model(family, V, seed=i, **extra)
        out[name] = (F.save_folder(root / name, model), model)
    return out


def _hf_logits(model, tokens) -> np.ndarray:
    with torch.no_grad():
        return model(torch.tensor(np.asarray(tokens), dtype=torch.long)).logits.float().numpy()


def _tree(prefix_len: int, rng):
    """A token tree of 2 chains of depth 2 under a root: tokens, depths, mask, node paths."""
    parent = [-1, 0, 1, 0, 3]  # root, chain A (1, 2), chain B (3, 4)
    tokens = rng.integers(0, V, len(parent))
    depth = [0, 1, 2, 1, 2]
    n = len(parent)
    mask = np.zeros((n, n), bool)
    paths = []
    for t in range(n):
        path, u = [], t
        while u >= 0:
            mask[t, u] = True
            path.append(u)
            u = parent[u]
        paths.append(path[::-1])
    return tokens, np.array(depth), mask, paths


@pytest.mark.parametrize("name", list(CASES))
def test_logit_parity_prefill_decode_tree(folders, name):
    path, model = folders[name]
    lm, params, family = hf.load_hf(path, max_len=48)
    assert family == CASES[name][0]
    rng = np.random.default_rng(1)
    B, P = 2, 10
    seq = rng.integers(0, V, (B, P + 4))
    ref = _hf_logits(model, seq)

    fwd = jax.jit(lm.forward)
    # Prefill.
    cache = lm.init_cache(B)
    pos = jnp.broadcast_to(jnp.arange(P), (B, P))
    logits, cache = fwd(
        params, cache, jnp.asarray(seq[:, :P], jnp.int32), pos, causal_block_mask(B, P)
    )
    cache = advance(cache, P)
    err = {"prefill": float(np.abs(np.asarray(logits) - ref[:, :P]).max())}
    # Cached decode, one token at a time.
    dec = []
    for t in range(P, P + 4):
        lg, cache = fwd(
            params,
            cache,
            jnp.asarray(seq[:, t : t + 1], jnp.int32),
            jnp.full((B, 1), t, jnp.int32),
            causal_block_mask(B, 1),
        )
        cache = advance(cache, 1)
        dec.append(np.abs(np.asarray(lg[:, 0]) - ref[:, t]).max())
    err["decode"] = float(max(dec))
    # A tree-masked scoring block after the P committed tokens (a fresh prefill cache).
    cache = lm.init_cache(1)
    _, cache = fwd(
        params, cache, jnp.asarray(seq[:1, :P], jnp.int32), pos[:1], causal_block_mask(1, P)
    )
    cache = advance(cache, P)
    toks, depth, mask, paths = _tree(P, rng)
    lg, _ = fwd(
        params,
        cache,
        jnp.asarray(toks[None], jnp.int32),
        jnp.asarray(P + depth[None], jnp.int32),
        jnp.asarray(mask[None]),
    )
    tree_err = 0.0
    for t, path_nodes in enumerate(paths):
        full = np.concatenate([seq[0, :P], toks[path_nodes]])[None]
        tree_err = max(
            tree_err, np.abs(np.asarray(lg[0, t]) - _hf_logits(model, full)[0, -1]).max()
        )
    err["tree"] = float(tree_err)
    PARITY[name] = err
    print(f"\nparity {name}: " + ", ".join(f"{k} {v:.2e}" for k, v in err.items()))
    assert max(err.values()) < ATOL, err


@pytest.mark.parametrize("name", ["llama3_rope", "qwen2_tied_bias"])
def test_greedy_generation_identical(folders, name):
    path, model = folders[name]
    lm, params, _ = hf.load_hf(path, max_len=48)
    prompts = [[5, 17, 3, 9], [40, 2, 77, 1]]
    res = autoregressive_generate(
        lm, params, prompts, gen.row_keys_for(0, 2), temperature=0.0, max_new_tokens=12
    )
    with torch.no_grad():
        out = model.generate(
            torch.tensor(prompts),
            max_new_tokens=12,
            do_sample=False,
            attention_mask=torch.ones(2, 4, dtype=torch.long),
        )
    for b in range(2):
        assert res.new_tokens(b) == out[b, 4:].tolist()


def test_export_round_trip_through_transformers(folders, tmp_path):
    # HF -> specjax -> HF (sharded files) -> transformers: same logits, same tensors.
    path, model = folders["qwen2_tied_bias"]
    lm, params, _ = hf.load_hf(path, max_len=48)
    out = hf.save_hf(tmp_path / "out", lm, params, family="qwen2", max_shard_bytes=20_000)
    assert (out / hf.INDEX).is_file() and len(list(out.glob("*.safetensors"))) > 2
    again = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    tokens = np.random.default_rng(2).integers(0, V, (2, 9))
    np.testing.assert_array_equal(_hf_logits(again, tokens), _hf_logits(model, tokens))
    lm2, params2, _ = hf.load_hf(out, max_len=48)
    assert lm2.config == lm.config
    jax.tree.map(np.testing.assert_array_equal, params2, params)


def test_export_of_a_gemma_style_tied_model(tmp_path):
    # specjax's own tied models scale inputs by sqrt(d); export folds the scale in.
    cfg = TransformerConfig(
        vocab_size=V,
        d_model=32,
        n_layers=2,
        n_heads=4,
        n_kv_heads=2,
        d_ff=64,
        max_len=32,
        tie_embeddings=True,
    )
    lm = TransformerLM(cfg)
    params = lm.init_params(3)
    hf.save_hf(tmp_path / "m", lm, params, family="llama")
    model = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path / "m", dtype=torch.float32
    ).eval()
    tokens = np.random.default_rng(3).integers(0, V, (2, 12))
    diff = np.abs(
        _hf_logits(model, tokens) - np.asarray(lm.logits_full(params, jnp.asarray(tokens)))
    )
    assert diff.max() < ATOL


def test_bf16_checkpoint_and_sharded_streaming(folders, tmp_path):
    path, model = folders["llama3_rope"]
    # A copy: casting the fixture's model to bf16 and back would round its weights for every
    # later test of the module (greedy and logit parity against the f32 folder then failed
    # whenever this test ran first, as pytest-xdist's work stealing can order them).
    model = copy.deepcopy(model)
    model.to(torch.bfloat16).save_pretrained(tmp_path / "bf16", max_shard_size="30KB")
    lm, params, _ = hf.load_hf(tmp_path / "bf16", max_len=48, param_dtype="bfloat16")
    assert params["embed"].dtype == jnp.bfloat16
    ref_embed = model.model.embed_tokens.weight.detach().to(torch.bfloat16).float().numpy()
    np.testing.assert_array_equal(np.asarray(params["embed"], np.float32), ref_embed)
    # Straight into shards on 8 devices: every device holds only its slice.
    mesh = shd.make_mesh(2, 4)
    lm32, sharded, _ = hf.load_hf(path, max_len=48, mesh=mesh, rules="fsdp_tp")
    _, plain, _ = hf.load_hf(path, max_len=48)
    wq = sharded["layer_0"]["attn"]["wq"]
    assert wq.sharding.spec == jax.sharding.PartitionSpec("data", "model", None)
    assert wq.addressable_shards[0].data.shape == (16, 1, 8)
    jax.tree.map(
        lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), sharded, plain
    )


def test_memory_estimate_counts_shards():
    cfg = TransformerConfig(
        vocab_size=1024, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=128, max_len=64
    )
    one = hf.estimate_bytes(cfg, batch=2)
    lm = TransformerLM(cfg)
    n = sum(math.prod(x.shape) for x in jax.tree.leaves(lm.abstract_params()))
    assert one["params"] == 4 * n
    assert one["kv_cache"] == 2 * 4 * (2 * 2 * 64 * 2 * 16) + 2 * 4
    tp = hf.estimate_bytes(cfg, batch=2, mesh_shape={"data": 1, "model": 4}, rules="tp")
    assert tp["params"] < one["params"] / 2


# ----------------------------------------------------------------------------------------
# Errors: one line, naming the tensor or field
# ----------------------------------------------------------------------------------------


def _copy(folders, tmp_path, name="llama3_rope"):
    dst = tmp_path / "ckpt"
    shutil.copytree(folders[name][0], dst)
    return dst


def _rewrite(st_path, drop=None, reshape=None):
    """Rewrites a safetensors file without tensor `drop` / with `reshape`'s shape."""
    raw = st_path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    data = raw[8 + n :]
    new_header, chunks, off = {}, [], 0
    for key, rec in header.items():
        if key == "__metadata__":
            new_header[key] = rec
            continue
        if key == drop:
            continue
        a, b = rec["data_offsets"]
        blob = data[a:b]
        shape = rec["shape"]
        if reshape and key == reshape[0]:
            shape = reshape[1]
            blob = blob[: 4 * math.prod(shape)]
        new_header[key] = dict(rec, shape=shape, data_offsets=[off, off + len(blob)])
        chunks.append(blob)
        off += len(blob)
    hb = json.dumps(new_header).encode()
    st_path.write_bytes(struct.pack("<Q", len(hb)) + hb + b"".join(chunks))


def _one_line_error(path, match, **kw):
    with pytest.raises(ConfigError, match=match) as e:
        hf.load_hf(path, **kw)
    assert "\n" not in str(e.value)
    return str(e.value)


def test_error_missing_tensor(folders, tmp_path):
    p = _copy(folders, tmp_path)
    _rewrite(p / "model.safetensors", drop="model.layers.1.mlp.up_proj.weight")
    _one_line_error(p, r"missing tensor model\.layers\.1\.mlp\.up_proj\.weight")


def test_error_wrong_shape(folders, tmp_path):
    p = _copy(folders, tmp_path)
    _rewrite(p / "model.safetensors", reshape=("model.layers.0.self_attn.k_proj.weight", [8, 32]))
    _one_line_error(p, r"k_proj\.weight has shape \[8, 32\], config\.json implies \[16, 32\]")


def test_error_unknown_architecture(folders, tmp_path):
    p = _copy(folders, tmp_path)
    cfg = json.loads((p / "config.json").read_text())
    cfg.update(architectures=["GPTNeoXForCausalLM"], model_type="gpt_neox")
    (p / "config.json").write_text(json.dumps(cfg))
    _one_line_error(p, r"architectures=\['GPTNeoXForCausalLM'\].*not supported")


def test_error_unsupported_field(folders, tmp_path):
    p = _copy(folders, tmp_path)
    cfg = json.loads((p / "config.json").read_text())
    cfg["rope_parameters"] = {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4}
    (p / "config.json").write_text(json.dumps(cfg))
    _one_line_error(p, r"rope_type='yarn' is not supported")


def test_error_truncated_file(folders, tmp_path):
    p = _copy(folders, tmp_path)
    f = p / "model.safetensors"
    f.write_bytes(f.read_bytes()[:-100])
    _one_line_error(p, r"truncated safetensors file: tensor .* needs bytes up to \d+, the file has")
    f.write_bytes(f.read_bytes()[:20])
    _one_line_error(p, r"truncated safetensors file \(header of")


def test_error_unexpected_tensor_and_sliding_window(folders, tmp_path):
    p = _copy(folders, tmp_path, "mistral")
    _one_line_error(p, r"max_len=100 exceeds sliding_window=64", max_len=100)
    cfg = json.loads((p / "config.json").read_text())
    cfg["num_hidden_layers"] = 1
    (p / "config.json").write_text(json.dumps(cfg))
    _one_line_error(p, r"unexpected tensor model\.layers\.1\.")
