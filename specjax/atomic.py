"""Whole-file writes that a kill cannot tear: a temporary file in the same directory,
flushed and fsynced, then ``os.replace`` onto the real name (and the directory fsynced).

At every moment the real name holds the old file or the new one, whole; a kill leaves at
most a hidden temporary ``.<name>.<random>.tmp`` beside it, which no reader opens. An error
removes the temporary and leaves the old file. Every writer of a file others read (results,
pages, checkpoints, npz arrays, tokenizers, exported folders) goes through here; the results
journal's appends are `specjax.runner.results.append_result`.

The file gets the permissions a plain ``open(path, 'w')`` would give (``0o666`` less the
umask), not ``mkstemp``'s ``0o600``.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path
from typing import IO, Iterator

__all__ = ["atomic_file", "atomic_write_bytes", "atomic_write_text", "fsync_dir", "temp_name"]


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
