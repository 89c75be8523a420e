"""`specjax.measure.hardware`: the floors the benchmarks print beside measured times (weight bytes a
forward reads, the accelerator roofline, the ratio tables), and the SmolLM2 layout specs
the real-model benchmarks parse (`specjax.models.gguf.parse_layout`)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax.errors import ConfigError
from specjax.measure import hardware
from specjax.models.api import TransformerLM
from specjax.models.gguf import LAYOUT_TOKENS, parse_layout
from specjax.models.transformer import TransformerConfig


def test_weight_bytes_counts_every_array_less_an_untied_input_table():
    params = {"embed": jnp.zeros((10, 4), jnp.float32), "head": jnp.zeros((4, 10), jnp.bfloat16)}
    assert hardware.weight_bytes(params) == 10 * 4 * 4 + 4 * 10 * 2
    # An untied head is its own array: the input table is gathered, not streamed.
    assert hardware.weight_bytes(params, tied=False) == 4 * 10 * 2
    assert hardware.weight_bytes({"w": jnp.zeros((3,), jnp.int8)}, tied=False) == 3


def test_roofline_is_memory_bound_for_a_few_rows_and_compute_bound_for_many():
    cfg = TransformerConfig(vocab_size=49152, d_model=576, n_layers=30, n_heads=9, n_kv_heads=3)
    n = 134_515_008
    bw, peak = hardware.ACCELERATORS["H100 SXM"]
    one = hardware.roofline(cfg, n, 1, 1, 100)
    # One token: bf16 weights and the cache read once, at the HBM bandwidth.
    kv = 2 * cfg.n_layers * cfg.n_kv_heads * cfg.head_dim * 2 * 101
    assert one["H100 SXM"] == pytest.approx((2 * n + kv) / bw)
    # A few rows cost the same read; thousands of rows are bound by the FLOPs instead.
    assert hardware.roofline(cfg, n, 5, 1, 100)["H100 SXM"] / one["H100 SXM"] < 1.001
    many = hardware.roofline(cfg, n, 4096, 8, 100)
    assert many["H100 SXM"] == pytest.approx(
        (2 * n * 8 * 4096 + 4 * cfg.n_layers * cfg.d_model * 8 * 4096 * 100) / peak
    )
    assert set(one) == set(hardware.ACCELERATORS)


def test_score_ratios_rows_and_tables_on_a_tiny_model():
    cfg = TransformerConfig(
        vocab_size=64, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=64, max_len=256
    )
    lm = TransformerLM(cfg)
    params = lm.init_params(jax.random.PRNGKey(0))
    rows = hardware.score_ratios("tiny", lm, params, ["1", "2"], ["3"], bw=1e10, context=8)
    assert [r["batch"] for r in rows] == [1, 2]
    for r in rows:
        assert sorted(r["ratio"]) == [1, 3] and r["ratio"][1] == 1.0
        assert r["t_score"][1] == r["t_step"] > 0
        assert r["floor_s"] == pytest.approx(r["weight_bytes"] / 1e10)
        assert set(r["roofline_ratio"]) == set(hardware.ACCELERATORS)
        assert np.isfinite(r["ratio"][3]) and r["ratio"][3] > 0
    lines = hardware.ratio_tables(rows, context=8)
    assert lines[0] == "## T_score(k) / T_step (verifier forwards over 8 cached tokens)"
    assert sum(line.startswith("| tiny |") for line in lines) == 2
    # One roofline row per accelerator and batch size, however many layouts were timed.
    assert sum(line.startswith("| H100 SXM |") for line in lines) == 2
    assert len(hardware.ratio_tables(rows + rows, context=8)) == len(lines) + 2


def test_parse_layout():
    assert parse_layout("bfloat16:out_first") == ("bfloat16", {"out_first"})
    assert parse_layout("float32") == ("float32", set())
    assert parse_layout("float32:tied+fused") == ("float32", {"tied", "fused"})
    assert parse_layout("float32:einsum", extra=("einsum",)) == ("float32", {"einsum"})


@pytest.mark.parametrize("spec", ["float16", "bfloat16:sideways", "float32:einsum", ""])
def test_parse_layout_errors_name_the_field_and_what_is_allowed(spec):
    with pytest.raises(ConfigError) as e:
        parse_layout(spec, "--dtype")
    msg = str(e.value)
    assert msg.startswith(f"--dtype: {spec!r} is not allowed") and "\n" not in msg
    assert "float32 or bfloat16" in msg and all(t in msg for t in LAYOUT_TOKENS)
    assert e.value.field == "--dtype" and e.value.value == spec
