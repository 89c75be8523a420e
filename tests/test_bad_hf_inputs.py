"""Bad Hugging Face folders and fields of a ``deployment = 'hf'`` config (configs/real_models.py):
each is one line ``specjax: error: <field>: ...`` naming the field and the file, exit
status 2, before anything is written (no workdir, no lock, no printed progress), and the
library loaders name the file too (`load_hf_model`, `check_hf_model`).

The folders are written by `specjax.models.hf.save_hf` from a tiny random model (no torch).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import hf_fixtures as F
import jax
import pytest
from bad_inputs_harness import REPO, _snapshot, assert_one_line_error, run_main

from specjax.errors import ConfigError
from specjax.models import hf
from specjax.models.api import TransformerLM
from specjax.models.transformer import TransformerConfig

CONFIG = str(REPO / "configs" / "real_models.py") + ":runlocal"


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """A Llama folder (config.json, model.safetensors, tokenizer.json) of context 256."""
    tok = F.byte_level_tokenizer()
    cfg = TransformerConfig(
        vocab_size=tok.get_vocab_size(),
        d_model=32,
        n_layers=1,
        n_heads=4,
        n_kv_heads=2,
        d_ff=64,
        max_len=256,
    )
    lm = TransformerLM(cfg)
    root = tmp_path_factory.mktemp("hf")
    tok_file = root / "tok.json"
    tok.save(str(tok_file))
    path = root / "model"
    hf.save_hf(path, lm, lm.init_params(jax.random.key(0)), "llama", tokenizer_json=str(tok_file))
    return path


def _copy(folder: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "models" / "bad"
    shutil.copytree(folder, dst)
    return dst


def _edit_config(path: Path, **fields) -> None:
    cfg = json.loads((path / "config.json").read_text())
    cfg.update(fields)
    (path / "config.json").write_text(json.dumps(cfg))


def _args(verifier: Path, drafter: Path, workdir: Path, *extra: str) -> list[str]:
    return [
        f"--config={CONFIG}",
        f"--workdir={workdir}",
        f"--config.verifier={verifier}",
        *(f"--config.drafters.{n}.path={drafter}" for n in ("code", "prose", "reasoning")),
        *extra,
    ]


def _not_json(p):
    (p / "config.json").write_text("{not json")


def _json_list(p):
    (p / "config.json").write_text("[1, 2]")


def _yarn(p):
    _edit_config(p, rope_parameters={"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4})


def _gpt_neox(p):
    _edit_config(p, architectures=["GPTNeoXForCausalLM"], model_type="gpt_neox")


def _zero_heads(p):
    _edit_config(p, num_attention_heads=0)


def _kv_heads(p):
    _edit_config(p, num_key_value_heads=3)


def _truncated_shard(p):
    f = p / "model.safetensors"
    f.write_bytes(f.read_bytes()[:-100])


def _missing_shard(p):
    weight_map = {"model.embed_tokens.weight": "model-00001-of-00002.safetensors"}
    (p / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))


def _no_weights(p):
    (p / "model.safetensors").unlink()


def _no_tokenizer(p):
    (p / "tokenizer.json").unlink()


@pytest.mark.parametrize(
    "damage, needles",
    [
        (_not_json, ["verifier: got", "config.json: not valid JSON"]),
        (_json_list, ["verifier: got", "config.json: a JSON list, allowed: a JSON object"]),
        (_yarn, ["verifier: got", "rope_type='yarn' is not supported"]),
        (_gpt_neox, ["verifier: got", "architectures=['GPTNeoXForCausalLM']"]),
        (_zero_heads, ["verifier: got", "num_attention_heads=0, allowed: an integer >= 1"]),
        (_kv_heads, ["verifier: got", "num_key_value_heads=3 does not divide"]),
        (_truncated_shard, ["verifier: got", "truncated safetensors file"]),
        (
            _missing_shard,
            ["verifier: got", "lists model-00001-of-00002.safetensors, which is missing"],
        ),
        (_no_weights, ["verifier: got", "no model.safetensors or model.safetensors.index.json"]),
        (_no_tokenizer, ["verifier: got", "no tokenizer", "tokenizer.json is missing"]),
    ],
    ids=lambda x: getattr(x, "__name__", None),
)
def test_a_bad_verifier_folder_is_one_line_before_anything_is_written(
    folder, tmp_path, capsys, damage, needles
):
    bad = _copy(folder, tmp_path)
    damage(bad)
    before = _snapshot(tmp_path)
    code, lines, out = run_main(capsys, *_args(bad, folder, tmp_path / "run"))
    assert_one_line_error(code, lines, out, *needles)
    assert _snapshot(tmp_path) == before  # no workdir, no lock, nothing beside the folders


def test_a_bad_drafter_folder_names_its_field(folder, tmp_path, capsys):
    bad = _copy(folder, tmp_path)
    _json_list(bad)
    before = _snapshot(tmp_path)
    code, lines, out = run_main(capsys, *_args(folder, bad, tmp_path / "run"))
    assert_one_line_error(code, lines, out, "drafters.code.path: got", "a JSON list")
    assert _snapshot(tmp_path) == before


@pytest.mark.parametrize(
    "extra, needles",
    [
        (
            "--config.max_len=100000",
            ["max_len: got 100000", "max_position_embeddings=256"],
        ),
        ("--config.mesh.model=16", ["mesh: got", "devices"]),
        ("--config.mesh.data=3 --config.mesh.model=3", ["mesh: got", "devices"]),
        # 8 devices (tests/conftest.py): a mesh of 3 or 6 does not tile them ...
        (
            "--config.mesh.model=3",
            ["mesh: got", "(1 × 3 = 3) dividing", "8 devices: one of 1, 2, 4, 8"],
        ),
        ("--config.mesh.data=2 --config.mesh.model=3", ["mesh: got", "(2 × 3 = 6)", "8 devices"]),
        # ... and the verifier's 4 query heads do not split over 8 model shards.
        ("--config.mesh.model=8", ["mesh.model: got 8", "4 query heads", "one of 1, 2, 4"]),
    ],
)
def test_max_len_and_mesh_are_checked_before_anything_is_written(
    folder, tmp_path, capsys, extra, needles
):
    before = _snapshot(tmp_path)
    code, lines, out = run_main(capsys, *_args(folder, folder, tmp_path / "run", *extra.split()))
    assert_one_line_error(code, lines, out, *needles)
    assert _snapshot(tmp_path) == before


@pytest.mark.parametrize("damage", [_not_json, _json_list, _zero_heads, _no_tokenizer])
def test_the_library_loader_names_the_file(folder, tmp_path, damage):
    bad = _copy(folder, tmp_path)
    damage(bad)
    for load in (hf.load_hf_model, hf.check_hf_model):
        with pytest.raises(ConfigError) as e:
            load(bad)
        assert str(bad) in str(e.value) and "\n" not in str(e.value)


def test_a_mesh_that_tiles_the_devices_and_splits_the_heads_passes(folder):
    """A mesh whose data × model divides the 8 devices and whose model divides the
    verifier's 4 query heads passes the checks (the library call)."""
    import importlib.util  # pylint: disable=import-outside-toplevel

    from specjax.runner.deployments import hf as hf_deployment  # pylint: disable=import-outside-toplevel

    spec = importlib.util.spec_from_file_location(
        "real_models", REPO / "configs" / "real_models.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for data, model in [(1, 1), (2, 4), (4, 2), (1, 4), (8, 1)]:
        config = module.get_config("runlocal")
        config.verifier = str(folder)
        for name in ("code", "prose", "reasoning"):
            config.drafters[name].path = str(folder)
        config.mesh.data, config.mesh.model = data, model
        hf_deployment.validate_hf(config)
