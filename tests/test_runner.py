"""The sweep machinery, in process: errors, config arguments, grids, the results journal,
the registry, resumable sweeps (one and several processes) and the report."""

from __future__ import annotations

import json
import multiprocessing
import threading
from pathlib import Path

import ml_collections
import pytest

from specjax.configs import common as config_common
from specjax.errors import ConfigError, check
from specjax.runner import grid, registry, report, results, sweep
from specjax.runner import rows as rows_lib

TESTS = Path(__file__).resolve().parent
TOY_CONFIG = TESTS / "configs" / "toy.py"
# The module the toy config names in `experiment_module` (imported once, by path).
toy_experiment = registry.import_experiment_module(str(TESTS / "toy_experiment.py"))


def load_toy_config(arg: str | None = None) -> ml_collections.ConfigDict:
    """tests/configs/toy.py's get_config(arg), as `--config=...:arg` would call it."""
    import importlib.util  # pylint: disable=import-outside-toplevel

    spec = importlib.util.spec_from_file_location("toy_config", TOY_CONFIG)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config(arg)


# ----------------------------------------------------------------------------------
# errors
# ----------------------------------------------------------------------------------


def test_config_error_names_field_value_and_allowed():
    with pytest.raises(ConfigError) as e:
        check(False, "grid.gamma", 0, "integers >= 1")
    assert str(e.value) == "grid.gamma: got 0, allowed: integers >= 1"
    assert (e.value.field, e.value.value, e.value.allowed) == ("grid.gamma", 0, "integers >= 1")
    assert isinstance(e.value, ValueError)
    with pytest.raises(ConfigError, match=r"policy: got 'x', allowed: one of 'naive', 'all_on'"):
        check(False, "policy", "x", ["naive", "all_on"])
    check(True, "unused", 0, "anything")
    # ml_collections re-raises errors from get_config as type(e)(message).
    assert str(ConfigError("just a message")) == "just a message"


# ----------------------------------------------------------------------------------
# config arguments (specjax.configs.common)
# ----------------------------------------------------------------------------------


def _defaults() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.gamma = 4
    c.temperature = 1.0
    c.name = "naive"
    c.flag = False
    c.maybe = None
    c.grid = ml_collections.ConfigDict()
    c.grid.seed = [0]
    c.grid.pairing = [("code", "prose")]
    return c


def test_parse_config_arg_variants_then_overrides_with_type_coercion():
    def runlocal(c):
        c.gamma = 2
        c.grid.seed = [0, 1, 2]

    c = config_common.parse_config_arg(
        "gamma=3,runlocal,temperature=0,name='all_on',flag=yes,maybe=[1,2],grid.seed=7,"
        "grid.pairing=[(code,prose),(code,prose,reasoning)]",
        _defaults(),
        {"runlocal": runlocal},
    )
    assert c.gamma == 3 and isinstance(c.gamma, int)  # override applied after the variant
    assert c.temperature == 0.0 and isinstance(c.temperature, float)
    assert c.name == "all_on" and c.flag is True and c.maybe == [1, 2]
    assert c.grid.seed == [7]  # a scalar pins a list axis
    assert c.grid.pairing == [("code", "prose"), ("code", "prose", "reasoning")]
    assert config_common.parse_config_arg(None, _defaults(), {}).gamma == 4
    assert config_common.parse_config_arg("", _defaults(), {}).gamma == 4
    c = config_common.parse_config_arg("grid={'gamma': [1, 2]}", _defaults(), {})
    assert list(c.grid.keys()) == ["gamma"]


@pytest.mark.parametrize(
    "arg,match",
    [
        ("nope=1", r"nope=1: no such config field; fields here: .*gamma"),
        ("gama=1", r"did you mean 'gamma'"),
        ("grid.sed=[1]", r"did you mean 'grid.seed'"),
        ("gamma.x=1", r"'gamma' is not a ConfigDict"),
        ("gamma=2.5", r"gamma: got '2.5', allowed: an integer"),
        ("temperature=hot", r"temperature: got 'hot', allowed: a number"),
        ("flag=maybe", r"flag: got 'maybe', allowed: a bool"),
        ("grid=3", r"grid: got '3', allowed: a dict literal"),
        ("runbig", r"config variant: got 'runbig', allowed: one of 'runlocal'"),
        ("grid.seed=[1,2", r"balanced brackets"),
    ],
)
def test_parse_config_arg_errors(arg, match):
    with pytest.raises(ConfigError, match=match):
        config_common.parse_config_arg(arg, _defaults(), {"runlocal": lambda c: None})


def test_split_arg_respects_brackets_and_quotes():
    assert config_common.split_arg("a,b=[1,2],c='x,y',d={'k': (1, 2)},,") == [
        "a",
        "b=[1,2]",
        "c='x,y'",
        "d={'k': (1, 2)}",
    ]


# ----------------------------------------------------------------------------------
# grid
# ----------------------------------------------------------------------------------


