"""A persistent XLA compilation cache for the CLI, the tests and the notebook.

On a CPU most of a short run is compilation (tens of seconds per engine configuration),
and `make reproduce`, `make test` and the notebook compile the same programs. The cache
lives in `$SPECJAX_COMPILE_CACHE` (default `~/.cache/specjax/xla`); set it to an empty
string to disable it. A value that names no usable directory (a file, a path under a
file, an unwritable place, ``~nosuchuser/...``) is refused by the command-line entry
points before anything runs (`check_dir`, through `specjax.runner.cli.ENV_VARS`); the
default directory, when unusable (a read-only home), just runs uncached.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

ENV = "SPECJAX_COMPILE_CACHE"


def check_dir(value: str) -> bool | str:
    """True when `value` (a ``$SPECJAX_COMPILE_CACHE`` value) is empty or names a directory
    that exists and is writable or can be created; else why not (a short reason)."""
    if not value:
        return True
    try:
        path = Path(value).expanduser()
    except RuntimeError:
        return f"{value.split('/', 1)[0]} does not expand: no such user or home directory"
    try:
        for p in [path, *path.parents]:
            if p.exists() or p.is_symlink():
                if not p.is_dir():
                    return f"{p} is not a directory"
                os.rmdir(tempfile.mkdtemp(prefix=".specjax-probe-", dir=p))
                return True
    except (OSError, ValueError) as e:
        return f"not writable: {getattr(e, 'strerror', None) or e}"
    return "no part of the path exists"


def cache_dir() -> str | None:
    """The cache's directory: ``$SPECJAX_COMPILE_CACHE`` if set (None when empty), else
    ``~/.cache/specjax/xla`` (None when there is no home directory)."""
    value = os.environ.get(ENV)
    if value is not None:
        if not value:
            return None
        try:
            return str(Path(value).expanduser())
        except RuntimeError:
            return None
    try:
        return str(Path.home() / ".cache" / "specjax" / "xla")
    except RuntimeError:  # no home directory: run uncached
        return None


def enable() -> str | None:
    """Turns the cache on (idempotent); returns its directory or None when disabled."""
    path = cache_dir()
    if not path:
        return None
    import jax  # pylint: disable=import-outside-toplevel

    try:
        Path(path).mkdir(parents=True, exist_ok=True)
        jax.config.update("jax_compilation_cache_dir", path)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
    except (OSError, AttributeError):  # read-only home or an old jax: run uncached
        return None
    return path
