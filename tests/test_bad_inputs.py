"""Bad input, table-driven: every case is one line ``specjax: error: ...`` naming the field
or file, exit status 2, and a workdir (the whole test folder) left byte for byte as it was.

Most cases run the command in-process (`specjax.main.main` after `specjax.runner.cli.
parse_flags`, `specjax.report.main`), which costs no JAX import per case; a handful at the
end run ``python -m specjax.main`` / ``python -m specjax.report`` as a user does, to check
that nothing (no absl INFO line, no progress bar, no traceback) precedes the error there.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from absl import flags

from specjax import main as main_mod  # defines --config, --workdir, --jax_distributed
from specjax import report as report_mod
from specjax.configs import common as config_common
from specjax.models import zoo as zoo_lib
from specjax.runner import cli, experiments, results

REPO = Path(__file__).resolve().parent.parent
SEED = "configs/seed_reproduction.py:runlocal"
TOY = "tests/configs/toy.py:runlocal"


# ----------------------------------------------------------------------------------------
# Harness
# ----------------------------------------------------------------------------------------


def _snapshot(root: Path) -> dict[str, bytes | None]:
    """Every path under `root` with its bytes (None for a directory)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for d in dirnames:
            out[os.path.relpath(os.path.join(dirpath, d), root)] = None
        for f in filenames:
            p = os.path.join(dirpath, f)
            out[os.path.relpath(p, root)] = (
                os.readlink(p).encode() if os.path.islink(p) else Path(p).read_bytes()
            )
    return out


def run_main(capsys, *args: str) -> tuple[int, list[str], str]:
    """``python -m specjax.main ARGS`` in-process: (exit status, stderr lines, stdout)."""
    flags.FLAGS.unparse_flags()
    try:
        argv = cli.parse_flags(["specjax", *args])
        main_mod.main(argv)
        code = 0
    except SystemExit as e:
        code = e.code
    finally:
        flags.FLAGS.unparse_flags()
    out = capsys.readouterr()
    return code, out.err.splitlines(), out.out


def run_report(capsys, workdir: str | None, *extra: str) -> tuple[int, list[str], str]:
    """``python -m specjax.report --workdir=W`` in-process."""
    flags.FLAGS.unparse_flags()
    flags.FLAGS["workdir"].value = workdir  # no parse: --config is required by main
    flags.FLAGS.mark_as_parsed()
    try:
        report_mod.main(["specjax", *extra])
        code = 0
    except SystemExit as e:
        code = e.code
    finally:
        flags.FLAGS.unparse_flags()
    out = capsys.readouterr()
    return code, out.err.splitlines(), out.out


def assert_one_line_error(code, lines, stdout, *needles):
    assert code == 2, (code, lines)
    assert len(lines) == 1, lines
    assert lines[0].startswith("specjax: error: "), lines
    assert "Traceback" not in lines[0] and stdout == "", (lines, stdout)
    for n in needles:
        assert n in lines[0], (n, lines[0])


# ----------------------------------------------------------------------------------------
# Fixtures: files a case points at
# ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    """Config files and experiment modules that are broken in one way each."""
    d = tmp_path_factory.mktemp("files")
    texts = {
        "raises.py": "raise RuntimeError('boom in the config')\n",
        "syntax.py": "def get_config(:\n    pass\n",
        "no_get_config.py": "X = 1\n",
        "returns_none.py": "def get_config():\n    return None\n",
        "returns_int.py": "def get_config():\n    return 5\n",
        "get_config_raises.py": "def get_config():\n    return 1 / 0\n",
        "bad_module.py": "import nonexistent_module_xyz\n",
        "toy_bad_module.py": (
            "import importlib.util\n"
            f"spec = importlib.util.spec_from_file_location('t', {str(REPO / 'tests/configs/toy.py')!r})\n"
            "toy = importlib.util.module_from_spec(spec); spec.loader.exec_module(toy)\n"
            "def get_config(arg=None):\n"
            "    c = toy.get_config(arg)\n"
            f"    c.experiment_module = {str(d / 'bad_module.py')!r}\n"
            "    return c\n"
        ),
        "get_config_exits.py": "import sys\ndef get_config(arg=None):\n    sys.exit(0)\n",
        "exits_at_import.py": "import sys\nsys.exit(3)\n",
        "exit_module.py": "import sys\nsys.exit(0)\n",
        "toy_exit_module.py": (
            "import importlib.util\n"
            f"spec = importlib.util.spec_from_file_location('t', {str(REPO / 'tests/configs/toy.py')!r})\n"
            "toy = importlib.util.module_from_spec(spec); spec.loader.exec_module(toy)\n"
            "def get_config(arg=None):\n"
            "    c = toy.get_config(arg)\n"
            f"    c.experiment_module = {str(d / 'exit_module.py')!r}\n"
            "    return c\n"
        ),
        "plans_typo.py": (
            "from specjax.configs.common import plans_defaults\n"
            "def get_config(arg=None):\n"
            "    c = plans_defaults()\n"
            "    c.plans_per_domain = 1\n"
            "    c.plan_step = 2  # a typo: the field is plan_steps\n"
            "    return c\n"
        ),
    }
    for name, text in texts.items():
        (d / name).write_text(text)
    return {name: d / name for name in texts}


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
# The table: (case id, arguments, strings the one line must contain)
# ----------------------------------------------------------------------------------------

