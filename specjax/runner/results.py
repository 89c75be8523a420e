"""The results journal: one JSON line per finished cell, safe against a kill at any time.

Choice: **append with one ``os.write`` on an ``O_APPEND`` descriptor, then ``fsync``**,
rather than rewriting the whole file through a temporary file and a rename.

* Cost: an append is O(1) in the number of cells; write-temp-and-rename rewrites the whole
  journal after every cell (O(n²) bytes over a sweep) for no gain in safety.
* Atomicity: a record is encoded first and handed to the kernel in one ``write``; with
  ``O_APPEND`` the kernel places it at the end of the file in one step, so records never
  interleave, even with several writers. A kill (or a short write: disk full) can still
  leave a final fragment with no newline. The rule that makes this safe: **a record is a
  complete JSON line terminated by ``\\n``**; anything else is a torn write, which readers
  skip with a warning. An append after a torn fragment starts with a newline, so the
  fragment can never be glued to the next record (a test of the last byte and one write:
  no truncation, which would race with another writer). After ``fsync`` returns, the
  record survives a power cut too.
* `repair` removes torn lines for good (rewriting the file through a rename); the sweep
  calls it once at start, while it holds `journal_lock`, so a resumed sweep leaves a
  clean file. The lock (``flock``, released by the kernel when the process dies, however
  it dies) also stops two sweeps from running in one workdir at once.
* Multi-host sweeps give each process its own ``results.p{i}.jsonl``, merged at the end.

Whole-file writes that must be atomic (``config.json``, the merged ``results.jsonl`` of a
multi-host sweep, reports) use `atomic_write_text`: temporary file, ``fsync``,
``os.replace`` (`specjax.atomic`, which the layers below the runner use too).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
from pathlib import Path
from typing import Any, Iterable, Iterator

from absl import logging

from specjax.atomic import atomic_write_bytes, atomic_write_text, fsync_dir

__all__ = [
    "RESULTS_NAME",
    "results_path",
    "append_result",
    "repair",
    "journal_lock",
    "read_results",
    "completed_cell_ids",
    "process_journals",
    "read_all_results",
    "merge_results",
    "atomic_write_text",
    "atomic_write_bytes",
    "atomic_write_json",
]

RESULTS_NAME = "results.jsonl"
_PROCESS_FILE_RE = re.compile(r"^results\.p(\d+)\.jsonl$")


def results_path(workdir: str | os.PathLike, process_index: int | None = None) -> Path:
    """``workdir/results.jsonl``, or ``workdir/results.p{i}.jsonl`` for process ``i``."""
    name = RESULTS_NAME if process_index is None else f"results.p{process_index}.jsonl"
    return Path(workdir) / name


def append_result(path: str | os.PathLike, record: dict[str, Any]) -> None:
    """Appends `record` as one JSON line, durably (see the module docstring).

    Raises:
      TypeError: `record` is not JSON-serialisable (nothing is written).
    """
    line = json.dumps(record, separators=(",", ":")) + "\n"
    assert line.count("\n") == 1  # json.dumps escapes newlines inside strings
    path = Path(path)
    created = not path.exists()
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            line = "\n" + line  # terminate a torn fragment (or, racing a writer: a blank line)
        data = memoryview(line.encode("utf-8"))
        while data:  # one write in practice; loop only on a short write
            n = os.write(fd, data)
            data = data[n:]
        os.fsync(fd)
    finally:
        os.close(fd)
    if created:
        fsync_dir(path.parent)


def repair(path: str | os.PathLike) -> int:
    """Removes torn lines (see the module docstring) from a journal; returns how many.

    The file is rewritten through a rename, and only when it holds a torn line. Call it
    only while no other process appends to `path` (hold `journal_lock`).
    """
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return 0
    _, good, torn = _split(data, path, warn=False)
    if torn:
        atomic_write_text(path, "".join(line.decode("utf-8") + "\n" for line in good))
        logging.warning("%s: removed %d torn line(s) left by an interrupted write", path, torn)
    return torn


@contextlib.contextmanager
def journal_lock(path: str | os.PathLike) -> Iterator[None]:
    """Holds an exclusive lock on journal `path` (file ``.<name>.lock`` beside it).

    Raises:
      BlockingIOError: another process holds it (a sweep running in the same workdir).
    """
    path = Path(path)
    fd = os.open(path.with_name(f".{path.name}.lock"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        yield
    finally:
        os.close(fd)  # releases the lock


def read_results(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Every complete record of a journal, in file order ([] if it does not exist).

    Torn lines — an unterminated final fragment, or a terminated line that is not a JSON
    object (a fragment a later append terminated) — are skipped with a warning.
    """
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    return _split(data, path, warn=True)[0]


