"""A persistent XLA compilation cache for the CLI, the tests and the notebook.

On a CPU most of a short run is compilation (tens of seconds per engine configuration),
and `make reproduce`, `make test` and the notebook compile the same programs. The cache
lives in `$SPECJAX_COMPILE_CACHE` (default `~/.cache/specjax/xla`); set it to an empty
string to disable it. A value that names no usable directory (a file, a path under a
file, an unwritable place, ``~nosuchuser/...``) is refused by the command-line entry
points before anything runs and by `cache_dir` when it is read (`specjax.errors.ENV_VARS`); the
default directory, when unusable (a read-only home), just runs uncached.
"""

from __future__ import annotations

from pathlib import Path

from specjax.errors import dir_problem, env_value

ENV = "SPECJAX_COMPILE_CACHE"


def check_dir(value: str) -> bool | str:
    """True when `value` (a ``$SPECJAX_COMPILE_CACHE`` value) is empty or names a directory
    that exists and is writable or can be created; else why not (a short reason)."""

    return True if not value else (dir_problem(value) or True)


def cache_dir() -> str | None:
    """The cache's directory: ``$SPECJAX_COMPILE_CACHE`` if set (None when empty), else
    ``~/.cache/specjax/xla`` (None when there is no home directory)."""

    value = env_value(ENV)  # a ConfigError naming the variable when it is not allowed
    if value is not None:
        return str(value) if value else None
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