CONFIG_CASES = [
    # Config values (the plans experiment's validate hook, on the seed reproduction config).
    ("bucket=0", [f"--config={SEED},bucket=0"], ["bucket: got 0", "integer >= 1"]),
    ("bucket=-3", [f"--config={SEED}", "--config.bucket=-3"], ["bucket: got -3"]),
    ("max_step_tokens=-1", [f"--config={SEED},max_step_tokens=-1"], ["max_step_tokens: got -1"]),
    (
        "max_step_tokens=0",
        [f"--config={SEED}", "--config.max_step_tokens=0"],
        ["max_step_tokens: got 0"],
    ),
    ("plan_steps=0", [f"--config={SEED},plan_steps=0"], ["plan_steps: got 0"]),
    (
        "--config.plan_steps=abc",
        [f"--config={SEED}", "--config.plan_steps=abc"],
        ["plan_steps: got 'abc'", "an integer"],
    ),
    ("plan_steps=1.5", [f"--config={SEED},plan_steps=1.5"], ["plan_steps: got '1.5'"]),
    ("plans_per_domain=0", [f"--config={SEED},plans_per_domain=0"], ["plans_per_domain: got 0"]),
    (
        "consensus_cost=-1",
        [f"--config={SEED},consensus_cost=-1"],
        ["consensus_cost: got -1", ">= 0"],
    ),
    (
        "consensus_cost=nan",
        [f"--config={SEED}", "--config.consensus_cost=nan"],
        ["consensus_cost: got nan"],
    ),
    (
        "consensus_threshold=0",
        [f"--config={SEED},consensus_threshold=0"],
        ["consensus_threshold: got 0", "(0, 1]"],
    ),
    (
        "consensus_threshold=1.5",
        [f"--config={SEED},consensus_threshold=1.5"],
        ["consensus_threshold: got 1.5"],
    ),
    (
        "deployment=cloud",
        [f"--config={SEED},deployment=cloud"],
        ["deployment: got 'cloud'", "'synthetic'"],
    ),
    ("report=maybe", [f"--config={SEED},report=maybe"], ["report: got 'maybe'", "a bool"]),
    ("zoo_path=''", [f"--config={SEED}", "--config.zoo_path="], ["zoo_path: got ''"]),
    ("unknown field", [f"--config={SEED},nope=1"], ["nope=1: no such config field"]),
    (
        "unknown --config. field",
        [f"--config={SEED}", "--config.nope=1"],
        ["nope=1: no such config field"],
    ),
    ("unknown variant", [f"--config={SEED},runbig"], ["config variant: got 'runbig'"]),
    ("unknown experiment", [f"--config={SEED},experiment=nope"], ["experiment: got 'nope'"]),
    # Grid values.
    (
        "grid.seed=[1.5]",
        [f"--config={SEED},grid.seed=[1.5]"],
        ["grid.seed: got 1.5", "integers in [0,"],
    ),
    ("grid.seed=[-1]", [f"--config={SEED},grid.seed=[-1]"], ["grid.seed: got -1"]),
    (
        "grid.seed=[true]",
        [f"--config={SEED}", "--config.grid.seed=[true]"],
        ["grid.seed: got 'true'"],
    ),
    (
        "grid.seed=[0,0]",
        [f"--config={SEED},grid.seed=[0,0]"],
        ["grid.seed: got [0, 0]", "distinct values"],
    ),
    ("grid.seed=[]", [f"--config={SEED},grid.seed=[]"], ["grid.seed: got []"]),
    ("grid.gamma=[0]", [f"--config={SEED},grid.gamma=[0]"], ["grid.gamma: got 0"]),
    ("grid.gamma=[2.5]", [f"--config={SEED},grid.gamma=[2.5]"], ["grid.gamma: got 2.5"]),
    (
        "grid.verifier_temperature=[-1]",
        [f"--config={SEED},grid.verifier_temperature=[-1]"],
        ["grid.verifier_temperature: got -1"],
    ),
    (
        "grid.verifier_temperature=[inf]",
        [f"--config={SEED},grid.verifier_temperature=[inf]"],
        ["grid.verifier_temperature: got 'inf'"],
    ),
    (
        "grid.drafter_temperature=[-0.5]",
        [f"--config={SEED},grid.drafter_temperature=[-0.5]"],
        ["grid.drafter_temperature: got -0.5"],
    ),
    ("grid.policy=[bogus]", [f"--config={SEED},grid.policy=[bogus]"], ["grid.policy: got 'bogus'"]),
    ("grid.rule=[magic]", [f"--config={SEED},grid.rule=[magic]"], ["grid.rule: got 'magic'"]),
    (
        "grid.pairing unknown drafter",
        [f"--config={SEED},grid.pairing=[[code,nope]]"],
        ["grid.pairing: got 'nope'", "'code'"],
    ),
    (
        "grid.pairing repeated drafter",
        [f"--config={SEED},grid.pairing=[[code,code]]"],
        ["grid.pairing: got ['code', 'code']", "distinct"],
    ),
    ("grid.pairing empty", [f"--config={SEED},grid.pairing=[[]]"], ["grid.pairing: got []"]),
    (
        "grid unknown axis",
        [f"--config={SEED},grid={{'gama': [2]}}"],
        ["grid.gama: got [2]", "an axis the plans experiment reads"],
    ),
    ("grid={}", [f"--config={SEED},grid={{}}"], ["grid: got {}"]),
    (
        "zoo_path=~nosuchuser/zoo",
        [f"--config={SEED}", "--config.zoo_path=~nosuchuser/zoo"],
        ["zoo_path: got '~nosuchuser/zoo'", "no such user"],
    ),
    # What a cell would check when it runs, checked at validation: the drafters' γ_i,
    # the oracle router's domains, the context budget of every cell.
    (
        "grid.drafter_gamma of the wrong length",
        [f"--config={SEED},grid.drafter_gamma=[[2,3]]"],
        ["grid.drafter_gamma: got [2, 3]", "one γ_i per drafter of the pairing"],
    ),
    (
        "grid.drafter_gamma too long for a pairing",
        [f"--config={SEED},grid.pairing=[[code,prose]],grid.drafter_gamma=[[2,2,2]]"],
        ["grid.drafter_gamma: got [2, 2, 2]", "['code', 'prose']"],
    ),
    (
        "max_step_tokens beyond the context",
        [f"--config={SEED},max_step_tokens=1000"],
        ["max_step_tokens=1000", "allowed: at most its context, max_len = 512"],
    ),
    (
        "plan_steps beyond the context",
        [f"--config={SEED},plan_steps=100"],
        ["plan_steps=100", "max_len = 512"],
    ),
    (
        "bucket beyond the context",
        [f"--config={SEED},bucket=1024"],
        ["bucket=1024", "max_len = 512"],
    ),
    (
        "grid.gamma beyond the context",
        [f"--config={SEED},grid.gamma=[64],plan_steps=12"],
        ["grid.gamma", "γ=64", "max_len = 512"],
    ),
    (
        "oracle without a drafter per domain",
        [f"--config={SEED},grid.policy=[oracle],grid.pairing=[[code,prose]]"],
        ["grid.policy: got 'oracle'", "'reasoning'"],
    ),
    # Sizes bounded by a stated limit.
    (
        "plans_per_domain=1000000000",
        [f"--config={SEED},plans_per_domain=1000000000"],
        ["plans_per_domain: got 1000000000", "<= 24", "plan prompts shipped per domain"],
    ),
    (
        "plans_per_domain synthetic",
        [f"--config={SEED},deployment=synthetic,plans_per_domain=65"],
        ["plans_per_domain: got 65", "<= 64"],
    ),
    (
        "plan_steps=100000",
        [f"--config={SEED},plan_steps=100000"],
        ["plan_steps: got 100000", "<= 256"],
    ),
    (
        "max_step_tokens=10**9",
        [f"--config={SEED}", "--config.max_step_tokens=1000000000"],
        ["max_step_tokens: got 1000000000", "<= 4096"],
    ),
    ("bucket=10**9", [f"--config={SEED},bucket=1000000000"], ["bucket: got 1000000000"]),
    (
        "grid.gamma=[1000]",
        [f"--config={SEED},grid.gamma=[1000]"],
        ["grid.gamma: got 1000", "<= 64"],
    ),
    (
        "grid.drafter_gamma=[[2,2,1000]]",
        [f"--config={SEED},grid.drafter_gamma=[[2,2,1000]]"],
        ["grid.drafter_gamma: got [2, 2, 1000]", "<= 64"],
    ),
    (
        "grid of 10001 cells",
        [f"--config={SEED},grid.seed=[{','.join(map(str, range(10001)))}]"],
        ["grid: got", "at most 10000 cells"],
    ),
    # One run under two spellings is one cell, not two.
    (
        "grid.policy=[all_on,p1t1a1k1]",
        [f"--config={SEED},grid.policy=[all_on,p1t1a1k1]"],
        ["grid.policy: got ['all_on', 'p1t1a1k1']", "'p1t1a1k1' is the same policy as 'all_on'"],
    ),
    (
        "grid.policy=[naive_plus_kl_ceiling,p0t0a0k1]",
        [f"--config={SEED},grid.policy=[naive,naive_plus_kl_ceiling,p0t0a0k1]"],
        ["grid.policy", "'p0t0a0k1' is the same policy as 'naive_plus_kl_ceiling'"],
    ),
    (
        "grid.policy=[all_on,all_on_kl0.35]",
        [f"--config={SEED},grid.policy=[all_on,all_on_kl0.35]"],
        ["grid.policy", "same policy"],
    ),
    (
        "grid.rule=[None,default]",
        [f"--config={SEED},grid.rule=[None,default]"],
        ["grid.rule", "'default' is the same rule as None"],
    ),
    (
        "grid.drafter_gamma=[None,[None,None,None]]",
        [f"--config={SEED},grid.drafter_gamma=[None,[None,None,None]]"],
        ["grid.drafter_gamma", "is the same drafter gamma as None"],
    ),
]

