"""Kills (SIGKILL: no cleanup runs) at the results journal's append boundaries and during a
script's final write, then a resume: no row torn, duplicated or lost (#51).

Deterministic, no sleeps, no kill windows: each writer is a subprocess that wraps
``os.open`` / ``os.write`` / ``os.fsync`` / ``os.replace`` (as
tests/test_journal.py::test_killed_writers_leave_a_reopenable_journal does for the plan
journal) and kills itself at a named point of its n-th append
(`specjax.runner.results.append_result`) or of the rename that publishes a file:

* ``before-write``: the journal opened, nothing written: the row is absent, redone;
* ``mid-write``: half the row's line written: a torn line, skipped by the reader, removed by
  the resumed writer's `results.repair`; the row is redone;
* ``after-write``: the whole line written, not fsynced (a process kill, not a power cut:
  the page cache keeps it): the row is present, not redone;
* ``after-fsync``: the line durable, the descriptor not closed: present, not redone;
* ``repair-rename``: `results.repair` rewriting a journal that holds a torn line, killed
  between its temporary file and the rename: the journal is the old one, byte for byte.

The resumed writers follow the sweep's protocol (`specjax.runner.sweep._execute_locked`):
the journal's lock, the recorded cell ids (`results.read_all_results`), `results.repair`,
then one `append_result` per cell not recorded. The sweep itself is killed at an append
through its command line in `test_a_sweep_killed_inside_an_append_resumes_to_every_cell_once`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from specjax.runner import results

REPO = Path(__file__).resolve().parent.parent
CELLS = 12  # cells of the light sweep
KILLS_PER_POINT = 4
APPEND_POINTS = ["before-write", "mid-write", "after-write", "after-fsync"]
POINTS = [*APPEND_POINTS, "repair-rename"]  # 5 points x 4 kills = 20 kills

# The writer: installs the kill point, then runs a light sweep over the results journal,
# the sweep's command line, or a script.
_HOOKED = r"""
import os, runpy, signal, sys

point, nth, target, mode, *rest = sys.argv[1:]
nth, target = int(nth), os.path.abspath(target)
real_open, real_write, real_fsync, real_replace = os.open, os.write, os.fsync, os.replace
armed, seen = set(), [0, 0]  # the n-th append's descriptor; appends and renames so far


def die():
    os.kill(os.getpid(), signal.SIGKILL)


def hooked_open(path, flags, mode=0o777, *, dir_fd=None):
    fd = real_open(path, flags, mode, dir_fd=dir_fd)
    if flags & os.O_APPEND and os.path.abspath(path) == target:
        seen[0] += 1
        if seen[0] == nth:
            armed.add(fd)
    return fd


