"""The sweep machinery, in process: resumable sweeps (one and several processes) and the
report (tables, labels, plots). Errors, config arguments, grids, the results journal and the
registry: test_runner.py."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
from runner_helpers import load_toy_config, toy_experiment

from specjax.errors import ConfigError
from specjax.runner import grid, registry, report, results, sweep
from specjax.runner import rows as rows_lib

# ----------------------------------------------------------------------------------
# sweeps
# ----------------------------------------------------------------------------------


class Counting:
    """Wraps the toy experiment, counting calls per cell."""

    def __init__(self):
        self.calls: list[str] = []
        self.lock = threading.Lock()

    def __call__(self, config, cell, workdir):
        with self.lock:
            self.calls.append(cell["cell_id"])
        return toy_experiment.toy(config, cell, workdir)


@pytest.fixture
def counting(monkeypatch):
    counter = Counting()
    exp = registry.get_experiment("toy")
    monkeypatch.setitem(
        registry._REGISTRY,
        "toy",  # pylint: disable=protected-access
        registry.Experiment("toy", counter, exp.validate, exp.finalize),
    )
    return counter


def test_sweep_runs_every_cell_once_and_resumes(tmp_path, counting):
    workdir = tmp_path / "run"
    config = load_toy_config("runlocal,report=false")
    rows = sweep.run(config, workdir, progress=False)
    cells = grid.expand_grid(config)
    assert [r["cell_id"] for r in rows] == [c["cell_id"] for c in cells]  # grid order
    assert sorted(counting.calls) == sorted(c["cell_id"] for c in cells)
    row = rows[0]
    assert row["cell"] == grid.cell_params(cells[0])
    assert row["gamma"] == cells[0]["gamma"] and row["pairing"] == ["code", "prose"]
    assert {"acceptance", "joint_acceptance", "wall_time_s", "finished_at"} <= set(row)
    assert json.loads((workdir / "config.json").read_text())["experiment"] == "toy"
    version = json.loads((workdir / "version.json").read_text())
    assert version["specjax"] and version["jax"] and version["device_count"] >= 1
    assert "git_commit" in version
    assert json.loads((workdir / "summary.json").read_text())["cells"] == 8  # finalize hook

    # Rerun: nothing to do.
    counting.calls.clear()
    assert len(sweep.run(config, workdir, progress=False)) == 8 and counting.calls == []
    # Extended grid: only the new cells run.
    extended = load_toy_config("runlocal,report=false,grid.gamma=[1,2,3]")
    rows = sweep.run(extended, workdir, progress=False)
    assert len(counting.calls) == 4 and len(rows) == 12
    assert len({r["cell_id"] for r in rows}) == 12
    # A different config outside the grid would mix results: refused, nothing run.
    counting.calls.clear()
    with pytest.raises(ConfigError, match=r"holds results of a different config .*sleep_s"):
        sweep.prepare(load_toy_config("runlocal,sleep_s=0.5"), workdir)
    assert counting.calls == []


def test_sweep_validation_writes_nothing(tmp_path):
    (tmp_path / "file").write_text("x")
    bad = [
        (load_toy_config(), tmp_path / "file", r"--workdir: .*not an existing file"),
        (load_toy_config(), tmp_path / "file" / "sub", r"--workdir: .*is a file"),
        (load_toy_config("grid.gamma=[0,2]"), tmp_path / "w", r"grid.gamma: got \[0, 2\]"),
        (load_toy_config("experiment=nope"), tmp_path / "w", r"experiment: got 'nope'"),
        (
            load_toy_config("experiment_module=/nonexistent/x.py"),
            tmp_path / "w",
            r"experiment_module",
        ),
    ]
    for config, workdir, match in bad:
        with pytest.raises(ConfigError, match=match):
            sweep.run(config, workdir, progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


def _run_as_processes(plan, n):
    """Runs `plan` as n simulated JAX processes (threads with a shared barrier)."""
    barrier = threading.Barrier(n)
    out, errors = {}, []

    def process(i):
        try:
            out[i] = sweep.execute(
                plan,
                progress=False,
                processes=sweep.Processes(
                    index=i, count=n, barrier=lambda name: barrier.wait(timeout=60)
                ),
            )
        except BaseException as e:  # pylint: disable=broad-except
            errors.append(e)
            barrier.abort()

    threads = [threading.Thread(target=process, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    return out


def test_sweep_over_two_processes_all_cells_mode(tmp_path, counting):
    # "all": every process runs every cell (one computation over a mesh spanning hosts);
    # only process 0 records.
    config = load_toy_config("runlocal,report=false")
    with config.unlocked():
        config.cells_across_processes = "all"
    plan = sweep.prepare(config, tmp_path / "run")
    out = _run_as_processes(plan, 2)
    ids = [c["cell_id"] for c in plan.cells]
    assert sorted(counting.calls) == sorted(ids * 2)
    assert [r["cell_id"] for r in out[0]] == ids and out[1] == out[0]
    assert {r["process_index"] for r in out[0]} == {0}
    assert sorted(p.name for p in (tmp_path / "run").glob("results*")) == ["results.jsonl"]


def test_sweep_over_two_processes_splits_round_robin_and_merges(tmp_path, counting):
    workdir = tmp_path / "run"
    config = load_toy_config("runlocal,report=false")
    cells = grid.expand_grid(config)
    # Process 1 of an earlier, killed run left two cells in its journal (and the run had
    # written its config.json first, as every run does: results without one are refused).
    workdir.mkdir()
    (workdir / "config.json").write_text(config.to_json_best_effort())
    for c in cells[:2]:
        results.append_result(
            results.results_path(workdir, 1), {**c, **toy_experiment.toy(config, c, workdir)}
        )
    plan = sweep.prepare(config, workdir)
    out = _run_as_processes(plan, 2)
    todo = [c["cell_id"] for c in cells[2:]]
    assert sorted(counting.calls) == sorted(todo)  # each remaining cell exactly once
    rows = results.read_results(workdir / "results.jsonl")
    assert [r["cell_id"] for r in rows] == [c["cell_id"] for c in cells]  # merged, grid order
    by_id = {r["cell_id"]: r for r in rows}
    assert [by_id[cid]["process_index"] for cid in todo] == [i % 2 for i in range(len(todo))]
    assert not list(workdir.glob("results.p*.jsonl"))  # folded into results.jsonl
    assert out[0] == out[1] == rows


# ----------------------------------------------------------------------------------
# report
# ----------------------------------------------------------------------------------


def _fake_rows() -> list[dict]:
    config = load_toy_config()  # 36 cells over gamma, temperature, pairing and policy
    return [
        {**c, "cell": grid.cell_params(c), **toy_experiment.toy(config, c, Path("."))}
        for c in grid.expand_grid(config)
    ]


def _is_png(path: Path) -> bool:
    return path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000


def test_report_writes_markdown_and_every_plot(tmp_path):
    rows = _fake_rows()
    for r in rows:
        results.append_result(results.results_path(tmp_path), r)
    config = json.loads(load_toy_config().to_json_best_effort())
    (tmp_path / "config.json").write_text(json.dumps(config))
    out = report.write_report(tmp_path)
    text = out.read_text()
    assert out == tmp_path / "report.md"
    assert text.startswith("# toy: 36 cells")
    assert "Fixed: verifier_temperature = 1, seed = 0" in text
    assert "## Mean over cells, per policy" in text and "| naive | 18 |" in text
    assert text.count("\n| `") == 36  # one table row per cell
    assert "code 0.6" in text and "code+prose+reasoning" in text
    from specjax.runner.plots import PLOTS

    for name in set(PLOTS) - {"kl_ceiling"}:  # ≥ 2 ceilings: tests/test_sweep_pages.py
        assert _is_png(tmp_path / "plots" / f"{name}.png"), name
        assert f"(plots/{name}.png)" in text


def test_report_draws_only_the_plots_its_columns_allow(tmp_path):
    rows = [
        {k: r[k] for k in ("cell_id", "cell", "gamma", "drafter_temperature", "acceptance")}
        for r in _fake_rows()
    ]
    (tmp_path / "plots").mkdir()
    (tmp_path / "plots" / "joint_vs_kl.png").write_bytes(b"stale")
    report.write_report(tmp_path, rows, config={})
    assert sorted(p.name for p in (tmp_path / "plots").iterdir()) == ["acceptance_vs_gamma.png"]
    assert "joint_vs_kl" not in (tmp_path / "report.md").read_text()
    # No rows at all: a report that says so, no plots.
    empty = tmp_path / "empty"
    empty.mkdir()
    report.write_report(empty, [], config={})
    assert "No results yet." in (empty / "report.md").read_text()
    assert not list((empty / "plots").iterdir())


def test_report_writes_non_finite_values_as_such_and_plots_finite_ones(tmp_path):
    rows = _fake_rows()
    rows[0]["joint_acceptance"] = float("inf")
    rows[1]["joint_acceptance"] = float("-inf")  # with inf above: a mean of nan
    rows[2]["kl_max"] = float("nan")
    rows[3]["mean_truncation_depth"] = 1e308  # finite, but no plot can place it
    rows[4]["throughput_ratio_vs_single"] = 10**400
    out = report.write_report(tmp_path, rows, config={})
    text = out.read_text()
    cells = text.split("## Every cell", 1)[1]
    assert "| inf |" in cells and "| -inf |" in cells and "| nan |" in cells
    assert "1e+308" in cells
    from specjax.runner.plots import PLOTS

    drawn = sorted(p.stem for p in (tmp_path / "plots").iterdir())
    assert drawn == sorted(set(PLOTS) - {"kl_ceiling"})  # the toy rows run one ceiling


def test_labels():
    assert rows_lib.label(["code", "prose"]) == "code+prose"
    assert rows_lib.label(0.5) == "0.5" and rows_lib.label(1.0) == "1"
    switches = {
        "prefix_partitioning": True,
        "truncate_and_attribute": True,
        "agreement_weighted_consensus": False,
        "kl_ceiling": 0.35,
    }
    # A spelled-out policy is shown by its canonical name (specjax.policy.names).
    assert rows_lib.label(switches) == "all_on_minus_agreement_weighted_consensus"
    assert rows_lib.label({**switches, "kl_ceiling": 0.5}) == (
        "all_on_minus_agreement_weighted_consensus_kl0.5"
    )
    assert rows_lib.label({**switches, "kl_ceiling": None}) == "p1t1a0k0"
    assert rows_lib.label({"name": "all_on", "x": 1}) == "all_on"


def _kl_row(policy, **fields):
    return {
        "cell_id": policy,
        "policy": policy,
        "pairing": ["code", "prose"],
        "kl_max": 0.3,
        "joint_acceptance": 0.6,
        **fields,
    }


def _vertical_lines(fig) -> list[float]:
    """The x of every vertical line (axvline) of the figure's axes."""
    xs = []
    for ax in fig.axes:
        for line in ax.get_lines():
            x = list(line.get_xdata())
            if len(x) == 2 and x[0] == x[1]:
                xs.append(float(x[0]))
    return sorted(xs)