FILE_CASES = [
    (
        "config file missing",
        ["--config=tests/configs/nope.py"],
        ["--config: got 'tests/configs/nope.py'", "readable config file"],
    ),
    (
        "config file raises",
        ["--config={raises.py}"],
        ["--config: got", "raises.py", "RuntimeError: boom in the config", "line 1"],
    ),
    (
        "config file syntax error",
        ["--config={syntax.py}"],
        ["--config: got", "syntax.py", "SyntaxError", "line 1"],
    ),
    (
        "config file lacks get_config",
        ["--config={no_get_config.py}"],
        ["--config: got", "no_get_config.py", "defines no get_config()"],
    ),
    (
        "get_config returns None",
        ["--config={returns_none.py}"],
        ["--config: got", "returns_none.py", "returned None"],
    ),
    (
        "get_config returns an int",
        ["--config={returns_int.py}"],
        ["--config: got", "returns_int.py", "returned int"],
    ),
    (
        "get_config raises",
        ["--config={get_config_raises.py}"],
        ["--config: got", "ZeroDivisionError", "line 2"],
    ),
    (
        "experiment_module fails to import",
        ["--config={toy_bad_module.py}:runlocal"],
        ["experiment_module: got", "bad_module.py", "ModuleNotFoundError"],
    ),
    # A config file (or experiment module) that exits is no config: exit status 2, not 0.
    (
        "get_config calls sys.exit(0)",
        ["--config={get_config_exits.py}"],
        ["--config: got", "get_config_exits.py", "sys.exit(0)", "line 3"],
    ),
    (
        "config file calls sys.exit(3)",
        ["--config={exits_at_import.py}"],
        ["--config: got", "exits_at_import.py", "sys.exit(3)"],
    ),
    (
        "experiment_module calls sys.exit(0)",
        ["--config={toy_exit_module.py}:runlocal"],
        ["experiment_module: got", "exit_module.py", "SystemExit"],
    ),
    (
        "unknown field in a config file",
        ["--config={plans_typo.py}"],
        ["plan_step: no such field of the plans experiment", "did you mean 'plan_steps'"],
    ),
]


