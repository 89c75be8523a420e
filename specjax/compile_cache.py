"""A persistent XLA compilation cache for the CLI, the tests and the notebook.

On a CPU most of a short run is compilation (tens of seconds per engine configuration),
and `make reproduce`, `make test` and the notebook compile the same programs. The cache
lives in `$SPECJAX_COMPILE_CACHE` (default `~/.cache/specjax/xla`); set it to an empty
string to disable it.
"""
from __future__ import annotations

import os
from pathlib import Path


def enable() -> str | None:
    """Turns the cache on (idempotent); returns its directory or None when disabled."""
    path = os.environ.get("SPECJAX_COMPILE_CACHE",
                          str(Path.home() / ".cache" / "specjax" / "xla"))
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
