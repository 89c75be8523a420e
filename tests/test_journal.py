"""PlanJournal: append-only, exactly-once commits of plan steps (SPEC §5)."""

from __future__ import annotations

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
