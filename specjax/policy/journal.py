"""The plan journal: each committed plan step appended exactly once (SPEC §5).

Committing a plan step is a side effect, so it goes through an append-only JSON-lines
file with these guarantees:

* **exactly once** — `commit` of a `(plan_id, step_index)` already in the journal is a
    no-op (returns False) when the text is the same and raises `JournalConflictError` when
    it differs; steps of a plan are committed in order, 0, 1, 2, … (no gaps);
* **atomic lines** — each step is one full line written by a single `os.write` on an
    `O_APPEND` descriptor, then `fsync`ed before `commit` returns;
* **crash recovery** — a torn final line (a crash mid-write, no trailing newline) is
    ignored and truncated away when the journal is opened; everything before it is intact;
* **I/O errors** — when ``write`` or ``fsync`` raises, the line may or may not have reached
    the disk (whole, in part, or not at all), and `commit` re-raises without recording the
    step. The journal remembers the offset the line was written at, and before anything
    else (the retry's `commit`, `get`, `next_step`, ...) *reconciles*: it reads the file back
    from that offset; a whole line is the step committed (fsynced again, then recorded, so
    the retry does not write it twice), a part of one is truncated away. A journal is
    always reopenable: a torn final line is dropped, and a step that appears twice *with
    the same text* (written by a version without reconciliation) is read once;
* **resume** — reopening the file restores every committed step; `run_step_exactly_once`
    returns a journaled step without producing it again.

One writer per file: the journal holds an exclusive `flock` on it while open, so a second
`PlanJournal` on the same path (in this or another process) fails instead of racing.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Iterator
from typing import Any

try:
    import fcntl
except ImportError:  # Not POSIX: no cross-process lock, the rest still holds.
    fcntl = None

PlanId = str | int


class JournalError(RuntimeError):
    """Base class of the journal's errors."""


class JournalConflictError(JournalError):
    """A step already committed is committed again with a different text."""


class JournalOrderError(JournalError):
    """A step is committed before the steps preceding it in its plan."""


class JournalCorruptError(JournalError):
    """A line other than the last cannot be read (not a torn write: real corruption)."""


class JournalLockedError(JournalError):
    """Another open `PlanJournal` holds the file."""


@dataclasses.dataclass(frozen=True)
class CommittedStep:
    """One journaled plan step."""

    plan_id: PlanId
    step_index: int
    text: str
    meta: dict[str, Any]

    def to_json(self) -> str:
        record = {
            "plan_id": self.plan_id,
            "step_index": self.step_index,
            "text": self.text,
            "meta": self.meta,
        }
        return json.dumps(record, ensure_ascii=False, sort_keys=True, default=_json_default)


def _json_default(obj):
    # numpy / jax scalars and arrays in `meta` (counters, weights) become plain JSON.
    if hasattr(obj, "tolist"):
        return obj.tolist()
    raise TypeError(f"{type(obj).__name__} is not JSON serialisable")


def _validate_key(plan_id, step_index) -> None:
    if isinstance(plan_id, bool) or not isinstance(plan_id, (str, int)):
        raise TypeError(f"plan_id={plan_id!r} is not allowed; allowed: a str or an int.")
    if isinstance(step_index, bool) or not isinstance(step_index, int) or step_index < 0:
        raise ValueError(f"step_index={step_index!r} is not allowed; allowed: an int ≥ 0.")


