"""`python -m specjax.main` and `python -m specjax.report` as a user runs them: subprocesses
on the toy experiment (tests/toy_experiment.py, tests/configs/toy.py).

No test depends on a sleep or a kill window: a sweep that must die partway kills itself at
a given cell, and a sweep that must be running waits at a gate file the test opens
(``SPECJAX_TOY_KILL_AT``, ``SPECJAX_TOY_GATE`` in tests/toy_experiment.py). The bad-input
table is tests/test_bad_inputs.py; the few cases here run as subprocesses."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from specjax.runner import grid, results

REPO = Path(__file__).resolve().parent.parent
TOY = "tests/configs/toy.py"


def specjax(
    *args: str,
    module: str = "specjax.main",
    timeout: float = 120,
    env_extra: dict | None = None,
    **popen,
) -> subprocess.CompletedProcess | subprocess.Popen:
    env = {**os.environ, "JAX_PLATFORMS": "cpu", **(env_extra or {})}
    cmd = [sys.executable, "-m", module, *args]
    if popen:
        return subprocess.Popen(cmd, cwd=REPO, env=env, **popen)
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


def toy_cells(arg: str) -> list[dict]:
    import importlib.util  # pylint: disable=import-outside-toplevel

    spec = importlib.util.spec_from_file_location("toy_config", REPO / TOY)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return grid.expand_grid(module.get_config(arg))


def test_sweep_killed_partway_resumes_with_every_cell_exactly_once(tmp_path):
    workdir = tmp_path / "run"
    arg = "runlocal,report=false"
    expected = {c["cell_id"] for c in toy_cells(arg)}
    assert len(expected) == 8
    journal = workdir / "results.jsonl"

    # The sweep kills itself (SIGKILL: a crash, no cleanup) as it starts its 4th cell, so
    # exactly 3 cells are recorded: deterministic, no kill window.
    proc = specjax(
        f"--config={TOY}:{arg}", f"--workdir={workdir}", env_extra={"SPECJAX_TOY_KILL_AT": "4"}
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    done_before = results.completed_cell_ids(journal)
    assert len(done_before) == 3, "killed partway"
    # The worst moment to die: in the middle of writing a line.
    with open(journal, "ab") as f:
        f.write(b'{"cell_id": "torn", "acceptance": {"co')

    out = specjax(f"--config={TOY}:{arg}", f"--workdir={workdir}")
    assert out.returncode == 0, out.stderr

    raw = journal.read_bytes()
    assert raw.endswith(b"\n")
    lines = raw.decode().splitlines()
    ids = [json.loads(line)["cell_id"] for line in lines]  # every line is whole JSON
    assert sorted(ids) == sorted(expected)  # every cell exactly once
    assert done_before <= set(ids)
    assert json.loads((workdir / "summary.json").read_text())["cells"] == 8
    assert "torn line" in out.stderr  # the repair is reported

    # A finished sweep reruns as a no-op.
    again = specjax(f"--config={TOY}:{arg}", f"--workdir={workdir}")
    assert again.returncode == 0, again.stderr
    assert journal.read_bytes() == raw


def _bad_inputs(tmp_path: Path) -> list[tuple[str, list[str], str]]:
    a_file = tmp_path / "a_file"
    a_file.write_text("not a directory")
    wd = f"--workdir={tmp_path / 'run'}"
    return [
        ("unknown field", [f"--config={TOY}:runlocal,nope=1", wd], "nope=1: no such config field"),
        (
            "unknown --config. field",
            [f"--config={TOY}", "--config.nope=1", wd],
            "nope=1: no such config field",
        ),
        (
            "--config. value of the wrong type",
            [f"--config={TOY}", "--config.sleep_s=slow", wd],
            "sleep_s: got 'slow', allowed: a number",
        ),
        (
            "gamma=0 (validate hook)",
            [f"--config={TOY}:grid.gamma=0", wd],
            "grid.gamma: got [0], allowed: integers >= 1",
        ),
        (
            "wrong type",
            [f"--config={TOY}:sleep_s=slow", wd],
            "sleep_s: got 'slow', allowed: a number",
        ),
        (
            "empty grid",
            [f"--config={TOY}:grid={{}}", wd],
            "grid: got {}, allowed: at least one axis",
        ),
        (
            "empty axis",
            [f"--config={TOY}:grid.seed=[]", wd],
            "grid.seed: got [], allowed: a non-empty list",
        ),
        ("workdir is a file", [f"--config={TOY}", f"--workdir={a_file}"], "--workdir: got"),
        ("workdir under a file", [f"--config={TOY}", f"--workdir={a_file}/run"], "is a file"),
        (
            "unknown experiment",
            [f"--config={TOY}:experiment=nope", wd],
            "experiment: got 'nope', allowed: one of",
        ),
        (
            "unknown variant",
            [f"--config={TOY}:runbig", wd],
            "config variant: got 'runbig', allowed: one of 'runlocal'",
        ),
        (
            "missing config file",
            ["--config=tests/configs/nope.py", wd],
            "--config: got 'tests/configs/nope.py'",
        ),
        ("no workdir", [f"--config={TOY}"], "--workdir"),
        ("unknown flag", [f"--config={TOY}", wd, "--bogus"], "Unknown command line flag"),
    ]


def test_bad_input_is_one_error_line_and_writes_nothing(tmp_path):
    for name, args, message in _bad_inputs(tmp_path):
        out = specjax(*args)
        assert out.returncode == 2, (name, out.returncode, out.stderr)
        lines = out.stderr.splitlines()
        assert len(lines) == 1, (name, out.stderr)
        assert lines[0].startswith("specjax: error: "), (name, lines[0])
        assert message in lines[0], (name, lines[0])
        assert "Traceback" not in out.stderr and out.stdout == "", name
        assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file"], name


def test_second_sweep_in_a_running_workdir_is_refused(tmp_path):
    workdir = tmp_path / "run"
    gate = tmp_path / "gate"
    arg = "runlocal,report=false"
    # The first sweep's first cell signals that it runs (so the sweep holds the workdir's
    # lock) and waits for the gate file: the second sweep starts while it surely runs.
    first = specjax(
        f"--config={TOY}:{arg}",
        f"--workdir={workdir}",
        env_extra={"SPECJAX_TOY_GATE": str(gate)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        started = Path(f"{gate}.started")
        deadline = time.monotonic() + 300  # a bound on a hung start, not a timing window
        while not started.exists():
            assert first.poll() is None, first.stderr.read().decode()
            assert time.monotonic() < deadline, "the first sweep never started a cell"
            time.sleep(0.02)
        second = specjax(f"--config={TOY}:{arg}", f"--workdir={workdir}")
        assert second.returncode == 2
        assert second.stderr.splitlines() == [
            f"specjax: error: --workdir: {workdir} is in use by another running sweep (lock on "
            f"results.jsonl held); wait for it or use another workdir"
        ]
        gate.touch()  # let the first sweep finish: it is unharmed
        assert first.wait(timeout=300) == 0
    finally:
        if first.poll() is None:
            first.kill()
            first.wait(timeout=30)
    assert len(results.read_results(workdir / "results.jsonl")) == 8


def test_report_rebuilds_from_results_without_rerunning(tmp_path):
    workdir = tmp_path / "run"
    out = specjax(f"--config={TOY}:runlocal,report=false", f"--workdir={workdir}")
    assert out.returncode == 0, out.stderr
    assert not (workdir / "report.md").exists()
    before = (workdir / "results.jsonl").read_bytes()

    out = specjax(f"--workdir={workdir}", module="specjax.report")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(workdir / "report.md")
    assert (workdir / "results.jsonl").read_bytes() == before  # nothing rerun
    text = (workdir / "report.md").read_text()
    assert text.startswith("# toy: 8 cells") and text.count("\n| `") == 8
    plots = sorted(p.name for p in (workdir / "plots").iterdir())
    assert plots == sorted(
        f"{n}.png"
        for n in (
            "acceptance_vs_gamma",
            "joint_vs_per_drafter",
            "joint_vs_kl",
            "policy_costs",
            "decision_boundary",
            "policies_vs_gamma",
        )
    )

    bad = specjax(f"--workdir={tmp_path / 'missing'}", module="specjax.report")
    assert bad.returncode == 2
    assert bad.stderr.splitlines() == [
        f"specjax: error: --workdir: got '{tmp_path / 'missing'}', allowed: an existing run "
        f"directory"
    ]


def test_console_script_entry_point():
    script = Path(sys.executable).parent / "specjax"
    if not script.exists():
        pytest.skip("specjax console script not installed")
    out = subprocess.run(
        [str(script), f"--config={TOY}:nope=1", "--workdir=/nonexistent/x"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2
    assert out.stderr.startswith("specjax: error: nope=1: no such config field")


_DRIVER = """
import sys, importlib.util
pid, port, workdir = int(sys.argv[1]), sys.argv[2], sys.argv[3]
import jax
jax.distributed.initialize(coordinator_address=f"localhost:{port}", num_processes=2,
                           process_id=pid)