def hooked_write(fd, data):
    if fd in armed and point == "before-write":
        die()
    if fd in armed and point == "mid-write":
        data = bytes(data)
        real_write(fd, data[: len(data) // 2])
        die()
    return real_write(fd, data)


def hooked_fsync(fd):
    if fd in armed and point == "after-write":
        die()
    real_fsync(fd)
    if fd in armed and point == "after-fsync":
        die()


def hooked_replace(src, dst, **kw):
    if point.endswith("-rename") and os.path.abspath(dst) == target:
        seen[1] += 1
        if seen[1] == nth:
            die()  # the temporary file written and fsynced, not renamed
    return real_replace(src, dst, **kw)


os.open, os.write, os.fsync, os.replace = hooked_open, hooked_write, hooked_fsync, hooked_replace

if mode == "light":  # the sweep's resume protocol on the journal, no model, no jax
    from pathlib import Path
    from specjax.runner import results

    workdir, cells = Path(rest[0]), int(rest[1])
    journal = results.results_path(workdir)
    with results.journal_lock(journal):
        done = {r["cell_id"] for r in results.read_all_results(workdir) if "cell_id" in r}
        results.repair(journal)
        for k in range(cells):
            if f"c{k:02d}" not in done:
                results.append_result(journal, ROW(k))
elif mode == "module":
    sys.argv = [rest[0], *rest[1:]]
    runpy.run_module(rest[0], run_name="__main__", alter_sys=True)
else:
    sys.argv = rest
    sys.path.insert(0, os.path.dirname(os.path.abspath(rest[0])))
    runpy.run_path(rest[0], run_name="__main__")
"""


# Cell k's row (long enough that half a line is a real fragment), in the writer and here.
_ROW_SOURCE = """
def ROW(k):
    return {"cell_id": f"c{k:02d}", "k": k, "acceptance": k / 10, "pad": "x" * (20 + 7 * k)}
"""
_namespace: dict = {}
exec(_ROW_SOURCE, _namespace)  # pylint: disable=exec-used
_row = _namespace["ROW"]


@pytest.fixture(name="hooked")
def fixture_hooked(tmp_path) -> Path:
    script = tmp_path / "hooked.py"
    script.write_text(_ROW_SOURCE + _HOOKED)
    return script


def _run(hooked: Path, point: str, nth: int, target: Path, *args: str, env=None):
    return subprocess.run(
        [sys.executable, str(hooked), point, str(nth), str(target), *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "JAX_PLATFORMS": "cpu", **(env or {})},
    )


def _torn_lines(path: Path) -> int:
    """Lines of the raw file that are not whole JSON objects (a fragment at the end too)."""
    data = path.read_bytes() if path.exists() else b""
    lines = data.split(b"\n")
    torn = 1 if lines.pop() else 0
    for raw in lines:
        try:
            torn += not isinstance(json.loads(raw), dict)
        except ValueError:
            torn += 1
    return torn


def _check_rows(journal: Path, expected: list[str]) -> list[dict]:
    """The reader's rows are exactly `expected`, in order, once each, each row whole."""
    rows = results.read_results(journal)
    ids = [r["cell_id"] for r in rows]
    assert ids == expected, "lost or duplicated rows"
    assert all(r == _row(r["k"]) and r["cell_id"] == f"c{r['k']:02d}" for r in rows), "torn"
    return rows


def _visible(workdir: Path) -> set[str]:
    return {p.name for p in workdir.iterdir() if not p.name.startswith(".")}


@pytest.mark.parametrize("point", POINTS)
def test_a_kill_at_an_append_boundary_loses_tears_and_duplicates_nothing(tmp_path, hooked, point):
    """4 kills at `point` (the n-th append of a resumed run, n = 1..4), each followed by the
    reader; then a resume that runs to the end: every cell's row whole, once."""
    workdir = tmp_path / "run"
    workdir.mkdir()
    journal = results.results_path(workdir)
    expected: list[str] = []  # the cells the reader must return, in file order
    setup_kills = 0
    for i in range(KILLS_PER_POINT):
        nth = i + 1
        if point == "repair-rename":
            # A torn line for the repair to remove: a writer killed in mid-write first.
            out = _run(hooked, "mid-write", nth, journal, "light", str(workdir), str(CELLS))
            assert out.returncode == -signal.SIGKILL, out.stderr
            setup_kills += 1
            todo = [f"c{k:02d}" for k in range(CELLS) if f"c{k:02d}" not in expected]
            expected += todo[: nth - 1]
            _check_rows(journal, expected)
            assert _torn_lines(journal) == 1
            before = journal.read_bytes()
            nth_here = 1  # a run repairs once
        else:
            nth_here = nth
        todo = [f"c{k:02d}" for k in range(CELLS) if f"c{k:02d}" not in expected]
        out = _run(hooked, point, nth_here, journal, "light", str(workdir), str(CELLS))
        assert out.returncode == -signal.SIGKILL, out.stderr
        if point == "repair-rename":
            assert journal.read_bytes() == before, "the journal changed under a killed repair"
            assert any(p.name.startswith(f".{journal.name}.") for p in workdir.iterdir())
            torn = 1
        else:
            kept = nth_here if point in ("after-write", "after-fsync") else nth_here - 1
            expected += todo[:kept]
            torn = 1 if point == "mid-write" else 0
        rows = _check_rows(journal, expected)
        assert _torn_lines(journal) == torn
        assert _visible(workdir) == {journal.name}  # no temporary under a real name
        where = "the repair's rename" if point == "repair-rename" else f"append #{nth_here}"
        print(
            f"kill {i + 1}/{KILLS_PER_POINT} at {point}, {where}: "
            f"{len(rows)} rows whole, {torn} torn line(s) for the resume to drop"
        )

    before_ids = set(expected)
    out = _run(hooked, "none", 0, journal, "light", str(workdir), str(CELLS))
    assert out.returncode == 0, out.stderr
    all_ids = [f"c{k:02d}" for k in range(CELLS)]
    rows = _check_rows(journal, expected + [c for c in all_ids if c not in before_ids])
    assert sorted(r["cell_id"] for r in rows) == all_ids  # 0 lost, 0 duplicated
    assert _torn_lines(journal) == 0  # 0 torn: the resume repaired the file
    assert journal.read_bytes().endswith(b"\n")
    setup = f" (+{setup_kills} mid-write kills to tear a line first)" if setup_kills else ""
    print(
        f"{point}: {KILLS_PER_POINT} kills{setup}; "
        f"resume redid {CELLS - len(before_ids)} row(s); 0 torn, 0 duplicated, 0 lost"
    )


@pytest.mark.parametrize("point,nth", [("mid-write", 3), ("after-write", 2)])
def test_a_sweep_killed_inside_an_append_resumes_to_every_cell_once(tmp_path, hooked, point, nth):
    """The sweep's command line (the toy experiment, 8 cells) killed inside its nth append,
    then resumed by the same command: every cell's row once, whole; the kill's row redone
    only when it was not written."""
    workdir = tmp_path / "run"
    journal = results.results_path(workdir)
    args = ["--config=tests/configs/toy.py:runlocal,report=false", f"--workdir={workdir}"]
    out = _run(hooked, point, nth, journal, "module", "specjax.main", *args)
    assert out.returncode == -signal.SIGKILL, out.stderr
    kept = results.read_results(journal)
    assert len(kept) == (nth if point == "after-write" else nth - 1)
    assert _torn_lines(journal) == (1 if point == "mid-write" else 0)

    out = _run(hooked, "none", 0, journal, "module", "specjax.main", *args)
    assert out.returncode == 0, out.stderr
    rows = results.read_results(journal)
    ids = [r["cell_id"] for r in rows]
    assert len(ids) == len(set(ids)) == 8  # 0 duplicated, 0 lost
    assert rows[: len(kept)] == kept  # the rows written before the kill, untouched
    assert _torn_lines(journal) == 0
    print(f"sweep killed at {point} of append #{nth}: {len(kept)} rows kept, 8 after the resume")


def test_a_script_killed_during_its_final_write_keeps_the_old_file(tmp_path, hooked):
    """experiments/score_ratio.py killed between its result's temporary file and the rename
    (`results.atomic_write_text` via `provenance.write_json`): the old score_ratio.json is
    intact, byte for byte, and the temporary is not under the real name."""
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    target = out_dir / "score_ratio.json"
    old = b'{"old": "result"}\n'
    target.write_bytes(old)
    args = ["--sizes=64:1", "--blocks=3", "--context=16", "--capacity=64", f"--out={out_dir}"]
    out = _run(hooked, "final-rename", 1, target, "script", "experiments/score_ratio.py", *args)
    assert out.returncode == -signal.SIGKILL, out.stderr
    assert target.read_bytes() == old
    assert _visible(out_dir) == {"score_ratio.json"}
    temps = [p for p in out_dir.iterdir() if p.name.startswith(".score_ratio.json.")]
    assert len(temps) == 1 and json.loads(temps[0].read_text())["rows"]  # the new, unrenamed
    print("score_ratio.py killed before the rename of score_ratio.json: the old file intact")