def _format(args, files):
    out = []
    for a in args:
        for k, v in files.items():
            a = a.replace("{" + k + "}", str(v))
        out.append(a)
    return out


@pytest.mark.parametrize(
    "name,args,needles", CONFIG_CASES + FILE_CASES, ids=[c[0] for c in CONFIG_CASES + FILE_CASES]
)
def test_bad_config(name, args, needles, tmp_path, files, capsys):
    del name
    workdir = tmp_path / "run"
    before = _snapshot(tmp_path)
    code, lines, out = run_main(capsys, *_format(args, files), f"--workdir={workdir}")
    assert_one_line_error(code, lines, out, *needles)
    assert _snapshot(tmp_path) == before


# ----------------------------------------------------------------------------------------
# Workdirs
# ----------------------------------------------------------------------------------------


def _toy_results(workdir: Path, n: int = 2) -> None:
    workdir.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        results.append_result(
            workdir / results.RESULTS_NAME,
            {"cell_id": f"c{i}", "gamma": 1, "policy": "naive", "joint_acceptance": 0.5},
        )


def _workdir_case(name: str, tmp_path: Path) -> tuple[str, list[str]]:
    """Sets up the case's workdir; returns (--workdir value, needles)."""
    run = tmp_path / "run"
    if name == "is a file":
        run.write_text("x")
        return str(run), ["--workdir: got", "not an existing file"]
    if name == "under a file":
        run.write_text("x")
        return str(run / "sub"), ["--workdir: got", "is a file"]
    if name == "/proc/x":
        return "/proc/x", ["--workdir: got '/proc/x'", "can be created"]
    if name == "/sys/x":
        return "/sys/x", ["--workdir: got '/sys/x'", "can be created"]
    if name == "empty":
        return "", ["--workdir"]
    if name == "~nosuchuser/x":
        return "~nosuchuser/x", ["--workdir: got '~nosuchuser/x'", "no such user"]
    if name == "results, config.json missing":
        _toy_results(run)
        return str(run), ["--workdir:", "config.json is missing", "restore config.json"]
    if name == "results, config.json not JSON":
        _toy_results(run)
        (run / "config.json").write_text("{oops")
        return str(run), ["--workdir:", "config.json is unreadable", "restore config.json"]
    if name == "results, config.json a list":
        _toy_results(run)
        (run / "config.json").write_text("[1, 2]")
        return str(run), ["--workdir:", "not a JSON object"]
    if name in ("config.json is a directory", "plots is a file"):
        run.mkdir()
        target = run / name.split()[0]
        if "directory" in name:
            target.mkdir()
        else:
            target.write_text("x")
        return str(run), [
            "--workdir: got",
            f"a run directory where {name.split()[0]} is a "
            f"{'file' if 'directory' in name else 'directory'}",
        ]
    if name == "results of another config":
        _toy_results(run)
        (run / "config.json").write_text(json.dumps({"experiment": "toy", "sleep_s": 9.0}))
        return str(run), ["--workdir:", "holds results of a different config", "sleep_s"]
    raise ValueError(name)