def _grid_config(**axes) -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.grid = ml_collections.ConfigDict()
    for k, v in axes.items():
        c.grid[k] = v
    return c


def test_expand_grid_order_and_stable_ids():
    c = _grid_config(
        gamma=[2, 4],
        pairing=[("code",), ("code", "prose")],
        policy=["naive", {"name": "custom", "kl_ceiling": 0.35}],
    )
    cells = grid.expand_grid(c)
    assert len(cells) == 8
    assert cells == grid.expand_grid(c)  # deterministic
    # Declaration order, last axis fastest; values in JSON form (tuples -> lists).
    assert [(x["gamma"], x["pairing"], x["policy"]) for x in cells[:3]] == [
        (2, ["code"], "naive"),
        (2, ["code"], {"name": "custom", "kl_ceiling": 0.35}),
        (2, ["code", "prose"], "naive"),
    ]
    assert list(cells[0]) == ["cell_id", "gamma", "pairing", "policy"]
    ids = [x["cell_id"] for x in cells]
    assert len(set(ids)) == 8 and all(len(i) == 12 for i in ids)
    # A golden value: changing how ids are computed would orphan every existing journal.
    assert grid.cell_id({"gamma": 2, "seed": 0}) == "24c188028b4a"
    # Ids depend on the cell's values only: not on key order, tuple vs list, 1 vs 1.0,
    # nor on the other cells of the grid (so a grid can be extended and resumed).
    assert grid.cell_id({"seed": 0, "gamma": 2.0}) == grid.cell_id({"gamma": 2, "seed": 0})
    assert grid.cell_id({"pairing": ("a", "b")}) == grid.cell_id({"pairing": ["a", "b"]})
    bigger = grid.expand_grid(
        _grid_config(
            gamma=[2, 4, 8],
            pairing=[("code",), ("code", "prose")],
            policy=["naive", {"name": "custom", "kl_ceiling": 0.35}],
        )
    )
    assert set(ids) < {x["cell_id"] for x in bigger}


@pytest.mark.parametrize(
    "grid_value,match",
    [
        (None, r"grid: got None"),
        ({}, r"grid: got \{\}, allowed: at least one axis"),
        ({"gamma": []}, r"grid.gamma: got \[\], allowed: a non-empty list"),
        ({"gamma": 4}, r"grid.gamma: got 4, allowed: a list of values"),
        ({"gamma": [2, 2.0]}, r"grid.gamma: .*distinct values"),
        ({"cell_id": [1]}, r"reserved"),
        ({"temperature": [float("nan")]}, r"finite"),
    ],
)
def test_grid_validation(grid_value, match):
    c = ml_collections.ConfigDict()
    if grid_value is not None:
        c.grid = ml_collections.ConfigDict(grid_value)
    with pytest.raises(ConfigError, match=match):
        grid.expand_grid(c)


# ----------------------------------------------------------------------------------
# results journal
# ----------------------------------------------------------------------------------


def test_append_and_read_roundtrip(tmp_path):
    path = tmp_path / "results.jsonl"
    assert results.read_results(path) == [] and results.completed_cell_ids(path) == set()
    rows = [
        {"cell_id": f"c{i}", "x": i, "text": "multi\nline", "kl_max": float("inf")}
        for i in range(3)
    ]
    for r in rows:
        results.append_result(path, r)
    assert results.read_results(path) == rows
    assert path.read_bytes().count(b"\n") == 3
    assert results.completed_cell_ids(path) == {"c0", "c1", "c2"}
    with pytest.raises(TypeError):
        results.append_result(path, {"cell_id": "bad", "x": object()})
    assert len(results.read_results(path)) == 3  # nothing written by the failed append


def test_torn_line_is_skipped_terminated_by_the_next_append_and_repaired(tmp_path):
    path = tmp_path / "results.jsonl"
    results.append_result(path, {"cell_id": "a"})
    with open(path, "ab") as f:  # what a kill in the middle of a write leaves
        f.write(b'{"cell_id": "b", "joint_acc')
    assert [r["cell_id"] for r in results.read_results(path)] == ["a"]
    # The next append is never glued to the fragment: it starts a new line.
    results.append_result(path, {"cell_id": "c"})
    assert path.read_text() == '{"cell_id":"a"}\n{"cell_id": "b", "joint_acc\n{"cell_id":"c"}\n'
    assert results.completed_cell_ids(path) == {"a", "c"}
    with open(path, "ab") as f:
        f.write(b'{"cell_id": "d"}')  # complete JSON but no newline: still torn
    assert results.completed_cell_ids(path) == {"a", "c"}
    assert results.repair(path) == 2
    assert path.read_text() == '{"cell_id":"a"}\n{"cell_id":"c"}\n'
    assert results.repair(path) == 0 and results.repair(tmp_path / "missing.jsonl") == 0
    # Lines that are not JSON objects are torn writes too.
    path.write_text('{"cell_id": "a"}\nGARBAGE\n[1, 2]\n\n{"cell_id": "b"}\n')
    assert [r["cell_id"] for r in results.read_results(path)] == ["a", "b"]
    assert results.repair(path) == 2
    assert path.read_text() == '{"cell_id": "a"}\n{"cell_id": "b"}\n'