class PlanJournal:
    """Append-only JSON-lines journal of committed plan steps (see the module docstring).

    Args:
        path: the journal file; created (with its directory) if missing.
        fsync: fsync after every commit (default). Turning it off keeps atomic lines but
            loses durability across a power cut; only for tests and benchmarks.

    Usable as a context manager; `close()` releases the file.
    """

    def __init__(self, path: str | os.PathLike, *, fsync: bool = True):
        self.path = os.fspath(path)
        self._fsync = fsync
        self._steps: dict[tuple[PlanId, int], CommittedStep] = {}
        self._order: list[CommittedStep] = []
        self._next: dict[PlanId, int] = {}
        #: bytes of a torn final line removed when the journal was opened (0 if none).
        self.recovered_torn_bytes = 0
        #: identical repeated lines skipped when the journal was opened (0 if none).
        self.skipped_duplicate_lines = 0
        # (entry, offset, line bytes) of a commit whose write or fsync raised: reconciled
        # against the file before the journal is used again.
        self._pending: tuple[CommittedStep, int, bytes] | None = None
        directory = os.path.dirname(os.path.abspath(self.path))
        os.makedirs(directory, exist_ok=True)
        existed = os.path.exists(self.path)
        self._fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            self._lock()
            if not existed and fsync:
                _fsync_directory(directory)  # The new file's directory entry is durable too.
            self._load()
        except BaseException:
            os.close(self._fd)
            self._fd = -1
            raise

    # ---------------------------------------------------------------- open / close

    def _lock(self) -> None:
        if fcntl is None:
            return
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise JournalLockedError(
                f"plan journal {self.path} is already open in another PlanJournal; close it "
                "first (one writer per journal)."
            ) from None

    def _load(self) -> None:
        size = os.fstat(self._fd).st_size
        data = os.pread(self._fd, size, 0) if size else b""
        if data and not data.endswith(b"\n"):
            keep = data.rfind(b"\n") + 1
            self.recovered_torn_bytes = len(data) - keep
            os.ftruncate(self._fd, keep)
            os.fsync(self._fd)
            data = data[:keep]
        elif data and self._fsync:
            # A line whose fsync raised before a crash may sit only in the page cache.
            os.fsync(self._fd)
        for line_no, line in enumerate(data.splitlines(), start=1):
            try:
                record = json.loads(line)
                entry = CommittedStep(
                    plan_id=record["plan_id"],
                    step_index=record["step_index"],
                    text=record["text"],
                    meta=record.get("meta", {}),
                )
                _validate_key(entry.plan_id, entry.step_index)
            except (ValueError, KeyError, TypeError) as exc:
                raise JournalCorruptError(
                    f"{self.path}:{line_no}: unreadable journal line ({exc}); only a torn final "
                    "line is recovered automatically."
                ) from None
            expected = self._next.get(entry.plan_id, 0)
            seen = self._steps.get((entry.plan_id, entry.step_index))
            if seen is not None and seen.text == entry.text:
                # The same step twice with the same text: a retry after an I/O error by a
                # journal without reconciliation. The text is not in doubt; read it once.
                self.skipped_duplicate_lines += 1
                continue
            if entry.step_index != expected:
                what = (
                    "appears twice" if entry.step_index < expected else f"precedes step {expected}"
                )
                raise JournalCorruptError(
                    f"{self.path}:{line_no}: step {entry.step_index} of plan {entry.plan_id!r} "
                    f"{what}."
                )
            self._index(entry)

    def _index(self, entry: CommittedStep) -> None:
        self._steps[(entry.plan_id, entry.step_index)] = entry
        self._order.append(entry)
        self._next[entry.plan_id] = entry.step_index + 1

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)  # Closing the descriptor releases the flock.
            self._fd = -1

    @property
    def closed(self) -> bool:
        return self._fd < 0

    def __enter__(self) -> PlanJournal:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    # ---------------------------------------------------------------- commit

    def commit(
        self, plan_id: PlanId, step_index: int, text: str, meta: dict[str, Any] | None = None
    ) -> bool:
        """Appends a committed step, exactly once.

        Args:
            plan_id: the plan (str or int).
            step_index: the step within the plan; must be the plan's next step
                (`next_step(plan_id)`) unless already committed.
            text: the committed step text.
            meta: JSON-serialisable details (numpy/jax values are converted); not compared
                when the step is already committed.

        Returns:
            True if the step was written now; False if it was already committed with this text.

        Raises:
            JournalConflictError: the step was committed with a different text.
            JournalOrderError: an earlier step of the plan is not committed yet.
        """
        if self.closed:
            raise JournalError(f"plan journal {self.path} is closed.")
        reconciled = self._settle()
        _validate_key(plan_id, step_index)
        if not isinstance(text, str):
            raise TypeError(f"text={text!r} is not allowed; allowed: a str.")
        existing = self._steps.get((plan_id, step_index))
        if existing is not None:
            if existing.text == text:
                # The retry of a commit that raised after its line reached the disk counts
                # as the write (the caller never saw it succeed); any other repeat is a no-op.
                return reconciled is existing
            raise JournalConflictError(
                f"step {step_index} of plan {plan_id!r} is already committed as "
                f"{_preview(existing.text)}; refusing to commit {_preview(text)} over it."
            )
        expected = self.next_step(plan_id)
        if step_index != expected:
            raise JournalOrderError(
                f"step {step_index} of plan {plan_id!r} cannot be committed before step "
                f"{expected}; steps are committed in order."
            )
        entry = CommittedStep(plan_id, step_index, text, dict(meta or {}))
        try:
            line = (entry.to_json() + "\n").encode("utf-8")
        except TypeError as exc:
            raise TypeError(f"meta of step {step_index} of plan {plan_id!r}: {exc}") from None
        offset = os.fstat(self._fd).st_size  # One writer (flock): the line goes here.
        self._pending = (entry, offset, line)
        written = os.write(self._fd, line)  # One write on O_APPEND: the line lands whole.
        if written != len(line):
            # A short write (disk full) left a torn line: reconciled before the next use.
            raise OSError(
                f"short write to plan journal {self.path} ({written} of {len(line)} bytes); "
                "the torn line is removed before the journal is used again (or reopened)."
            )
        if self._fsync:
            os.fsync(self._fd)
        self._pending = None
        self._index(entry)
        return True

    def _settle(self) -> CommittedStep | None:
        """Reconciles a commit whose write or fsync raised (see the module docstring).

        Returns:
            The pending step if its line turned out to be on disk (now fsynced and
            recorded), else None.

        Raises:
            OSError: reading back, truncating or fsyncing failed again (still pending).
            JournalCorruptError: the bytes after the offset are not (a part of) the line.
        """
        if self._pending is None:
            return None
        entry, offset, line = self._pending
        size = os.fstat(self._fd).st_size
        data = os.pread(self._fd, max(size - offset, 0), offset) if size > offset else b""
        if data == line:
            if self._fsync:
                os.fsync(self._fd)
            self._pending = None
            self._index(entry)
            return entry
        if not line.startswith(data):
            raise JournalCorruptError(
                f"{self.path}: after a failed commit at byte {offset}, the file holds "
                f"{len(data)} bytes that are not the line being written; reopen it to "
                "recover what is readable."
            )
        if data:  # A part of the line: remove it, durably, before anything is appended.
            os.ftruncate(self._fd, offset)
            if self._fsync:
                os.fsync(self._fd)
        self._pending = None
        return None

    # ---------------------------------------------------------------- queries

    # Every query reconciles a pending commit first, so that a step whose line reached the
    # disk is seen as committed (`run_step_exactly_once` does not produce it again).

    def _settled(self) -> None:
        if self._pending is not None and not self.closed:
            self._settle()

    def get(self, plan_id: PlanId, step_index: int) -> CommittedStep | None:
        self._settled()
        return self._steps.get((plan_id, step_index))

    def committed_steps(self, plan_id: PlanId) -> list[CommittedStep]:
        """The plan's committed steps, in step order (0, 1, …)."""
        self._settled()
        return [self._steps[(plan_id, i)] for i in range(self._next.get(plan_id, 0))]

    def next_step(self, plan_id: PlanId) -> int:
        """The first step of the plan not yet committed (where a resumed run continues)."""
        self._settled()
        return self._next.get(plan_id, 0)

    def plan_ids(self) -> list[PlanId]:
        """Plans with at least one committed step, in order of first commit."""
        self._settled()
        return list(self._next)

    def __iter__(self) -> Iterator[CommittedStep]:
        """Every committed step, in file (commit) order."""
        self._settled()
        return iter(list(self._order))

    def __len__(self) -> int:
        self._settled()
        return len(self._order)

    def __contains__(self, key: tuple[PlanId, int]) -> bool:
        self._settled()
        return key in self._steps

    def __repr__(self) -> str:
        return f"PlanJournal({self.path!r}, {len(self._order)} steps)"


def run_step_exactly_once(
    journal: PlanJournal,
    plan_id: PlanId,
    step_index: int,
    produce: Callable[[], tuple[str, dict[str, Any]]],
) -> CommittedStep:
    """Produces and commits one plan step, unless it is already journaled.

    If the step is in the journal it is returned and `produce` is not called (resume after
    a restart). Otherwise `produce()` runs the step (branches, consensus, fallback) and
    returns `(text, meta)`, which is committed. If `produce` raises — a branch failing
    mid-step — nothing is written and the exception propagates; calling again retries the
    step, which is then committed once.

    Returns:
        The committed step.
    """
    existing = journal.get(plan_id, step_index)
    if existing is not None:
        return existing
    text, meta = produce()
    journal.commit(plan_id, step_index, text, meta)
    return journal.get(plan_id, step_index)


def _preview(text: str, limit: int = 60) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "…")


def _fsync_directory(directory: str) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return  # Some platforms cannot open directories; the file's own fsync still holds.
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
