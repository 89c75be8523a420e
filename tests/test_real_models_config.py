"""configs/real_models.py on tiny random Hugging Face folders of three families and two
tokenizer conventions: a Llama verifier (byte-level BPE), a Qwen2 code drafter (the same
tokenizer), a Mistral prose drafter and a Llama reasoning drafter (SentencePiece-style,
byte fallback: cross-vocabulary)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import hf_fixtures as F  # noqa: E402

from specjax.errors import ConfigError  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("real")
    bl, sp = F.byte_level_tokenizer(), F.sentencepiece_tokenizer()
    nb, ns = bl.get_vocab_size(), sp.get_vocab_size()
    ctx = {"max_position_embeddings": 256}  # runlocal's max_len: within every context
    models = {
        "verifier": F.hf_model("llama", nb, d=64, ff=128, seed=0, std=0.1, **ctx),
        "code": F.hf_model("qwen2", nb, layers=1, seed=1, std=0.1, tie_word_embeddings=True, **ctx),
        "prose": F.hf_model("mistral", ns, layers=1, seed=2, std=0.1, **ctx),
        "reasoning": F.hf_model("llama", ns, layers=1, seed=3, std=0.1, **ctx),
    }
    toks = {"verifier": bl, "code": bl, "prose": sp, "reasoning": sp}
    paths = {n: F.save_folder(root / n, m, toks[n]) for n, m in models.items()}
    return paths, models


def _tok(path):
    from specjax.tokenizers.hf import load_hf_tokenizer

    return load_hf_tokenizer(path)


def _config(paths, *variant):
    sys.path.insert(0, str(ROOT / "configs"))
    try:
        import real_models  # pylint: disable=import-outside-toplevel
    finally:
        sys.path.pop(0)
    c = real_models.get_config(",".join(["runlocal", *variant]))
    c.verifier = str(paths["verifier"])
    for n in ("code", "prose", "reasoning"):
        c.drafters[n].path = str(paths[n])
    return c


def test_validation_names_the_field(folders, tmp_path):
    from specjax.runner import experiments

    paths, _ = folders
    c = _config(paths)
    c.drafters.prose.path = str(tmp_path / "nowhere")
    with pytest.raises(ConfigError, match=r"drafters\.prose\.path: got .*nowhere.*config\.json"):
        experiments.validate(c)
    c = _config(paths)
    c.rules = "zero3"
    with pytest.raises(ConfigError, match=r"rules: got 'zero3'"):
        experiments.validate(c)


@pytest.mark.slow  # ~20 s: builds and runs a deployment of two HF folders; `make test-all`
def test_deployment_and_memory_table(folders):
    import jax.numpy as jnp

    from specjax.engine import generate as gen
    from specjax.engine.deployment import build_deployment
    from specjax.engine.spec import EngineConfig
    from specjax.runner import experiments
    from specjax.runner.deployments import hf as hf_deployment

    paths, models = folders
    c = _config(paths)
    experiments.validate(c)
    rows = hf_deployment.memory_table(c)
    assert [r["family"] for r in rows] == ["llama", "qwen2", "mistral", "llama"]
    assert all(r["total"] == r["params"] + r["kv_cache"] > 0 for r in rows)
    dep = experiments.load_deployment(c)
    assert dep.names == ("code", "prose", "reasoning")
    assert dep.groups[0] != dep.groups[1] == dep.groups[2]  # two tokenizer groups
    assert (np.asarray(dep.d_data[1].to_verifier) >= 0).sum() > 100
    # Prompts start with each tokenizer's own BOS (the SentencePiece-style one has '<s>'
    # in its template, the byte-level one none); `bos=False` spells the text alone.
    sp = dep.drafter_encode[1]
    assert sp("def f") == [1] + sp("def f")[1:] and dep.encode("def f")[0] != 1
    plain = build_deployment(
        SimpleNamespace(lm=dep.verifier, params=dep.v_params, tokenizer=_tok(paths["verifier"])),
        [
            (
                "prose",
                SimpleNamespace(
                    lm=dep.drafters[1].lm,
                    params=dep.d_data[1].params,
                    tokenizer=_tok(paths["prose"]),
                ),
                1.0,
                0.1,
            )
        ],
        bos=False,
    )
    assert [1] + plain.drafter_encode[0]("def f") == sp("def f")
    # Greedy speculative decoding across families and vocabularies = the verifier's own
    # greedy output (HF transformers).
    texts = ["def add(a, b):", "In the beginning"]
    prompts = [dep.encode(t) for t in texts]
    cfg = EngineConfig(
        gamma=3, rule="token_tree", verifier_temperature=0.0, n_slots=3, max_new_tokens=10
    )
    res = gen.speculative_generate(
        cfg,
        dep.verifier,
        dep.v_params,
        dep.drafters,
        dep.d_data,
        prompts,
        [[enc(t) for t in texts] for enc in dep.drafter_encode],
        gen.row_keys_for(0, 2),
    )
    import torch

    for b, p in enumerate(prompts):
        with torch.no_grad():
            out = models["verifier"].generate(
                torch.tensor([p]),
                max_new_tokens=10,
                do_sample=False,
                attention_mask=torch.ones(1, len(p), dtype=torch.long),
            )
        assert res.new_tokens(b) == out[0, len(p) :].tolist()
    assert int(res.counters.accepted.sum()) >= 0 and jnp.asarray(res.tokens).shape[0] == 2


@pytest.mark.slow
@pytest.mark.parametrize("mesh", [[], ["--config.mesh.model=2"]], ids=["one_device", "model2"])
def test_cli_runs_the_config(folders, tmp_path, mesh):
    """The config end to end through the CLI; on one device and over a 'model' axis of 2
    of the 8 test devices (the verifier, its caches and every priced program sharded)."""
    paths, _ = folders
    cmd = [
        sys.executable,
        "-m",
        "specjax.main",
        "--config=configs/real_models.py:runlocal",
        f"--workdir={tmp_path / 'run'}",
        f"--config.verifier={paths['verifier']}",
        "--config.plans_per_domain=1",
        "--config.plan_steps=1",
    ]
    cmd += [f"--config.drafters.{n}.path={paths[n]}" for n in ("code", "prose", "reasoning")]
    out = subprocess.run(cmd + mesh, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert (tmp_path / "run" / "results.jsonl").read_text().count("\n") == 1
    if mesh:
        return
    bad = subprocess.run(
        cmd[:5] + ["--config.verifier=/nonexistent"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert bad.returncode == 2 and "verifier: got '/nonexistent'" in bad.stderr
