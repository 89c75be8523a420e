"""Bad zoos (the folder a config's zoo resolves to): damaged files and malformed manifests,
a missing folder, and which folder is chosen (`config.zoo_path`, $SPECJAX_ZOO, the shipped
zoo). Each bad one is one line ``specjax: error: ...`` naming the field or variable and
the folder, exit status 2, and nothing written (tests/bad_inputs_harness.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from bad_inputs_harness import (
    SEED,
    _snapshot,
    assert_one_line_error,
    run_main,
)

from specjax.configs import common as config_common
from specjax.models import zoo as zoo_lib
from specjax.runner import experiments


def _zoo_variant(root: Path, name: str) -> Path:
    """A zoo folder of symlinks to the shipped zoo's files, `name` damaged in one way."""
    src = zoo_lib.SHIPPED_ZOO
    dst = root / f"zoo_{name}"
    for p in src.rglob("*"):
        if p.is_file():
            q = dst / p.relative_to(src)
            q.parent.mkdir(parents=True, exist_ok=True)
            q.symlink_to(p)
    manifest = dst / zoo_lib.MANIFEST
    m = json.loads(manifest.read_text())
    first_model = dst / m["models"]["verifier"]["file"]
    first_tok = dst / next(iter(m["tokenizers"].values()))["file"]

    def replace(path: Path, data: bytes) -> None:
        path.unlink()
        path.write_bytes(data)

    if name == "missing_manifest":
        manifest.unlink()
    elif name == "manifest_not_json":
        replace(manifest, b"{not json")
    elif name == "wrong_sha256":
        m["models"]["verifier"]["sha256"] = "0" * 64
        replace(manifest, json.dumps(m).encode())
    elif name == "truncated_npz":
        replace(first_model, first_model.read_bytes()[:1000])
    elif name == "byte_flipped_tokenizer":
        data = bytearray(first_tok.read_bytes())
        data[len(data) // 2] ^= 0x01
        replace(first_tok, bytes(data))
    elif name == "missing_model_file":
        first_model.unlink()
    elif name in MANIFEST_EDITS:
        MANIFEST_EDITS[name](m)
        replace(manifest, json.dumps(m).encode())
    else:
        raise ValueError(name)
    return dst


# Manifests malformed in one field each (the zoo's files intact): every field `load_zoo`
# reads is checked before any file is, and named with what is allowed.
MANIFEST_EDITS = {
    "extra_drafters_names_a_missing_model": lambda m: m.update(extra_drafters=["nope"]),
    "extra_drafters_not_a_list": lambda m: m.update(extra_drafters="prose512"),
    "drafter_order_repeats": lambda m: m.update(drafter_order=["code", "code"]),
    "model_record_not_an_object": lambda m: m["models"].update(code=5),
    "temperature_not_a_number": lambda m: m["models"]["code"].update(temperature="hot"),
    "cost_negative": lambda m: m["models"]["code"].update(cost=-1),
    "tokenizer_unknown": lambda m: m["models"]["code"].update(tokenizer="nope"),
    "vocab_size_not_an_integer": lambda m: m["tokenizers"]["verifier"].update(vocab_size="x"),
    "sha256_malformed": lambda m: m["models"]["code"].update(sha256="abc"),
    "role_unknown": lambda m: m["models"]["code"].update(role="helper"),
}


ZOO_DAMAGE = {
    "missing_manifest": "missing manifest.json",
    "manifest_not_json": "not valid JSON",
    "wrong_sha256": "sha256 mismatch",
    "truncated_npz": "sha256 mismatch",
    "byte_flipped_tokenizer": "sha256 mismatch",
    "missing_model_file": "missing",
    "extra_drafters_names_a_missing_model": "extra_drafters: got 'nope', allowed: a list of "
    "distinct drafter names",
    "extra_drafters_not_a_list": "extra_drafters: got 'prose512'",
    "drafter_order_repeats": "drafter_order: got ['code', 'code']",
    "model_record_not_an_object": "models.code: got 5, allowed: a JSON object",
    "temperature_not_a_number": "models.code.temperature: got 'hot', allowed: a finite number",
    "cost_negative": "models.code.cost: got -1",
    "tokenizer_unknown": "models.code.tokenizer: got 'nope', allowed: a key of tokenizers",
    "vocab_size_not_an_integer": "tokenizers.verifier.vocab_size: got 'x'",
    "sha256_malformed": "models.code.sha256: got 'abc', allowed: 64 lowercase hex digits",
    "role_unknown": "models.code.role: got 'helper'",
}


@pytest.fixture(scope="module")
def zoos(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("zoos")
    return {name: _zoo_variant(root, name) for name in ZOO_DAMAGE}


# ----------------------------------------------------------------------------------------
# Zoos
# ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("damage", sorted(ZOO_DAMAGE))
def test_bad_zoo(damage, zoos, tmp_path, capsys):
    zoo = zoos[damage]
    before = _snapshot(tmp_path)
    code, lines, out = run_main(
        capsys, f"--config={SEED}", f"--config.zoo_path={zoo}", f"--workdir={tmp_path / 'run'}"
    )
    assert_one_line_error(
        code, lines, out, "zoo_path: got", f"(zoo folder {zoo})", ZOO_DAMAGE[damage]
    )
    assert _snapshot(tmp_path) == before


def test_missing_zoo_names_the_variable_and_folder(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("SPECJAX_ZOO", str(tmp_path / "no_zoo"))
    before = _snapshot(tmp_path)
    code, lines, out = run_main(capsys, f"--config={SEED}", f"--workdir={tmp_path / 'run'}")
    assert_one_line_error(
        code,
        lines,
        out,
        "SPECJAX_ZOO: got",
        f"(zoo folder {tmp_path / 'no_zoo'})",
        "no such directory",
    )
    # An explicit zoo_path wins over the variable (README: zoo_path > SPECJAX_ZOO > shipped).
    code, lines, out = run_main(
        capsys,
        f"--config={SEED}",
        f"--workdir={tmp_path / 'run'}",
        f"--config.zoo_path={tmp_path / 'other'}",
    )
    assert_one_line_error(code, lines, out, "zoo_path: got", f"(zoo folder {tmp_path / 'other'})")
    assert _snapshot(tmp_path) == before


def test_zoo_precedence(tmp_path, monkeypatch):
    config = config_common.plans_defaults()
    monkeypatch.delenv("SPECJAX_ZOO", raising=False)
    assert experiments.resolve_zoo_path(config) == (zoo_lib.SHIPPED_ZOO, "shipped")
    monkeypatch.setenv("SPECJAX_ZOO", str(tmp_path / "env"))
    assert experiments.resolve_zoo_path(config) == (tmp_path / "env", "SPECJAX_ZOO")
    config.zoo_path = str(tmp_path / "explicit")
    assert experiments.resolve_zoo_path(config) == (tmp_path / "explicit", "zoo_path")
    monkeypatch.chdir(tmp_path)
    config.zoo_path = "rel"
    assert experiments.resolve_zoo_path(config) == (tmp_path / "rel", "zoo_path")


def test_inputs_name_the_zoo_that_runs(tmp_path, monkeypatch):
    """validate's inputs: the chosen folder, where it came from, the manifest's sha256."""
    monkeypatch.setenv("SPECJAX_ZOO", str(zoo_lib.SHIPPED_ZOO))
    config = config_common.plans_defaults()
    inputs = experiments.validate(config)
    assert inputs == {
        "zoo": {
            "path": str(zoo_lib.SHIPPED_ZOO),
            "source": "SPECJAX_ZOO",
            "manifest_sha256": zoo_lib.file_sha256(zoo_lib.SHIPPED_ZOO / zoo_lib.MANIFEST),
        }
    }
