"""The sweep machinery, in process: errors, config arguments, grids, the results journal
and the registry (sweeps and the report: test_runner_sweeps.py)."""

from __future__ import annotations

import multiprocessing

import ml_collections
import pytest
from runner_helpers import TESTS, toy_experiment

from specjax.configs import common as config_common
from specjax.errors import ConfigError, check
from specjax.runner import grid, registry, results

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
