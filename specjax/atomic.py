"""Whole-file writes that a kill cannot tear: a temporary file in the same directory,
flushed and fsynced, then ``os.replace`` onto the real name (and the directory fsynced).

At every moment the real name holds the old file or the new one, whole; a kill leaves at
most a hidden temporary ``.<name>.<random>.tmp`` beside it, which no reader opens. An error
removes the temporary and leaves the old file. Every writer of a file others read (results,
pages, checkpoints, npz arrays, tokenizers, exported folders) goes through here; the results
journal's appends are `specjax.runner.results.append_result`.

A folder (a zoo) is published the same way, by renames (`publish_dir`; `recover_dir`
undoes what a kill left).

The file gets the permissions a plain ``open(path, 'w')`` would give (``0o666`` less the
umask), not ``mkstemp``'s ``0o600``.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
from pathlib import Path
from typing import IO, Iterator

__all__ = [
    "atomic_file",
    "atomic_write_bytes",
    "atomic_write_text",
    "backup_name",
    "fsync_dir",
    "publish_dir",
    "recover_dir",
    "temp_name",
]


def temp_name(path: str | os.PathLike) -> Path:
    """A fresh hidden name beside `path`: ``.<name>.<random>.tmp``."""
    path = Path(path)
    return path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike, mode: str = "wb") -> Iterator[IO]:
    """Yields a file open on a temporary beside `path`; on a clean exit it is flushed,
    fsynced and renamed onto `path`, on an exception removed (`path` untouched).

    Args:
      path: the file to write; its directory must exist.
      mode: ``"wb"`` or ``"w"`` (text, UTF-8).
    """
    if mode not in ("wb", "w"):
        raise ValueError(f"atomic_file: mode={mode!r}; allowed: 'wb' or 'w'")
    path = Path(path)
    while True:
        tmp = temp_name(path)
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
            break
        except FileExistsError:  # pragma: no cover - 48 random bits collided
            continue
    try:
        with os.fdopen(fd, mode, **({"encoding": "utf-8"} if mode == "w" else {})) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Writes `data` to `path` atomically (see the module docstring)."""
    with atomic_file(path, "wb") as f:
        f.write(data)


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Writes `text` (UTF-8) to `path` atomically (see the module docstring)."""
    atomic_write_bytes(path, text.encode("utf-8"))


def fsync_dir(path: str | os.PathLike) -> None:
    """Makes a rename or a creation in directory `path` durable (where supported)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # not supported on every filesystem
    finally:
        os.close(fd)


# ----------------------------------------------------------------------------------------
# Folders: a new one replaces the old one with renames
# ----------------------------------------------------------------------------------------


def staged_name(out: Path) -> Path:
    """Where `publish_dir` stages the new folder, complete, beside `out`."""
    return out.parent / f".{out.name}.new"


def backup_name(out: Path) -> Path:
    """Where `publish_dir` keeps the old folder while the new one is renamed in."""
    return out.parent / f".{out.name}.old"


def _same_filesystem(a: Path, b: Path) -> bool:
    return a.stat().st_dev == b.stat().st_dev


def _fsync_tree(root: Path) -> None:
    """Every file under `root` and every directory on disk (a power cut keeps the folder)."""
    for dirpath, _, filenames in os.walk(root):
        for name in filenames + ["."]:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            except OSError:
                pass  # a directory fsync is not supported everywhere
            finally:
                os.close(fd)


def publish_dir(work: Path, out: Path) -> None:
    """Moves the folder built at `work` to `out`, replacing the folder there, with renames,
    so that a kill at any moment leaves a complete folder at `out` or, for the instant
    between two renames, the old one at `backup_name` (`recover_dir`, run before the next
    publish, renames it back):

    1. the new folder goes beside `out` as `staged_name` (a rename on the same
       filesystem, else a copy), fsynced;
    2. the old folder, if any, is renamed `backup_name`;
    3. the staged folder is renamed `out`;
    4. the backup is removed.

    An error (not a kill) before step 3 puts the old folder back and removes the staged one.
    """
    work, out = Path(work), Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    recover_dir(out)
    staged, backup = staged_name(out), backup_name(out)
    if _same_filesystem(work, out.parent):
        os.rename(work, staged)
    else:
        shutil.copytree(work, staged)
    moved_old = False
    try:
        _fsync_tree(staged)
        if out.exists() or out.is_symlink():
            os.rename(out, backup)
            moved_old = True
        os.rename(staged, out)
    except BaseException:
        if moved_old and not out.exists():
            os.rename(backup, out)
        shutil.rmtree(staged, ignore_errors=True)
        raise
    fsync_dir(out.parent)
    shutil.rmtree(backup, ignore_errors=True)
    shutil.rmtree(work, ignore_errors=True)  # what a copy left behind


def recover_dir(out: Path) -> bool:
    """Undoes what a kill during `publish_dir` left: the old folder renamed back to `out`
    when `out` is missing (returns True), else removed; a staged new folder removed."""
    out = Path(out)
    staged, backup = staged_name(out), backup_name(out)
    restored = False
    if backup.exists():
        if out.exists() or out.is_symlink():
            shutil.rmtree(backup, ignore_errors=True)  # killed after the new one was in
        else:
            os.rename(backup, out)  # killed between the two renames: the old one back
            fsync_dir(out.parent)
            restored = True
    if staged.exists():
        shutil.rmtree(staged, ignore_errors=True)
    return restored
