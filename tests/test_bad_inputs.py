"""Bad input, table-driven: every case is one line ``specjax: error: ...`` naming the field
or file, exit status 2, and a workdir (the whole test folder) left byte for byte as it was.

Most cases run the command in-process (`specjax.main.main` after `specjax.runner.cli.
parse_flags`, `specjax.report.main`), which costs no JAX import per case; a handful at the
end run ``python -m specjax.main`` / ``python -m specjax.report`` as a user does, to check
that nothing (no absl INFO line, no progress bar, no traceback) precedes the error there.

This file: config files, config values and experiment modules, environment variables, and
end to end; the zoos are in test_bad_zoos.py, the workdirs and the report's inputs in
test_bad_workdirs.py, the harness in bad_inputs_harness.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from bad_inputs_harness import (
    REPO,
    SEED,
    TOY,
    _snapshot,
    assert_one_line_error,
    run_main,
)
from test_bad_workdirs import REPORT_CASES, WORKDIR_CASES, _report_case
from test_bad_zoos import ZOO_DAMAGE

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