spec = importlib.util.spec_from_file_location("toy_config", "tests/configs/toy.py")
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
from specjax.runner import sweep
rows = sweep.run(module.get_config("runlocal,sleep_s=0.1,report=false"), workdir,
                 progress=False)
print(jax.process_count(), len(rows))
"""


@pytest.mark.slow
def test_two_jax_processes_split_the_cells_and_merge(tmp_path):
    """Real `jax.distributed` on two local CPU processes (barriers over gloo)."""
    import socket  # pylint: disable=import-outside-toplevel

    with socket.socket() as s:
        s.bind(("localhost", 0))
        port = s.getsockname()[1]
    driver = tmp_path / "driver.py"
    driver.write_text(_DRIVER)
    workdir = tmp_path / "run"
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    procs = [
        subprocess.Popen(
            [sys.executable, str(driver), str(i), str(port), str(workdir)],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err
        assert out.splitlines()[-1].split() == ["2", "8"]  # (gloo logs to stdout too)
    rows = results.read_results(workdir / "results.jsonl")
    assert sorted(r["cell_id"] for r in rows) == sorted(
        c["cell_id"] for c in toy_cells("runlocal,sleep_s=0.1,report=false")
    )
    assert sorted(r["process_index"] for r in rows) == [0] * 4 + [1] * 4
    assert not list(workdir.glob("results.p*.jsonl"))
    assert json.loads((workdir / "version.json").read_text())["process_count"] == 2
