"""Bad workdirs and report inputs: a workdir the runner refuses, results from another zoo,
a workdir the report cannot read, and rows the report writes as they are (non-finite
values) or reports without counting (outside the grid). Each refusal is one line
``specjax: error: ...``, exit status 2, and nothing written (tests/bad_inputs_harness.py).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from bad_inputs_harness import (
    REPO,
    TOY,
    _snapshot,
    assert_one_line_error,
    run_main,
    run_report,
)

from specjax.configs import common as config_common
from specjax.runner import results

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