def _split(data: bytes, path: Path, warn: bool) -> tuple[list[dict[str, Any]], list[bytes], int]:
    """(records, their raw lines, number of torn lines)."""
    lines = data.split(b"\n")
    tail = lines.pop()  # b"" when the file ends with a newline
    records, good, torn = [], [], 0
    if tail:
        torn += 1
        if warn:
            logging.warning(
                "%s: skipping a torn final line (%d bytes, no newline)", path, len(tail)
            )
    for lineno, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        try:
            record = json.loads(raw)
        except (ValueError, RecursionError):  # not JSON, not UTF-8, too deep, huge integer
            record = None
        if not isinstance(record, dict):
            torn += 1
            if warn:
                logging.warning(
                    "%s:%d: skipping a line that is not a JSON object (a torn write): %.60r",
                    path,
                    lineno,
                    raw,
                )
            continue
        records.append(record)
        good.append(raw)
    return records, good, torn


def completed_cell_ids(path: str | os.PathLike | Iterable[str | os.PathLike]) -> set[str]:
    """The ``cell_id`` of every complete record in one journal or several."""
    paths = [path] if isinstance(path, (str, os.PathLike)) else list(path)
    return {r["cell_id"] for p in paths for r in read_results(p) if "cell_id" in r}


def process_journals(workdir: str | os.PathLike) -> list[Path]:
    """The per-process journals ``results.p{i}.jsonl`` of a workdir, by process index."""
    workdir = Path(workdir)
    if not workdir.is_dir():
        return []
    found = [
        (int(m.group(1)), p) for p in workdir.iterdir() if (m := _PROCESS_FILE_RE.match(p.name))
    ]
    return [p for _, p in sorted(found)]


def read_all_results(workdir: str | os.PathLike) -> list[dict[str, Any]]:
    """``results.jsonl`` plus any unmerged per-process journals, one record per cell.

    When a cell appears more than once (a merge interrupted after its rename), the first
    record wins: the main journal first, then the process journals in index order.
    """
    seen: set[str] = set()
    rows = []
    for path in [results_path(workdir), *process_journals(workdir)]:
        for record in read_results(path):
            key = record.get("cell_id")
            if key is not None:
                if key in seen:
                    continue
                seen.add(key)
            rows.append(record)
    return rows


def merge_results(workdir: str | os.PathLike, order: list[str] | None = None) -> list[dict]:
    """Folds the per-process journals into ``results.jsonl`` (atomically) and removes them.

    Args:
      workdir: the run's directory.
      order: cell ids in grid order; records are written in this order, any others after
        them in the order they were read.

    Returns:
      The merged records.
    """
    journals = process_journals(workdir)
    rows = read_all_results(workdir)
    if order is not None:
        rank = {cid: i for i, cid in enumerate(order)}
        rows.sort(key=lambda r: rank.get(r.get("cell_id"), len(rank)))  # stable
    if journals:
        text = "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in rows)
        atomic_write_text(results_path(workdir), text)
        for path in journals:  # after the rename: a crash here only leaves duplicates
            path.unlink(missing_ok=True)
    return rows


def atomic_write_json(path: str | os.PathLike, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2) + "\n")
