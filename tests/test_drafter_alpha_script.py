"""experiments/drafter_alpha.py: its one-line refusals, and the held-out features file its
run test (tests/test_experiment_scripts.py::test_drafter_alpha) reads."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]


def write_features(folder: Path) -> Path:
    """Held-out `Features` of two short plan replies under SmolLM2 (f32), saved in `folder`."""
    from specjax.models.gguf import smollm2  # pylint: disable=import-outside-toplevel
    from specjax.train import distill, distill_eagle  # pylint: disable=import-outside-toplevel

    model = smollm2(max_len=256)
    rows = [
        ("Write a function that adds two numbers.", "def add(a, b):\n    return a + b"),
        ("Describe the sea.", "The sea is wide, grey and restless under the wind."),
    ]
    p = [model.tokenizer.encode(a) for a, _ in rows]
    r = [model.tokenizer.encode(b) for _, b in rows]
    w_p, w_r = max(map(len, p)), max(map(len, r))
    gen = distill.Generated(
        prompt=np.array([x + [0] * (w_p - len(x)) for x in p], np.int32),
        prompt_len=np.array([len(x) for x in p], np.int32),
        tokens=np.array([x + [0] * (w_r - len(x)) for x in r], np.int32),
        valid=np.array([[i < len(x) for i in range(w_r)] for x in r]),
        top_ids=np.zeros((2, w_r, 1), np.int32),
        top_logp=np.zeros((2, w_r, 1), np.float32),
        temperature=1.0,
    )
    path = folder / "features.npz"
    distill_eagle.verifier_features(model, gen, log=lambda s: None).save(path)
    return path


@pytest.mark.parametrize(
    "arg,field",
    [("--features=code=/no/file.npz", "--features"), ("--temperatures=0", "--temperatures")],
)
def test_drafter_alpha_refuses_bad_input_in_one_line(tmp_path, arg, field):
    good = f"--features=x={ROOT / 'pyproject.toml'}"
    args = [arg] if field == "--features" else [good, arg]
    proc = subprocess.run(
        [sys.executable, "experiments/drafter_alpha.py", f"--out={tmp_path}", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert f"{field}: got" in proc.stderr.strip().splitlines()[-1]
    assert not list(tmp_path.iterdir())
