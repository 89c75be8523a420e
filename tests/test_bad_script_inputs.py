"""Bad input to the experiments/ scripts: a non-zero exit, the error on one line naming the
flag, no traceback, and nothing written before the error (each script's run itself is in
tests/test_experiment_scripts.py; the `specjax` CLI's bad inputs in test_bad_inputs.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run(script: str, *args: str) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [sys.executable, f"experiments/{script}", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    return proc


def _last_line(proc) -> str:
    return [line for line in proc.stderr.splitlines() if line.strip()][-1]


def test_loop_alpha_refuses_a_missing_file_in_one_line(tmp_path):
    proc = _run("loop_alpha.py", f"--out={tmp_path}", "--drafters=x=/no/file.npz")
    assert "--drafters: got 'x=/no/file.npz'" in _last_line(proc)


def test_loop_alpha_refuses_an_unknown_rule_in_one_line(tmp_path):
    proc = _run("loop_alpha.py", f"--out={tmp_path}", "--rules=token_tree")
    assert "--rules: one or more of rejection, block_verification" in proc.stderr


def test_benchmark_real_refuses_an_unknown_chain_rule_in_one_line(tmp_path):
    out = tmp_path / "run"
    proc = _run("benchmark_real.py", "--chain_rules=token_tree", f"--out={out}")
    assert "--chain_rules: one or more of rejection, block_verification" in proc.stderr
    assert not out.exists()


@pytest.mark.parametrize(
    "args, flag",
    [
        (["--stage=train"], "--stage: got 'train'"),
        (["--stage=generate,train", "--init_from=/nonexistent"], "--init_from: got '/nonexistent'"),
    ],
)
def test_train_drafters_refuses_missing_inputs_in_one_line(tmp_path, args, flag):
    out = tmp_path / "run"
    proc = _run("train_drafters.py", *args, "--domains=code", f"--out={out}")
    assert proc.returncode == 2
    assert _last_line(proc).startswith("train_drafters: error: " + flag)
    assert not out.exists()  # nothing written before the error


@pytest.mark.parametrize(
    "script, arg, field",
    [
        ("benchmark_real.py", "--dtype=float16", "--dtype: 'float16' is not allowed"),
        (
            "benchmark_real.py",
            "--dtypes=float32,bfloat16:sideways",
            "--dtypes: 'bfloat16:sideways'",
        ),
        ("compare_layouts.py", "--layouts=float32:tilted", "--layouts: 'float32:tilted'"),
    ],
)
def test_real_model_scripts_refuse_bad_layouts_in_one_line(tmp_path, script, arg, field):
    out = tmp_path / "run"
    proc = _run(script, arg, f"--out={out}")
    errors = [line for line in proc.stderr.splitlines() if field in line]
    assert len(errors) == 1 and "allowed: float32 or bfloat16" in errors[0], proc.stderr[-2000:]
    assert not out.exists()  # nothing written before the error


def test_compare_layouts_refuses_a_cache_too_small_in_one_line(tmp_path):
    out = tmp_path / "run"
    proc = _run("compare_layouts.py", "--capacity=50", f"--out={out}")
    assert proc.returncode == 2
    assert _last_line(proc).startswith(
        "compare_layouts: error: --capacity: got 50, allowed: 0 or >= "
    )
    assert not out.exists()


def test_profile_round_refuses_an_unknown_option_set_in_one_line(tmp_path):
    proc = _run("profile_round.py", f"--out={tmp_path}", "--compiler_options=ynn_all,fast")
    assert "--compiler_options: allowed names are single_thread" in proc.stderr
    assert not any(tmp_path.iterdir())


def test_loop_alpha_refuses_predict_at_another_temperature(tmp_path):
    proc = _run("loop_alpha.py", f"--out={tmp_path}", "--predict", "--tau=0")
    assert _last_line(proc).endswith("--tau: got 0.0, allowed: 1.0 with --predict")
    assert not any(tmp_path.iterdir())
