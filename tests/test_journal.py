"""PlanJournal: append-only, exactly-once commits of plan steps (SPEC §5)."""

from __future__ import annotations

import errno
import json
import os

import numpy as np
import pytest

from specjax.policy import journal
from specjax.policy.consensus import decide
from specjax.policy.journal import PlanJournal, run_step_exactly_once


def _lines(path):
    with open(path, "rb") as f:
        return f.read().split(b"\n")


class TestJournal:
    def test_commit_exactly_once(self, tmp_path):
        path = tmp_path / "run" / "journal.jsonl"
        with PlanJournal(path) as j:
            assert j.commit("p", 0, "step zero\n", {"fallback": False}) is True
            assert j.commit("p", 0, "step zero\n", {"other": 1}) is False  # meta not compared
            with pytest.raises(journal.JournalConflictError, match="already committed"):
                j.commit("p", 0, "different")
            with pytest.raises(journal.JournalOrderError, match="before step 1"):
                j.commit("p", 2, "too early")
            assert j.commit("p", 1, "ünïcode ✓") is True
            assert j.commit(7, 0, "int plan id") is True
        lines = _lines(path)
        assert lines[-1] == b"" and len(lines) == 4  # three full lines, newline-terminated
        records = [json.loads(line) for line in lines[:-1]]
        assert [(r["plan_id"], r["step_index"]) for r in records] == [("p", 0), ("p", 1), (7, 0)]
        assert records[0]["text"] == "step zero\n" and records[0]["meta"] == {"fallback": False}

    def test_resume_after_restart(self, tmp_path):
        path = tmp_path / "j.jsonl"
        with PlanJournal(path) as j:
            j.commit("p", 0, "a", {"support": np.float32(0.75), "counts": np.arange(3)})
            j.commit("p", 1, "b")
        with PlanJournal(path) as j:
            assert [s.text for s in j.committed_steps("p")] == ["a", "b"]
            assert j.committed_steps("p")[0].meta == {"support": 0.75, "counts": [0, 1, 2]}
            assert j.next_step("p") == 2 and j.next_step("q") == 0
            assert ("p", 1) in j and len(j) == 2 and j.plan_ids() == ["p"]
            assert j.commit("p", 1, "b") is False
            assert j.commit("p", 2, "c") is True
        assert len(_lines(path)) == 4

    def test_torn_final_line_ignored_and_truncated(self, tmp_path):
        path = tmp_path / "j.jsonl"
        with PlanJournal(path) as j:
            j.commit("p", 0, "a")
        intact = os.path.getsize(path)
        with open(path, "ab") as f:
            f.write(b'{"meta": {}, "plan_id": "p", "step_in')  # a crash mid-write
        with PlanJournal(path) as j:
            assert j.recovered_torn_bytes > 0
            assert os.path.getsize(path) == intact
            assert [s.text for s in j.committed_steps("p")] == ["a"]
            j.commit("p", 1, "b")
        assert [json.loads(x)["text"] for x in _lines(path)[:-1]] == ["a", "b"]

    def test_corrupt_middle_line(self, tmp_path):
        path = tmp_path / "j.jsonl"
        path.write_bytes(b'not json\n{"plan_id": "p", "step_index": 0, "text": "a", "meta": {}}\n')
        with pytest.raises(journal.JournalCorruptError, match=":1: unreadable"):
            PlanJournal(path)
        path.write_bytes(b'{"plan_id": "p", "step_index": 1, "text": "a", "meta": {}}\n')
        with pytest.raises(journal.JournalCorruptError, match="precedes step 0"):
            PlanJournal(path)

    def test_one_writer(self, tmp_path):
        path = tmp_path / "j.jsonl"
        with PlanJournal(path):
            with pytest.raises(journal.JournalLockedError, match="already open"):
                PlanJournal(path)
        PlanJournal(path).close()  # released on close

    def test_closed_and_bad_input(self, tmp_path):
        j = PlanJournal(tmp_path / "j.jsonl")
        with pytest.raises(ValueError, match="step_index=-1"):
            j.commit("p", -1, "x")
        with pytest.raises(TypeError, match="plan_id"):
            j.commit(None, 0, "x")
        with pytest.raises(TypeError, match="not JSON serialisable"):
            j.commit("p", 0, "x", {"bad": object()})
        assert len(j) == 0 and os.path.getsize(tmp_path / "j.jsonl") == 0
        j.close()
        with pytest.raises(journal.JournalError, match="closed"):
            j.commit("p", 0, "x")

    def test_branch_failure_mid_step_then_retry(self, tmp_path):
        """Three branches vote on each of 4 steps; branch 1 crashes mid-step 2 once."""
        path = tmp_path / "plan.jsonl"
        produced = []
        failures = {"left": 1}

        class BranchFailure(RuntimeError):
            pass

        def branch(b, step):
            if b == 1 and step == 2 and failures["left"]:
                failures["left"] -= 1
                raise BranchFailure("branch 1 died mid-step")
            return f"step {step}"

        def produce_for(step):
            def produce():
                candidates = [branch(b, step) for b in range(3)]
                decision = decide(candidates, [1.0, 1.0, 1.0])
                produced.append(step)
                return decision.committed, {"support": decision.support}

            return produce

        with PlanJournal(path) as j:
            for step in range(4):
                while True:
                    try:
                        run_step_exactly_once(j, "plan-0", step, produce_for(step))
                        break
                    except BranchFailure:
                        assert j.next_step("plan-0") == step  # nothing was written
            assert produced == [0, 1, 2, 3]

        # Restart: everything is journaled, nothing is produced again.
        with PlanJournal(path) as j:
            for step in range(4):
                out = run_step_exactly_once(j, "plan-0", step, produce_for(step))
                assert out.text == f"step {step}"
            assert produced == [0, 1, 2, 3]
        records = [json.loads(x) for x in _lines(path)[:-1]]
        assert [(r["plan_id"], r["step_index"], r["text"]) for r in records] == [
            ("plan-0", i, f"step {i}") for i in range(4)
        ]