WORKDIR_CASES = [
    "is a file",
    "under a file",
    "/proc/x",
    "/sys/x",
    "empty",
    "~nosuchuser/x",
    "results, config.json missing",
    "results, config.json not JSON",
    "results, config.json a list",
    "results of another config",
    "config.json is a directory",
    "plots is a file",
]


@pytest.mark.parametrize("name", WORKDIR_CASES)
def test_bad_workdir(name, tmp_path, capsys):
    workdir, needles = _workdir_case(name, tmp_path)
    before = _snapshot(tmp_path)
    code, lines, out = run_main(capsys, f"--config={TOY}", f"--workdir={workdir}")
    assert_one_line_error(code, lines, out, *needles)
    assert _snapshot(tmp_path) == before


def test_results_from_another_zoo_are_refused(tmp_path, capsys):
    """Same config, other inputs (the zoo's manifest changed): refused, not resumed."""
    from specjax.runner import sweep  # pylint: disable=import-outside-toplevel

    config = config_common.plans_defaults()
    config.plans_per_domain = 1
    plan = sweep.prepare(config, tmp_path / "run")
    assert plan.inputs["zoo"]["source"] in ("shipped", "SPECJAX_ZOO")
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps(plan.config_json))
    other = {"zoo": {**plan.inputs["zoo"], "manifest_sha256": "0" * 64}}
    results.append_result(
        run / results.RESULTS_NAME, {"cell_id": plan.cells[0]["cell_id"], "inputs": other}
    )
    before = _snapshot(tmp_path)
    with pytest.raises(Exception, match="computed from other inputs .*manifest_sha256"):
        sweep.prepare(config, run)
    assert _snapshot(tmp_path) == before


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


# ----------------------------------------------------------------------------------------
# Report inputs
# ----------------------------------------------------------------------------------------


def _report_case(name: str, tmp_path: Path) -> tuple[str | None, list[str], list[str]]:
    run = tmp_path / "run"
    extra: list[str] = []
    if name == "missing workdir":
        return str(run), ["--workdir: got", "an existing run directory"], extra
    if name == "workdir is a file":
        run.write_text("x")
        return str(run), ["--workdir: got", "an existing run directory"], extra
    if name == "no results":
        run.mkdir()
        return str(run), ["--workdir: got", "results.jsonl is missing or empty"], extra
    _toy_results(run)
    (run / "config.json").write_text(json.dumps({"experiment": "toy"}))
    (run / "report.md").write_text("the old report\n")
    (run / "plots").mkdir()
    (run / "plots" / "old.png").write_bytes(b"png")
    if name == "config.json not JSON":
        (run / "config.json").write_text("{not json")
        return str(run), ["config.json: unreadable", "a JSON object", "restore it"], extra
    if name == "config.json a list":
        (run / "config.json").write_text("[]")
        return str(run), ["config.json: got a JSON list", "a JSON object"], extra
    if name == "version.json not JSON":
        (run / "version.json").write_bytes(b"\xff\xfe")
        return str(run), ["version.json: unreadable"], extra
    if name == "results.jsonl is a directory":
        (run / "results.jsonl").unlink()
        (run / "results.jsonl").mkdir()
        return str(run), ["--workdir: got", "results.jsonl is a file"], extra
    if name == "plots is a file":
        shutil.rmtree(run / "plots")
        (run / "plots").write_text("x")
        return str(run), ["--workdir: got", "plots is a directory"], extra
    if name == "report.md is a directory":
        (run / "report.md").unlink()
        (run / "report.md").mkdir()
        return str(run), ["--workdir: got", "report.md is a file"], extra
    if name == "config.json with a bad grid":
        (run / "config.json").write_text(json.dumps({"experiment": "toy", "grid": {"gamma": []}}))
        return str(run), ["config.json: grid.gamma: got []", "a non-empty list"], extra
    if name == "unexpected argument":
        return str(run), ["unexpected arguments: extra"], ["extra"]
    if name == "~nosuchuser workdir":
        return "~nosuchuser/run", ["--workdir: got '~nosuchuser/run'", "no such user"], extra
    if name == "no workdir":
        return None, ["--workdir: got None"], extra
    raise ValueError(name)


