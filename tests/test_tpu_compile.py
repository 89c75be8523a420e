"""specjax's programs compiled by XLA:TPU for compile-only devices (no TPU needed, libtpu
is: `make test-tpu` installs it). Tiny models keep each compile to seconds; the planner
(`python -m specjax.tpu.plan`) compiles the real sizes."""

import jax
import pytest

pytest.importorskip("libtpu", reason="libtpu (the TPU compiler) is not installed: make test-tpu")

from specjax.models.api import TransformerConfig, TransformerLM  # noqa: E402
from specjax.tpu import programs as P  # noqa: E402
from specjax.tpu.aot import compile_for  # noqa: E402
from specjax.tpu.targets import slice_mesh  # noqa: E402

pytestmark = pytest.mark.tpu


def _verifier(**kw):
    base = dict(
        vocab_size=512,
        d_model=128,
        n_layers=2,
        n_heads=8,
        n_kv_heads=2,
        d_ff=256,
        max_len=256,
        tie_embeddings=True,
        embed_input_scale=False,
        dtype="bfloat16",
        param_dtype="bfloat16",
    )
    lm = TransformerLM(TransformerConfig(**{**base, **kw}))
    return lm, lm.abstract_params()


def _compile(fn, args, statics=None, mesh=None, name=""):
    with jax.set_mesh(mesh):
        c = compile_for(fn, args, statics, name=name, target="test")
    assert c.ok, c.error
    return c


def test_sharded_step_gathers_nothing_and_donates_its_cache():
    mesh = slice_mesh("v5e-4", 1, 4)
    lm, params = P.serve_form(*_verifier(), 4)  # 2 KV heads repeated to 4, head untied
    assert lm.config.n_kv_heads == 4
    for k in (1, 4):
        fn, args = P.forward_program(lm, params, mesh, "tp", 2, k, 128)
        c = _compile(fn, args, mesh=mesh)
        assert "all-gather" not in c.collectives(), c.collectives()
        assert c.alias_bytes > 0  # the cache is updated in place
        assert not c.copies(min_bytes=1 << 16), [o.shape for o in c.copies(1 << 16)]


def test_one_row_step_reads_its_weights_once():
    # Unpadded, XLA:TPU rewrote a one-row bf16 product with f32 accumulation into an f32
    # multiply-and-reduce that first wrote f32 copies of the weights: the batch-1 decode
    # step read ~2x the bytes of a two-token score (Llama-3.1-70B on a v5p-8).
    mesh = slice_mesh("v5p-8", 1, 4)
    lm, params = P.serve_form(*_verifier(d_model=1024, d_ff=2048, n_heads=8), 4)  # unpadded: 1.16x
    read = {}
    for k in (1, 2):
        fn, args = P.forward_program(lm, params, mesh, "tp", 1, k, 128)
        c = _compile(fn, args, mesh=mesh)
        read[k] = c.bytes_accessed
    assert read[1] <= 1.05 * read[2], read


def test_fsdp_decodes_without_moving_weights():
    mesh = slice_mesh("v5e-4", 2, 2)
    lm, params = P.serve_form(*_verifier(), 2)
    for rules in ("fsdp", "fsdp_tp"):
        fn, args = P.forward_program(lm, params, mesh, rules, 4, 1, 128)
        c = _compile(fn, args, mesh=mesh)
        gathered = c.collectives().get("all-gather", (0, 0))[1]
        assert gathered < 1 << 16, (rules, c.collectives())  # activations at most, no weight


@pytest.mark.parametrize(
    "rule, kinds",
    [("rejection", "lookup"), ("rejection", "subset"), ("token_tree", "lookup+cross")],
)
def test_speculative_generate_compiles(rule, kinds):
    mesh = slice_mesh("v5e-1")
    lm, params = P.serve_form(*_verifier(), 1)
    ds = [P.drafter(k, lm, kept=64) for k in kinds.split("+")]
    fn, statics, args = P.generate_program(
        lm, params, ds, mesh, "tp", rule=rule, gamma=2, prompt_len=8, new_tokens=8
    )
    c = _compile(fn, args, statics, mesh=mesh, name=f"{rule}/{kinds}")
    assert c.peak_bytes > 0


def test_autoregressive_and_plan_calls_compile():
    mesh = slice_mesh("v5e-1")
    lm, params = P.serve_form(*_verifier(), 1)
    fn, statics, args = P.ar_program(lm, params, mesh, "tp", prompt_len=8, new_tokens=8)
    _compile(fn, args, statics, mesh=mesh, name="ar")
    ds = [P.drafter("lookup", lm), P.drafter("transformer", lm)]
    progs = P.state_programs(
        lm, params, ds, mesh, "tp", rule="token_tree", gamma=2, prompt_len=8, new_tokens=8
    )
    assert set(progs) == {"plan_first", "plan_continue", "plan_fallback", "state_rows"}
    for name, (fn, statics, args) in progs.items():
        _compile(fn, args, statics, mesh=mesh, name=name)