def test_journal_lock_is_exclusive(tmp_path):
    path = tmp_path / "results.jsonl"
    with results.journal_lock(path):
        with pytest.raises(BlockingIOError):
            with results.journal_lock(path):
                pass
    with results.journal_lock(path):  # released
        pass


def _append_many(path: str, tag: int, n: int) -> None:
    for i in range(n):
        results.append_result(path, {"cell_id": f"{tag}-{i}", "pad": "x" * 3000})


def test_concurrent_appends_never_interleave(tmp_path):
    # One writer per file is the design; O_APPEND + one write keeps lines whole anyway.
    path = str(tmp_path / "results.jsonl")
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_append_many, args=(path, t, 50)) for t in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    assert all(p.exitcode == 0 for p in procs)
    ids = [r["cell_id"] for r in results.read_results(path)]
    assert sorted(ids) == sorted(f"{t}-{i}" for t in range(3) for i in range(50))


def test_merge_results_dedups_orders_and_removes_process_journals(tmp_path):
    results.append_result(results.results_path(tmp_path), {"cell_id": "b", "v": "main"})
    results.append_result(results.results_path(tmp_path, 1), {"cell_id": "c", "v": 1})
    results.append_result(results.results_path(tmp_path, 0), {"cell_id": "a", "v": 0})
    results.append_result(results.results_path(tmp_path, 0), {"cell_id": "b", "v": "dup"})
    rows = results.merge_results(tmp_path, order=["a", "b", "c"])
    assert [(r["cell_id"], r["v"]) for r in rows] == [("a", 0), ("b", "main"), ("c", 1)]
    assert results.read_results(results.results_path(tmp_path)) == rows
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.jsonl"]


def test_atomic_write_text_replaces_whole_file(tmp_path):
    path = tmp_path / "config.json"
    results.atomic_write_json(path, {"a": 1})
    results.atomic_write_text(path, "second\n")
    assert path.read_text() == "second\n"
    assert [p.name for p in tmp_path.iterdir()] == ["config.json"]  # no temp files left


# ----------------------------------------------------------------------------------
# registry
# ----------------------------------------------------------------------------------


def test_registry_lookup_and_errors(monkeypatch):
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))  # pylint: disable=protected-access
    exp = registry.get_experiment("toy")
    assert exp.run is toy_experiment.toy and exp.validate is toy_experiment.validate
    assert "toy" in registry.known_experiments()
    with pytest.raises(ConfigError, match=r"experiment: got 'nope', allowed: one of .*'toy'"):
        registry.get_experiment("nope")
    # The same function again (a module imported twice or reloaded): replaces the entry.
    registry.register_experiment("toy", validate=exp.validate)(toy_experiment.toy)
    assert registry.get_experiment("toy").finalize is None
    with pytest.raises(ValueError, match="already registered"):
        registry.register_experiment("toy")(lambda config, cell, workdir: {})
    with pytest.raises(ConfigError, match="experiment_module"):
        registry.import_experiment_module(str(TESTS / "no_such_module.py"))
    with pytest.raises(ConfigError, match="experiment_module"):
        registry.import_experiment_module("specjax_no_such_package.experiments")
    registry.import_experiment_module(str(TESTS / "toy_experiment.py"))  # same fn again: ok


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


def test_split_rows_keeps_the_grid_and_names_the_rest():
    config = _grid_config(gamma=[1, 2], seed=[0])
    cells = grid.expand_grid(config)
    rows = [
        {"cell_id": c["cell_id"], "cell": grid.cell_params(c), "x": i} for i, c in enumerate(cells)
    ]
    other = {"cell_id": "feedfeedfeed", "cell": {"gamma": 9, "seed": 0}}
    relabelled = {"cell_id": cells[0]["cell_id"], "cell": {"gamma": 7, "seed": 0}}
    inside, outside = grid.split_rows(rows + [other, relabelled, {"x": 1}], cells)
    assert inside == rows
    assert [why for _, why in outside] == [
        "cell_id 'feedfeedfeed' is not a cell of the grid",
        f'its cell {{"gamma": 7, "seed": 0}} is not the values of cell {cells[0]["cell_id"]} '
        f'{{"gamma": 1, "seed": 0}}',
        "it has no cell_id",
    ]


def test_grid_size_is_bounded():
    assert len(grid.expand_grid(_grid_config(a=list(range(100)), b=list(range(100))))) == 10_000
    with pytest.raises(ConfigError, match=r"grid: .*at most 10000 cells .*this grid has 10100"):
        grid.expand_grid(_grid_config(a=list(range(100)), b=list(range(101))))


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