REPORT_CASES = [
    "missing workdir",
    "workdir is a file",
    "no results",
    "config.json not JSON",
    "config.json a list",
    "version.json not JSON",
    "results.jsonl is a directory",
    "plots is a file",
    "report.md is a directory",
    "unexpected argument",
    "no workdir",
    "config.json with a bad grid",
    "~nosuchuser workdir",
]


@pytest.mark.parametrize("name", REPORT_CASES)
def test_bad_report_input(name, tmp_path, capsys):
    workdir, needles, extra = _report_case(name, tmp_path)
    before = _snapshot(tmp_path)
    code, lines, out = run_report(capsys, workdir, *extra)
    assert_one_line_error(code, lines, out, *needles)
    assert _snapshot(tmp_path) == before


# ----------------------------------------------------------------------------------------
# Environment variables: checked before a config file loads (some are read when a module
# is imported), each named as itself, never blamed on --config.
# ----------------------------------------------------------------------------------------

ENV_CASES = [
    ("SPECJAX_MAX_PROGRAMS", "abc", ["SPECJAX_MAX_PROGRAMS: got 'abc'", "an integer in [1, 4096]"]),
    ("SPECJAX_MAX_PROGRAMS", "0", ["SPECJAX_MAX_PROGRAMS: got '0'"]),
    ("SPECJAX_MAX_PROGRAMS", "100000", ["SPECJAX_MAX_PROGRAMS: got '100000'"]),
    ("SPECJAX_CHECKS", "maybe", ["SPECJAX_CHECKS: got 'maybe'", "0, 1, true, false"]),
    ("SPECJAX_COMPILE_CACHE", "{file}/xla", ["SPECJAX_COMPILE_CACHE: got", "is not a directory"]),
    ("SPECJAX_ZOO", "~nosuchuser/zoo", ["SPECJAX_ZOO: got '~nosuchuser/zoo'"]),
]


@pytest.mark.parametrize("var,value,needles", ENV_CASES, ids=[f"{v}={x}" for v, x, _ in ENV_CASES])
def test_bad_environment_variable(var, value, needles, tmp_path, capsys, monkeypatch):
    (tmp_path / "file").write_text("x")
    monkeypatch.setenv(var, value.replace("{file}", str(tmp_path / "file")))
    before = _snapshot(tmp_path)
    code, lines, out = run_main(capsys, f"--config={TOY}", f"--workdir={tmp_path / 'run'}")
    assert_one_line_error(code, lines, out, *needles)
    assert _snapshot(tmp_path) == before


# ----------------------------------------------------------------------------------------
# The report: non-finite values written as such; rows outside the grid reported
# ----------------------------------------------------------------------------------------


def _toy_run(tmp_path: Path) -> Path:
    """A finished toy sweep (8 cells, no report yet)."""
    import importlib.util  # pylint: disable=import-outside-toplevel

    from specjax.runner import sweep  # pylint: disable=import-outside-toplevel

    spec = importlib.util.spec_from_file_location("toy_config", REPO / "tests/configs/toy.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    run = tmp_path / "run"
    sweep.run(module.get_config("runlocal,report=false"), run, progress=False)
    return run


def _rewrite_rows(run: Path, edit) -> list[dict]:
    path = run / results.RESULTS_NAME
    rows = results.read_results(path)
    edit(rows)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))  # Infinity / NaN tokens
    return rows


def test_report_writes_non_finite_values_as_such(tmp_path, capsys):
    run = _toy_run(tmp_path)

    def edit(rows):
        rows[0]["joint_acceptance"] = float("inf")
        rows[1]["kl_max"] = float("nan")
        rows[2]["acceptance"]["code"] = float("-inf")
        rows[3]["throughput_ratio_vs_single"] = float("inf")  # a bar plot's column
        rows[4]["mean_truncation_depth"] = float("nan")
        rows[5]["consensus_fallback_rate"] = 10**400  # an integer no float holds

    _rewrite_rows(run, edit)
    assert "Infinity" in (run / results.RESULTS_NAME).read_text()
    code, lines, out = run_report(capsys, str(run))
    assert code == 0 and lines == [], lines
    assert out.strip() == str(run / "report.md")
    text = (run / "report.md").read_text()
    assert text.startswith("# toy: 8 cells")
    table = text.split("## Every cell", 1)[1]
    for word in ("| inf |", "| nan |", "code -inf", "| inf |"):
        assert word in table, word
    assert "| naive | 4 | inf |" in text or "| all_on | 4 | inf |" in text  # a mean over inf
    for png in (run / "plots").iterdir():
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", png