# ---------------------------------------------------------------------------------------
# I/O errors: a commit whose write or fsync raised is reconciled, never duplicated
# ---------------------------------------------------------------------------------------


class _Faults:
    """Replaces `os.write` / `os.fsync` as the journal module sees them, failing on cue.

    `plan` maps the n-th call (0-based, per function) to a fault:
      'eio'        raise OSError(EIO) without writing;
      'after'      write the whole line, then raise OSError(EIO);
      'half'       write the first half of the line, then raise OSError(EIO);
      'short'      write the first half and return its length (a short write).
    fsync faults: 'eio' (raise, the data was written).
    """

    def __init__(self, monkeypatch, write=None, fsync=None):
        self.write_plan, self.fsync_plan = dict(write or {}), dict(fsync or {})
        self.n_write = self.n_fsync = 0
        real_write, real_fsync = os.write, os.fsync

        def write(fd, data):
            fault = self.write_plan.get(self.n_write)
            self.n_write += 1
            data = bytes(data)
            if fault == "eio":
                raise OSError(errno.EIO, "injected write error")
            if fault == "after":
                real_write(fd, data)
                raise OSError(errno.EIO, "injected error after the write")
            if fault in ("half", "short"):
                n = real_write(fd, data[: len(data) // 2])
                if fault == "half":
                    raise OSError(errno.EIO, "injected error mid-write")
                return n
            return real_write(fd, data)

        def fsync(fd):
            fault = self.fsync_plan.get(self.n_fsync)
            self.n_fsync += 1
            if fault == "eio":
                raise OSError(errno.EIO, "injected fsync error")
            return real_fsync(fd)

        monkeypatch.setattr(journal.os, "write", write)
        monkeypatch.setattr(journal.os, "fsync", fsync)


def _records(path):
    return [(r["plan_id"], r["step_index"], r["text"]) for r in map(json.loads, _lines(path)[:-1])]


@pytest.mark.parametrize(
    "fault",
    [("fsync", "eio"), ("write", "after"), ("write", "eio"), ("write", "half"), ("write", "short")],
)
def test_io_error_then_retry_commits_exactly_once(tmp_path, monkeypatch, fault):
    """The issue's case: the line reached the disk, fsync raised (EIO), the caller retried."""
    path = tmp_path / "j.jsonl"
    j = PlanJournal(path)
    j.commit("p", 0, "zero")
    kind, what = fault
    _Faults(monkeypatch, **{kind: {0: what}})  # call 0: the commit of step 1
    with pytest.raises(OSError):
        j.commit("p", 1, "one")
    # The retry reconciles: a line on disk is the commit; a torn part is removed first.
    assert j.commit("p", 1, "one") is True
    assert j.commit("p", 1, "one") is False
    j.commit("p", 2, "two")
    j.close()
    assert _records(path) == [("p", 0, "zero"), ("p", 1, "one"), ("p", 2, "two")]
    with PlanJournal(path) as again:  # reopenable, nothing skipped or recovered
        assert [s.text for s in again.committed_steps("p")] == ["zero", "one", "two"]
        assert again.recovered_torn_bytes == 0 and again.skipped_duplicate_lines == 0


def test_io_error_seen_by_a_query_before_the_retry(tmp_path, monkeypatch):
    """`run_step_exactly_once` after an fsync error: the step is journaled, not re-produced."""
    path = tmp_path / "j.jsonl"
    produced = []

    def produce():
        produced.append(1)
        return "text", {}

    with PlanJournal(path) as j:
        _Faults(monkeypatch, fsync={0: "eio"})
        with pytest.raises(OSError, match="injected fsync"):
            run_step_exactly_once(j, "p", 0, produce)
        assert run_step_exactly_once(j, "p", 0, produce).text == "text"
        assert j.next_step("p") == 1
    assert produced == [1] and _records(path) == [("p", 0, "text")]


def test_io_error_then_different_text_is_a_conflict(tmp_path, monkeypatch):
    """The line that reached the disk is the committed step: a different retry conflicts."""
    path = tmp_path / "j.jsonl"
    with PlanJournal(path) as j:
        _Faults(monkeypatch, fsync={0: "eio"})
        with pytest.raises(OSError):
            j.commit("p", 0, "first")
        with pytest.raises(journal.JournalConflictError):
            j.commit("p", 0, "second")
    assert _records(path) == [("p", 0, "first")]


def test_persistent_fsync_error_stays_pending_then_recovers(tmp_path, monkeypatch):
    path = tmp_path / "j.jsonl"
    with PlanJournal(path) as j:
        faults = _Faults(monkeypatch, fsync={0: "eio", 1: "eio", 2: "eio"})
        for _ in range(3):  # the commit, then two retries whose reconciling fsync fails
            with pytest.raises(OSError, match="injected fsync"):
                j.commit("p", 0, "a")
        assert faults.n_write == 1  # written once, never again
        assert j.commit("p", 0, "a") is True
    assert _records(path) == [("p", 0, "a")]


def test_abandoned_after_io_error_reopens_cleanly(tmp_path, monkeypatch):
    """A process that gives up after the error (closes, or dies): the reopened journal holds
    the whole line once, or nothing of a part."""
    for what, expect in (("after", [("p", 0, "a")]), ("half", [])):
        path = tmp_path / f"j_{what}.jsonl"
        with monkeypatch.context() as m:
            j = PlanJournal(path)
            _Faults(m, write={0: what})
            with pytest.raises(OSError):
                j.commit("p", 0, "a")
            j.close()
        with PlanJournal(path) as again:
            assert [(s.plan_id, s.step_index, s.text) for s in again] == expect
            again.commit("p", 0, "a")
        assert _records(path) == [("p", 0, "a")]


def test_duplicate_lines_from_an_old_writer_are_read_once(tmp_path):
    """A journal written by the version without reconciliation is still reopenable."""
    path = tmp_path / "j.jsonl"
    line = b'{"meta": {}, "plan_id": "p", "step_index": 0, "text": "a"}\n'
    path.write_bytes(line + line)
    with PlanJournal(path) as j:
        assert j.skipped_duplicate_lines == 1 and [s.text for s in j] == ["a"]
        j.commit("p", 1, "b")
    path.write_bytes(line + line.replace(b'"a"', b'"b"'))  # same step, other text: corrupt
    with pytest.raises(journal.JournalCorruptError, match="appears twice"):
        PlanJournal(path)


def test_random_io_faults_and_exceptions_keep_every_step_exactly_once(tmp_path, monkeypatch):
    """300 commits of 30 plans × 10 steps under ~100 injected faults of every kind, plus
    exceptions thrown by `produce`; every failure is retried until it succeeds."""
    rng = np.random.default_rng(0)
    path = tmp_path / "j.jsonl"
    kinds = ["eio", "after", "half", "short"]
    write_plan = {
        int(i): kinds[int(k)]
        for i, k in zip(rng.choice(300, 60, replace=False), rng.integers(0, 4, 60))
    }
    fsync_plan = {int(i): "eio" for i in rng.choice(300, 40, replace=False)}
    produced = {}
    failures = 0
    with PlanJournal(path) as j:
        faults = _Faults(monkeypatch, write=write_plan, fsync=fsync_plan)
        order = [(p, s) for s in range(10) for p in rng.permutation(30)]
        for plan, step in order:

            def produce(plan=plan, step=step):
                # Produced again only while its line is not on disk (whole).
                assert (int(plan), step) not in {
                    (r[0], r[1]) for r in _records(path) if len(r) == 3
                }
                if rng.random() < 0.1:
                    raise RuntimeError("a branch died")
                produced[(plan, step)] = produced.get((plan, step), 0) + 1
                return f"plan {plan} step {step}", {"n": step}

            while True:
                try:
                    run_step_exactly_once(j, int(plan), step, produce)
                    break
                except (OSError, RuntimeError):
                    failures += 1
    assert failures >= 100 + 20  # the 100 injected I/O faults, and the branch deaths
    assert faults.n_write > 300  # some writes were retried after a fault before the write
    assert sum(produced.values()) > 300  # writes that did not land were produced again
    recs = _records(path)
    assert sorted(recs) == sorted(
        (p, s, f"plan {p} step {s}") for p in range(30) for s in range(10)
    )
    with PlanJournal(path) as again:
        assert len(again) == 300 and again.skipped_duplicate_lines == 0


_KILLED_WRITER = r"""
import os, signal, sys
from specjax.policy import journal
path, mode = sys.argv[1], sys.argv[2]
j = journal.PlanJournal(path)
n = j.next_step("p")
real_write, real_fsync = os.write, os.fsync
def write(fd, data):
    data = bytes(data)
    if mode == "mid-write":  # die with half the line written
        real_write(fd, data[: len(data) // 2])
        os.kill(os.getpid(), signal.SIGKILL)
    return real_write(fd, data)
def fsync(fd):
    if mode == "before-fsync":  # die with the line written, not fsynced
        os.kill(os.getpid(), signal.SIGKILL)
    return real_fsync(fd)
journal.os.write, journal.os.fsync = write, fsync
j.commit("p", n, f"step {n}")
"""


def test_killed_writers_leave_a_reopenable_journal(tmp_path):
    """Writers killed (SIGKILL) at the two worst moments, deterministically (each kills
    itself there; no sleeps): reopening keeps whole lines once and drops torn ones."""
    import signal  # pylint: disable=import-outside-toplevel
    import subprocess  # pylint: disable=import-outside-toplevel
    import sys  # pylint: disable=import-outside-toplevel

    path = tmp_path / "j.jsonl"
    script = tmp_path / "writer.py"
    script.write_text(_KILLED_WRITER)
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    expected = []
    for i, mode in enumerate(["before-fsync", "mid-write"] * 5):
        out = subprocess.run(
            [sys.executable, str(script), str(path), mode],
            cwd=repo,
            capture_output=True,
            timeout=120,
        )
        assert out.returncode == -signal.SIGKILL, out.stderr
        with PlanJournal(path) as j:
            if mode == "before-fsync":
                expected.append(j.committed_steps("p")[-1].text)
            else:
                assert j.recovered_torn_bytes > 0
            assert [s.text for s in j.committed_steps("p")] == expected
        assert len(expected) == (i + 2) // 2
    assert _records(path) == [("p", k, f"step {k}") for k in range(5)]
