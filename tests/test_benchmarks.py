"""The benchmark scripts run end to end at toy sizes (their figures are measured, never
asserted: this checks only that they run and write what they print)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_benchmark_runs_and_writes_json(tmp_path):
    proc = subprocess.run(
        [sys.executable, "experiments/benchmark.py", f"--out={tmp_path}", "--batches=1,2",
         "--gammas=2", "--new_tokens=8", "--repeats=1", "--peer=false", "--drafters=code"],
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads((tmp_path / "benchmark.json").read_text())
    assert [r["batch"] for r in out["per_batch"]] == [1, 2]
    assert {(r["drafter"], r["gamma"], r["batch"]) for r in out["rows"]} == {
        ("code", 2, 1), ("code", 2, 2)}
    assert all(r["spec_tokens_per_s"] > 0 and 0 <= r["alpha"] <= 1 for r in out["rows"])