def _seed_rows(names=("code", "prose"), n_plans=3) -> list[dict]:
    """Rows shaped as the plans experiment writes them, for the seed table (no model run)."""
    from specjax.runner import grid as grid_lib  # pylint: disable=import-outside-toplevel

    def counts(scale):
        return {
            "tokens": [8 * scale] * n_plans,
            "seconds": [0.01 * scale] * n_plans,
            "steps": [2] * n_plans,
            "fallbacks": [1] * n_plans,
            "verifier_calls": [4] * n_plans,
            "multi_from_draft": [3] * n_plans,
            "multi_reached": [6] * n_plans,
            "own_accepted": [[2] * len(names)] * n_plans,
            "own_reached": [[4] * len(names)] * n_plans,
            "cost": [5.0] * n_plans,
        }

    rows = []
    for i, policy in enumerate(("naive", "all_on")):
        params = {"gamma": 2, "policy": policy, "seed": 0}
        rows.append(
            {
                "cell_id": grid_lib.cell_id(params),
                "cell": params,
                **params,
                "pairing": list(names),
                "per_plan": counts(i + 1),
                "baselines": {"single": {n: counts(1) for n in names}, "autoregressive": counts(1)},
                "joint_acceptance": 0.5,
                "consensus_fallback_rate": 0.5,
                "kl_max": 0.2,
                "throughput_ratio_vs_single": 1.0 + i,
                "branch_records": [],
                "step_records": [{"step": 0, "plan": 0, "quorum_support": 0.5}],
            }
        )
    return rows


def _seed_run(tmp_path: Path, rows: list[dict]) -> Path:
    run = tmp_path / "run"
    run.mkdir()
    config = json.loads(config_common.plans_defaults().to_json_best_effort())
    config.update(seed_table=True, grid={"gamma": [2], "policy": ["naive", "all_on"], "seed": [0]})
    (run / "config.json").write_text(json.dumps(config))
    for r in rows:
        results.append_result(run / results.RESULTS_NAME, r)
    return run


def test_seed_table_writes_non_finite_values_as_such(tmp_path, capsys):
    rows = _seed_rows()
    rows[0]["per_plan"]["tokens"][0] = float("inf")
    rows[1]["per_plan"]["cost"][1] = float("nan")
    rows[1]["kl_max"] = float("nan")
    run = _seed_run(tmp_path, rows)
    code, lines, out = run_report(capsys, str(run))
    assert code == 0 and lines == [], lines
    assert out.startswith(f"{run / 'report.md'}\n# The seed's table, reproduced")
    seed = (run / "seed_report.md").read_text()
    assert "| inf |" in seed and "| nan |" in seed
    summary = json.loads((run / "summary.json").read_text())  # Python's JSON: NaN, Infinity
    assert summary["policies"]["naive"]["throughput_ratio_vs_single"]["value"] == float("inf")
    assert (run / "plots" / "seed_policies.png").read_bytes()[:4] == b"\x89PNG"


def test_rows_the_report_cannot_use_are_one_line_and_nothing_is_written(tmp_path, capsys):
    rows = _seed_rows()
    rows[0]["per_plan"] = {"tokens": "eight"}  # not counts: the seed table cannot be built
    run = _seed_run(tmp_path, rows)
    (run / "report.md").write_text("the old report\n")
    before = _snapshot(tmp_path)
    code, lines, out = run_report(capsys, str(run))
    assert_one_line_error(
        code,
        lines,
        out,
        f"{run / 'results.jsonl'}: its rows cannot be reported",
        "allowed: rows as a specjax sweep writes them",
    )
    assert _snapshot(tmp_path) == before