def test_joint_vs_kl_draws_the_ceiling_each_row_ran_with(tmp_path):
    from specjax.runner import plots

    # An all_on_kl0.5 run: its line is at 0.5, not at the field report's 0.35.
    fig = plots.figure_joint_vs_kl([_kl_row("all_on_kl0.5", kl_ceiling=0.5)])
    assert _vertical_lines(fig) == [0.5]
    # A row written before rows recorded the ceiling: the ceiling its policy name parses to.
    assert _vertical_lines(plots.figure_joint_vs_kl([_kl_row("all_on_kl0.5")])) == [0.5]
    assert _vertical_lines(plots.figure_joint_vs_kl([_kl_row("all_on")])) == [0.35]
    # Switch 4 off (or a router): no ceiling to draw; two ceilings: both drawn.
    assert (
        _vertical_lines(
            plots.figure_joint_vs_kl([_kl_row("naive", kl_ceiling=None), _kl_row("auto")])
        )
        == []
    )
    assert _vertical_lines(
        plots.figure_joint_vs_kl(
            [_kl_row("all_on_kl0.5", kl_ceiling=0.5), _kl_row("all_on", kl_ceiling=0.35)]
        )
    ) == [0.35, 0.5]
    # The report draws the plot from the same rows.
    text, pngs = report.render_report([_kl_row("all_on_kl0.5", kl_ceiling=0.5)], {}, {})
    assert "joint_vs_kl" in pngs and "(plots/joint_vs_kl.png)" in text


def test_decision_boundary_judges_each_row_by_its_thresholds():
    from specjax.runner import plots

    row = {
        "cell_id": "a",
        "policy": "all_on",
        "shared_prefix_acceptance": 0.5,
        "mean_truncation_depth": 1.0,
        "independent_branch_acceptance": 0.2,
        "thresholds": {
            "acceptance_floor": 0.6,
            "depth_ceiling": 3.0,
            "truncation_overhead_ratio": 0.15,
        },
    }
    fig = plots.figure_decision_boundary([row])
    assert _vertical_lines(fig) == [3.0]
    floors = [
        float(l.get_ydata()[0])
        for ax in fig.axes
        for l in ax.get_lines()
        if len(l.get_ydata()) == 2 and l.get_ydata()[0] == l.get_ydata()[1]
    ]
    assert floors == [0.6]
    # An older row without thresholds: the config's boundary block.
    old = {k: v for k, v in row.items() if k != "thresholds"}
    assert rows_lib.thresholds(old, {"boundary": {"acceptance_floor": 0.3}}).acceptance_floor == 0.3
    assert rows_lib.thresholds(old).depth_ceiling == 2.5
