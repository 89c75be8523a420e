"""The TPU planner end to end on a tiny deployment (compile-only XLA:TPU, `make test-tpu`):
its journal, the served layouts every program takes, the page rendered from the journal."""

import json

import pytest

pytest.importorskip("libtpu", reason="libtpu (the TPU compiler) is not installed: make test-tpu")

from specjax.tpu import layouts as LY  # noqa: E402
from specjax.tpu import plan  # noqa: E402
from specjax.tpu.page import render  # noqa: E402

pytestmark = pytest.mark.tpu

_CONFIG = '''
import ml_collections


def get_config(name):
    c = ml_collections.ConfigDict()
    c.name = name
    c.title = "A tiny deployment"
    c.description = "A 2-layer verifier, a transformer drafter and prompt lookup."
    c.verifier = {verifier!r}
    c.dtype = "bfloat16"
    c.max_len = 128
    c.capacity = 128
    c.slices = ["v5e-4"]
    c.rule_sets = ["tp"]
    c.recommend = "tp"
    c.batches = [1]
    c.ks = [1, 2, 4]
    c.ks_other = [1]
    c.other_batches = [1]
    c.drafter_batches = [1]
    c.gamma = 2
    c.prompt_len = 8
    c.new_tokens = 8
    c.generate_batch = 1
    c.state_programs = False
    c.copy_min_bytes = 1 << 12  # the tiny model's weights are 0.5 MiB per chip
    c.state_rule = "token_tree"
    c.drafters = {{"small": {{"kind": "transformer"}}, "lookup": {{"kind": "lookup"}}}}
    c.alphas = {{"small": (0.5, "a test value")}}
    c.generates = [("token_tree", "lookup+small")]
    c.state_drafters = "lookup+small"
    c.served_drafters = "small"
    return c
'''


def test_planner_serves_one_layout_set_and_relays_nothing(tmp_path):
    hf = dict(
        architectures=["LlamaForCausalLM"],
        vocab_size=512,
        hidden_size=1024,  # head_dim 128, weights 0.5 MiB per chip: default layouts relay some
        num_hidden_layers=2,
        num_attention_heads=8,
        num_key_value_heads=2,
        intermediate_size=2048,
        rope_theta=10000.0,
        tie_word_embeddings=True,
        max_position_embeddings=256,
        rms_norm_eps=1e-5,
        hidden_act="silu",
    )
    (tmp_path / "config.json").write_text(json.dumps(hf))
    cfg_file = tmp_path / "plan_test.py"
    cfg_file.write_text(_CONFIG.format(verifier=str(tmp_path / "config.json")))
    cfg = plan._load(f"{cfg_file}:tiny")
    work = tmp_path / "work"
    journal = plan.run_tasks(cfg, work, log=lambda s: None)
    recs = [json.loads(line) for line in journal.read_text().splitlines()]
    assert recs[0]["program"] == "served_layouts"  # first: every other program reads its set
    assert all(r["ok"] for r in recs), [r["error"] for r in recs if not r["ok"]]
    served = plan.layouts_path(
        work, plan.Task(**{f: recs[0][f] for f in plan.Task.__dataclass_fields__})
    )
    v, ds = LY.load(served)
    assert v and set(ds) == {"small"} and ds["small"]
    for r in recs[1:]:
        assert r["layouts"] == r["compiled_layouts"] == "served", r["program"]
        # weights in the served set: no program relays one per call
        assert r["n_copies"] == 0, (r["program"], r["copies"])
    assert plan.missing(cfg, work) == []  # a rerun compiles nothing
    page = render(recs, {cfg.name: cfg}, "python -m specjax.tpu.plan --config=test")
    assert "served_layouts" in page and "| served |" in page


def test_projections_use_the_compilers_figures_where_it_estimates_every_step():
    """Item 3: a time is the compiler's estimate where it gives one, else a roofline. The
    projections take the compiler's T_step and T_score where it estimates every step of the
    smallest batch (v5p), the roofline's otherwise (v5e: its estimate comes back ≤ 0)."""
    import ml_collections

    from specjax.tpu import page
    from specjax.tpu.targets import CHIPS

    chip = next(iter(CHIPS.values()))

    def rec(k, opt):
        return {
            "ok": True,
            "batch": 1,
            "k": k,
            "optimal_seconds": opt,
            "flops": 1.0,
            "argument_bytes": 1e9,
            "output_bytes": 0,
            "alias_bytes": 0,
        }

    cfg = ml_collections.ConfigDict({"recommend": "tp"})
    every = [rec(1, 2e-3), rec(4, 2.2e-3)]
    _, ratios, by_compiler = page._step_times(cfg, every, chip, lambda b, k: 0.0)
    assert by_compiler and ratios[1][0] == 2e-3 and ratios[1][1][4] == pytest.approx(1.1)
    one_missing = [rec(1, 2e-3), rec(4, -1.0)]
    _, ratios, by_compiler = page._step_times(cfg, one_missing, chip, lambda b, k: 0.0)
    assert not by_compiler and ratios[1][1][4] == pytest.approx(1.0)  # the roofline's