def test_rows_outside_the_grid_are_reported_not_counted(tmp_path, capsys):
    from specjax.runner import sweep  # pylint: disable=import-outside-toplevel

    run = _toy_run(tmp_path)
    rows = results.read_results(run / results.RESULTS_NAME)
    stray = {
        **rows[0],
        "cell_id": "0123456789ab",
        "cell": {**rows[0]["cell"], "gamma": 99},
        "gamma": 99,
    }
    results.append_result(run / results.RESULTS_NAME, stray)
    results.append_result(run / results.RESULTS_NAME, {"joint_acceptance": 0.9})  # no cell_id
    code, lines, out = run_report(capsys, str(run))
    assert code == 0 and out.strip() == str(run / "report.md")
    assert len(lines) == 1 and lines[0].startswith("specjax: warning: "), lines
    assert "results.jsonl: 2 row(s) are no cell of the grid in config.json" in lines[0]
    text = (run / "report.md").read_text()
    assert text.startswith("# toy: 8 cells")  # counted nowhere ...
    assert text.count("\n| `") == 8 + 2  # ... but listed
    outside = text.split("## Rows outside the grid (not counted)", 1)[1]
    assert "`0123456789ab` | cell_id '0123456789ab' is not a cell of the grid" in outside
    assert "it has no cell_id" in outside
    assert "| 99 |" not in text.split("## Rows outside", 1)[0]
    # A resumed sweep leaves them out of its report and of the experiment's summary too.
    import importlib.util  # pylint: disable=import-outside-toplevel

    spec = importlib.util.spec_from_file_location("toy_config", REPO / "tests/configs/toy.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    rows = sweep.run(module.get_config("runlocal"), run, progress=False)
    assert len(rows) == 8 and "0123456789ab" not in {r.get("cell_id") for r in rows}
    assert json.loads((run / "summary.json").read_text())["cells"] == 8
    assert len(results.read_results(run / results.RESULTS_NAME)) == 10  # kept, not counted
    assert (run / "report.md").read_text().startswith("# toy: 8 cells")


def test_case_count():
    n = (
        len(CONFIG_CASES)
        + len(FILE_CASES)
        + len(WORKDIR_CASES)
        + len(ZOO_DAMAGE)
        + len(REPORT_CASES)
        + len(ENV_CASES)
        + 3
    )  # + another zoo's results, SPECJAX_ZOO,
    assert n >= 40, n  # zoo_path


# ----------------------------------------------------------------------------------------
# End to end, as a user runs them (each pays a JAX import)
# ----------------------------------------------------------------------------------------


def _cli(module: str, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=REPO,
        env={**os.environ, "JAX_PLATFORMS": "cpu", **(env or {})},
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_end_to_end_one_line_before_anything_is_written(tmp_path, files):
    """As subprocesses: no absl INFO line, progress bar or traceback before the error."""
    run = tmp_path / "run"
    cases = [
        (["--config=" + str(files["raises.py"]), f"--workdir={run}"], "RuntimeError"),
        ([f"--config={SEED},bucket=0", f"--workdir={run}"], "bucket: got 0"),
        ([f"--config={TOY}", "--workdir=/proc/x"], "--workdir: got '/proc/x'"),
    ]
    for args, needle in cases:
        before = _snapshot(tmp_path)
        out = _cli(
            "specjax.main",
            *args,
            env={"SPECJAX_ZOO": str(tmp_path / "no_zoo")} if "bucket" not in args[0] else None,
        )
        assert out.returncode == 2, (args, out.stderr)
        assert out.stdout == "" and len(out.stderr.splitlines()) == 1, out.stderr
        assert out.stderr.startswith("specjax: error: ") and needle in out.stderr, out.stderr
        assert _snapshot(tmp_path) == before


def test_end_to_end_the_audit_classes(tmp_path, files):
    """As subprocesses: the classes an outside audit found, each exit 2 and one line."""
    run = tmp_path / "run"
    cases = [
        # Read when specjax.engine.programs is imported (by the config file): named as itself.
        (
            [f"--config={TOY}", f"--workdir={run}"],
            {"SPECJAX_MAX_PROGRAMS": "abc"},
            "SPECJAX_MAX_PROGRAMS: got 'abc'",
        ),
        (["--config=" + str(files["get_config_exits.py"]), f"--workdir={run}"], {}, "sys.exit(0)"),
        ([f"--config={TOY}", "--workdir=~nosuchuser/x"], {}, "--workdir: got '~nosuchuser/x'"),
    ]
    for args, env, needle in cases:
        before = _snapshot(tmp_path)
        out = _cli("specjax.main", *args, env=env)
        assert out.returncode == 2, (args, out.stderr)
        assert out.stdout == "" and len(out.stderr.splitlines()) == 1, out.stderr
        assert out.stderr.startswith("specjax: error: ") and needle in out.stderr, out.stderr
        assert _snapshot(tmp_path) == before


def test_end_to_end_report_never_rewrites_from_unreadable_inputs(tmp_path):
    workdir, needles, _ = _report_case("config.json not JSON", tmp_path)
    before = _snapshot(tmp_path)
    out = _cli("specjax.report", f"--workdir={workdir}")
    assert out.returncode == 2 and out.stdout == "", out.stderr
    assert len(out.stderr.splitlines()) == 1 and all(n in out.stderr for n in needles)
    assert _snapshot(tmp_path) == before


def test_inputs_go_into_version_json_and_every_row(tmp_path):
    """What validate reports the cells read (the zoo) is recorded with every result."""
    import ml_collections  # pylint: disable=import-outside-toplevel

    from specjax.runner import registry, sweep  # pylint: disable=import-outside-toplevel

    inputs = {"zoo": {"path": "/z", "source": "SPECJAX_ZOO", "manifest_sha256": "ab" * 32}}

    def probe(config, cell, workdir):
        del config, workdir
        return {"value": cell["seed"]}

    registry.register_experiment("inputs_probe", validate=lambda c: inputs)(probe)
    config = ml_collections.ConfigDict({"experiment": "inputs_probe", "report": False})
    config.grid = ml_collections.ConfigDict({"seed": [0, 1]})
    rows = sweep.run(config, tmp_path / "run", progress=False)
    assert [r["inputs"] for r in rows] == [inputs, inputs]
    assert json.loads((tmp_path / "run" / "version.json").read_text())["inputs"] == inputs
    assert len(sweep.run(config, tmp_path / "run", progress=False)) == 2  # resumes
