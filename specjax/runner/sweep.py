"""Running a sweep: every cell of ``config.grid`` through one registered experiment.

One workdir per run (big_vision style)::

    workdir/
      config.json      the config of the last invocation
      version.json     specjax / jax versions, devices, git commit (and earlier ones), and
                       ``inputs``: what the experiment's validate hook reports the cells
                       read besides the config (the zoo's folder and manifest sha256)
      results.jsonl    one JSON line per finished cell: cell_id, cell params, metrics,
                       wall_time_s, inputs (the resumable journal, see `results`)
      report.md, plots/*.png   (`specjax.runner.report`), then the experiment's own files

The runner reads these config fields; everything else belongs to the experiment:

  experiment              str, a registered experiment name (required)
  grid                    ConfigDict axis -> list of values (required, see `grid`)
  experiment_module       str, optional: module or .py path registering experiments
  report                  bool, optional (default True): write report.md and plots
  cells_across_processes  str, optional: "round_robin" (default) — with several JAX
                          processes, process i runs the i-th, (i+n)-th, ... of the cells
                          not yet recorded, on its local devices;
                          "all" — every process runs every cell together (one computation
                          over a mesh spanning hosts), process 0 records the results.

`run` = `prepare` (validates; writes nothing, so a bad config leaves no workdir behind)
then `execute`. Rerunning with the same workdir skips the cells already recorded, so a
killed sweep resumes; extending the grid runs only the new cells. Resuming with a config
that differs outside ``grid`` (and the runner's own fields), or whose ``inputs`` differ, is
refused: its results would be mixed with the old ones. So is a workdir holding results
whose ``config.json`` is missing or unreadable (the results could not be attributed).
Rows of cells outside the grid (a grid that shrank, a row copied in by hand) stay in the
journal but count nowhere: the report lists them, a warning names them, and neither the
report's figures, the experiment's finalize hook nor `run`'s return value include them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import ml_collections
from absl import logging

import specjax
from specjax.errors import ConfigError, check, user_path
from specjax.runner import grid as grid_lib
from specjax.runner import registry
from specjax.runner import results as results_lib

__all__ = ["Plan", "Processes", "prepare", "execute", "run", "version_info"]

CONFIG_NAME = "config.json"
VERSION_NAME = "version.json"
SPLIT_MODES = ("round_robin", "all")
# Fields that may change when a sweep is resumed: they do not change any cell's result.
RESUME_IGNORED = ("grid", "report", "experiment_module", "cells_across_processes")
# The key under which version.json and every result row record what the experiment's
# validate hook says the cells read besides the config (e.g. the zoo's folder and the
# sha256 of its manifest).
INPUTS_KEY = "inputs"


@dataclasses.dataclass(frozen=True)
class Processes:
    """Who this process is among the JAX processes, and a named barrier across them."""

    index: int = 0
    count: int = 1
    barrier: Callable[[str], None] = lambda name: None

    @classmethod
    def from_jax(cls) -> "Processes":
        import jax  # pylint: disable=import-outside-toplevel

        count, index = jax.process_count(), jax.process_index()
        if count == 1:
            return cls()
        from jax.experimental import multihost_utils  # pylint: disable=import-outside-toplevel

        return cls(index=index, count=count, barrier=multihost_utils.sync_global_devices)


@dataclasses.dataclass(frozen=True)
class Plan:
    """A validated sweep, ready to execute."""

    config: ml_collections.ConfigDict
    workdir: Path
    experiment: registry.Experiment
    cells: list[dict]
    config_json: dict
    inputs: dict = dataclasses.field(default_factory=dict)


def prepare(config: ml_collections.ConfigDict, workdir: str | os.PathLike) -> Plan:
    """Validates the config and the workdir; writes nothing.

    Raises:
      ConfigError: a workdir that exists as a file (or under a file), no or an unknown
        experiment, a bad grid, a config the experiment's validate hook rejects, or a
        workdir holding results of a config that differs outside ``grid``.
    """
    check(
        isinstance(config, ml_collections.ConfigDict),
        "--config",
        type(config).__name__,
        "a ConfigDict returned by the config file's get_config()",
    )
    workdir = _check_workdir(workdir)
    _check_outputs(workdir)
    name = config.get("experiment")
    check(
        isinstance(name, str) and name,
        "experiment",
        name,
        "the name of a registered experiment (config.experiment = '...')",
    )
    module = config.get("experiment_module")
    if module:
        check(isinstance(module, str), "experiment_module", module, "a string")
        registry.import_experiment_module(module)
    # The project's experiments ("plans") register on import; lazily: it imports JAX.
    # pylint: disable-next=import-outside-toplevel,unused-import
    from specjax.runner import experiments  # noqa: F401

    experiment = registry.get_experiment(name)
    check(
        config.get("cells_across_processes", "round_robin") in SPLIT_MODES,
        "cells_across_processes",
        config.get("cells_across_processes"),
        SPLIT_MODES,
    )
    cells = grid_lib.expand_grid(config)
    check(
        INPUTS_KEY not in grid_lib.grid_axes(config),
        f"grid.{INPUTS_KEY}",
        INPUTS_KEY,
        f"an axis name other than {INPUTS_KEY!r} (the runner's record of the inputs)",
    )
    inputs = experiment.validate(config) if experiment.validate is not None else None
    if inputs is not None and not isinstance(inputs, dict):
        raise TypeError(
            f"experiment {name!r}: validate returned {type(inputs).__name__}; "
            f"expected None or a dict of JSON-serialisable inputs"
        )
    inputs = grid_lib.to_jsonable(inputs or {}, f"inputs of experiment {name!r}")
    config_json = json.loads(config.to_json_best_effort())
    _check_resumable(workdir, config_json, inputs)
    return Plan(
        config=config,
        workdir=workdir,
        experiment=experiment,
        cells=cells,
        config_json=config_json,
        inputs=inputs,
    )


def execute(plan: Plan, *, progress: bool = True, processes: Processes | None = None) -> list[dict]:
    """Runs the cells of `plan` not yet recorded; returns the recorded rows of its cells
    (rows of cells outside the grid stay in the journal, reported, never returned)."""
    procs = processes or Processes.from_jax()
    workdir = plan.workdir
    try:
        workdir.mkdir(parents=True, exist_ok=True)
    except OSError as e:  # the workdir was checked in `prepare`; it changed since
        raise ConfigError.invalid(
            "--workdir", str(workdir), f"a directory that can be created ({_os_reason(e)})"
        ) from None
    spmd = plan.config.get("cells_across_processes", "round_robin") == "all"
    own_journal = procs.count > 1 and not spmd
    journal = results_lib.results_path(workdir, procs.index if own_journal else None)
    records = procs.index == 0 or own_journal
    with contextlib.ExitStack() as locks:
        # Process 0 holds the workdir's lock (that of results.jsonl, which it merges into);
        # every other process writing a journal holds that journal's.
        for path in {
            results_lib.results_path(workdir) if procs.index == 0 else None,
            journal if records else None,
        } - {None}:
            try:
                locks.enter_context(results_lib.journal_lock(path))
            except BlockingIOError:
                raise ConfigError(
                    f"--workdir: {workdir} is in use by another running sweep (lock on "
                    f"{path.name} held); wait for it or use another workdir",
                    field="--workdir",
                    value=str(workdir),
                    allowed="a workdir not in use",
                ) from None
        return _execute_locked(plan, procs, journal, records, spmd, progress)


def _execute_locked(
    plan: Plan, procs: Processes, journal: Path, records: bool, spmd: bool, progress: bool
) -> list[dict]:
    workdir, config, exp = plan.workdir, plan.config, plan.experiment
    if procs.index == 0:
        results_lib.atomic_write_json(workdir / CONFIG_NAME, plan.config_json)
        _write_version(workdir, plan.inputs)

    procs.barrier("specjax_sweep_start")  # config written, journals complete
    done = {r["cell_id"] for r in results_lib.read_all_results(workdir) if "cell_id" in r}
    procs.barrier("specjax_sweep_read")  # nobody appends before everyone has read
    todo = [c for c in plan.cells if c["cell_id"] not in done]
    mine = todo if spmd or procs.count == 1 else todo[procs.index :: procs.count]
    if done:
        logging.info(
            "%s: %d of %d cells already recorded; %d to run",
            workdir,
            len(plan.cells) - len(todo),
            len(plan.cells),
            len(todo),
        )
    if records:
        results_lib.repair(journal)

    bar = _progress_bar(
        len(mine), f"{exp.name} p{procs.index}" if procs.count > 1 else exp.name, enabled=progress
    )
    try:
        for cell in mine:
            start = time.perf_counter()
            metrics = exp.run(config, dict(cell), workdir)
            wall = time.perf_counter() - start
            record = _record(exp.name, cell, metrics, wall, procs.index, plan.inputs)
            if records:
                results_lib.append_result(journal, record)
            bar.set_postfix_str(f"{cell['cell_id']} {wall:.1f}s", refresh=False)
            bar.update(1)
    finally:
        bar.close()

    procs.barrier("specjax_sweep_cells_done")
    if procs.index == 0:
        rows = results_lib.merge_results(workdir, order=[c["cell_id"] for c in plan.cells])
        # Rows of cells outside this grid (an earlier, larger grid; a row copied from
        # another run) stay in the journal, but nothing counts them: they are reported.
        rows, outside = grid_lib.split_rows(rows, plan.cells)
        if outside:
            logging.warning(
                "%s: %d row(s) of %s are not cells of this grid (first: %s); "
                "the report and the summary leave them out",
                workdir,
                len(outside),
                results_lib.RESULTS_NAME,
                outside[0][1],
            )
        if config.get("report", True):
            from specjax.runner import report  # pylint: disable=import-outside-toplevel

            try:
                report.write_report(workdir, rows, plan.config_json, outside=outside)
            except Exception:  # pylint: disable=broad-except
                # The results are safe; a plotting bug must not cost the finalize hook.
                logging.exception(
                    "writing the report failed; fix and rebuild it with "
                    "python -m specjax.report --workdir=%s",
                    workdir,
                )
        if exp.finalize is not None:
            exp.finalize(config, workdir, rows)
    procs.barrier("specjax_sweep_finalized")
    return grid_lib.split_rows(results_lib.read_all_results(workdir), plan.cells)[0]


def run(
    config: ml_collections.ConfigDict, workdir: str | os.PathLike, *, progress: bool = True
) -> list[dict]:
    """`prepare` then `execute`: the whole sweep, resumable. Returns the rows of its cells."""
    return execute(prepare(config, workdir), progress=progress)


def version_info() -> dict[str, Any]:
    """Versions, devices and the git commit of the running code."""
    import jax  # pylint: disable=import-outside-toplevel
    import jaxlib  # pylint: disable=import-outside-toplevel

    devices = jax.devices()
    info = {
        "specjax": specjax.__version__,
        "jax": jax.__version__,
        "jaxlib": getattr(jaxlib, "__version__", None),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "backend": jax.default_backend(),
        "process_count": jax.process_count(),
        "device_count": len(devices),
        "local_device_count": jax.local_device_count(),
        "device_kind": devices[0].device_kind if devices else None,
        "devices": [str(d) for d in devices[:64]],
        "argv": list(sys.argv),
        "started_at": _now(),
    }
    info.update(_git_info(Path(specjax.__file__).resolve().parent.parent))
    return info


# ----------------------------------------------------------------------------------
# Helpers.
# ----------------------------------------------------------------------------------


def _check_workdir(workdir: str | os.PathLike) -> Path:
    """The workdir as a Path: an existing writable directory, or one that can be created.

    Writes nothing that stays: whether a directory can be created (or written to) is
    tested by creating a temporary directory in the nearest existing ancestor (or in the
    workdir) and removing it at once, since permission bits say nothing when running as
    root and nothing about /proc or /sys.
    """
    check(workdir is not None and str(workdir).strip(), "--workdir", workdir, "a directory path")
    path = user_path(workdir, "--workdir", "a directory path")
    existing = None
    try:
        for p in [path, *path.parents]:
            if p.exists() or p.is_symlink():
                if p.is_dir():
                    existing = p
                    break
                allowed = (
                    "a directory or a path to create, not an existing file"
                    if p == path
                    else f"a path that can be created ({p} is a file)"
                )
                raise ConfigError.invalid("--workdir", str(workdir), allowed)
        if existing is None:
            raise ConfigError.invalid("--workdir", str(workdir), "a path that can be created")
        probe = tempfile.mkdtemp(prefix=".specjax-probe-", dir=existing)
        os.rmdir(probe)
    except ConfigError:
        raise
    except (OSError, ValueError) as e:
        allowed = (
            "a directory path"
            if existing is None
            else "a writable directory"
            if existing == path
            else f"a directory that can be created ({existing} is not writable)"
        )
        raise ConfigError.invalid(
            "--workdir", str(workdir), f"{allowed}: {_os_reason(e)}"
        ) from None
    return path


# What a sweep writes in its workdir (the runner, the report, the shipped experiments'
# finalize hooks): each, when it exists already, must be of its kind, or the sweep would
# fail writing it after its cells ran.
OUTPUTS = {
    CONFIG_NAME: "file",
    VERSION_NAME: "file",
    results_lib.RESULTS_NAME: "file",
    f".{results_lib.RESULTS_NAME}.lock": "file",
    "report.md": "file",
    "plots": "directory",
    "summary.json": "file",
    "seed_report.md": "file",
    "baselines": "directory",
}


def _check_outputs(workdir: Path) -> None:
    for name, kind in OUTPUTS.items():
        target = workdir / name
        try:
            if not (target.exists() or target.is_symlink()):
                continue
            ok = target.is_dir() if kind == "directory" else target.is_file()
        except OSError:
            ok = False
        check(ok, "--workdir", str(workdir), f"a run directory where {name} is a {kind}")


def _os_reason(e: BaseException) -> str:
    if isinstance(e, OSError) and e.strerror:
        return e.strerror
    return " ".join(str(e).split()) or type(e).__name__


def _check_resumable(workdir: Path, config_json: dict, inputs: dict | None = None) -> None:
    """Refuses a workdir whose results were computed under another config or inputs.

    A workdir that holds results but whose ``config.json`` is missing or unreadable is
    refused too: its results could no longer be attributed to a config, and writing the
    new one would silently re-label them.
    """
    try:
        rows = results_lib.read_all_results(workdir)
    except OSError as e:
        raise ConfigError.invalid(
            "--workdir",
            str(workdir),
            f"a run directory whose {results_lib.RESULTS_NAME} is readable ({_os_reason(e)})",
        ) from None
    if not rows:
        return
    old_path = workdir / CONFIG_NAME
    way_out = (
        f"restore {CONFIG_NAME}, or use a new workdir (or move "
        f"{results_lib.RESULTS_NAME} away to start over)"
    )
    try:
        old = json.loads(old_path.read_text(encoding="utf-8"))
        problem = None if isinstance(old, dict) else "not a JSON object"
    except FileNotFoundError:
        problem = "missing"
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        problem = f"unreadable ({_os_reason(e) if isinstance(e, OSError) else 'not JSON'})"
    if problem:
        raise ConfigError(
            f"--workdir: {workdir} holds {len(rows)} result(s) but its {CONFIG_NAME} is "
            f"{problem}, so they cannot be attributed to a config; {way_out}",
            field="--workdir",
            value=str(workdir),
            allowed=f"a workdir whose results have their {CONFIG_NAME}",
        )
    differ = _diff_paths(
        {k: v for k, v in old.items() if k not in RESUME_IGNORED},
        {k: v for k, v in config_json.items() if k not in RESUME_IGNORED},
    )
    if differ:
        shown = ", ".join(differ[:8]) + (", ..." if len(differ) > 8 else "")
        raise ConfigError(
            f"--workdir: {workdir} holds results of a different config (differs in "
            f"{shown}); use a new workdir, or the same values to resume",
            field="--workdir",
            value=str(workdir),
            allowed="a workdir of the same config",
        )
    recorded = [r.get(INPUTS_KEY) for r in rows if INPUTS_KEY in r]
    other = [r for r in recorded if r != (inputs or {})]
    if other:
        differ = _diff_paths(other[0], inputs or {}) if isinstance(other[0], dict) else []
        shown = ", ".join(f"{INPUTS_KEY}.{d}" for d in differ[:4]) or INPUTS_KEY
        raise ConfigError(
            f"--workdir: {workdir} holds results computed from other inputs (differ in "
            f"{shown}: recorded {_brief(other[0])}, now {_brief(inputs)}); use a new "
            f"workdir, or the same inputs to resume",
            field="--workdir",
            value=str(workdir),
            allowed="a workdir of the same inputs",
        )


def _brief(obj: Any, limit: int = 160) -> str:
    text = json.dumps(obj, sort_keys=True)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _diff_paths(a: Any, b: Any, prefix: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in list(a) + [k for k in b if k not in a]:
            path = f"{prefix}.{k}" if prefix else k
            if k not in a or k not in b:
                out.append(path)
            else:
                out.extend(_diff_paths(a[k], b[k], path))
        return out
    return [] if a == b else [prefix or "(root)"]


def _record(
    name: str, cell: dict, metrics: Any, wall: float, index: int, inputs: dict | None = None
) -> dict:
    if not isinstance(metrics, dict):
        raise TypeError(
            f"experiment {name!r} returned {type(metrics).__name__}; expected a "
            f"dict of JSON-serialisable metrics"
        )
    clash = sorted(set(metrics) & {*grid_lib.RESERVED_AXES, *([INPUTS_KEY] if inputs else [])})
    if clash:
        raise ValueError(f"experiment {name!r} returned the runner's own keys {clash}")
    params = grid_lib.cell_params(cell)
    return {
        "cell_id": cell["cell_id"],
        "cell": params,
        **params,
        **grid_lib.to_jsonable(metrics, f"metrics of experiment {name!r}"),
        "wall_time_s": round(wall, 6),
        "finished_at": _now(),
        "process_index": index,
        **({INPUTS_KEY: inputs} if inputs else {}),
    }


def _write_version(workdir: Path, inputs: dict | None = None) -> None:
    info = version_info()
    if inputs:
        info[INPUTS_KEY] = inputs
    path = workdir / VERSION_NAME
    try:
        old = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        old = None
    if isinstance(old, dict):
        # Keep the versions a resumed sweep ran under before, when they differ.
        previous = old.pop("previous", [])
        keys = (
            "specjax",
            "jax",
            "jaxlib",
            "git_commit",
            "git_dirty",
            "backend",
            "device_count",
            INPUTS_KEY,
        )
        if any(old.get(k) != info.get(k) for k in keys):
            previous.append(old)
        if previous:
            info["previous"] = previous
    results_lib.atomic_write_json(path, info)


def _git_info(root: Path) -> dict[str, Any]:
    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(
                ["git", *args], cwd=root, capture_output=True, text=True, timeout=10, check=True
            )
        except (OSError, subprocess.SubprocessError):
            return None
        return out.stdout.strip()

    commit = git("rev-parse", "HEAD")
    if not commit:
        return {"git_commit": None}
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"git_commit": commit, "git_dirty": bool(status) if status is not None else None}


def _progress_bar(total: int, desc: str, enabled: bool):
    from tqdm import tqdm  # pylint: disable=import-outside-toplevel

    return tqdm(
        total=total,
        desc=desc,
        unit="cell",
        file=sys.stderr,
        disable=not enabled,
        dynamic_ncols=True,
        smoothing=0.1,
        bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}, {rate_fmt}{postfix}]",
    )


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
