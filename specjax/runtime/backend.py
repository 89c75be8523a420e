"""The platform programs are traced for: the process's backend, or a compile target.

A few choices in the model code are per backend (on XLA:CPU, 16-bit gathers and scatters
go through uint16 bits and one-row half-precision products are padded to two rows; on a
TPU neither helps). They are keyed on `platform()`, not on ``jax.default_backend()``: a
process that compiles for compile-only TPU devices (`specjax.tpu`) runs on the CPU, and
inside `tracing_for('tpu')` its programs are traced as a TPU would run them.

JAX caches traces by function and argument types, not by this setting, so
`tracing_for` clears JAX's in-memory caches on entry and on exit: a program traced for
one platform is never reused for another.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

import jax

__all__ = ['PLATFORMS', 'platform', 'tracing_for']

PLATFORMS = ('cpu', 'gpu', 'tpu')

_TARGET: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    'specjax_target_platform', default=None
)


def platform() -> str:
    """'cpu', 'gpu' or 'tpu': the compile target while tracing for one, else the backend."""
    target = _TARGET.get()
    if target is not None:
        return target
    backend = jax.default_backend()
    return 'gpu' if backend in ('cuda', 'rocm', 'gpu') else backend


@contextlib.contextmanager
def tracing_for(target: str) -> Iterator[None]:
    """Programs traced inside are traced for ``target`` (one of `PLATFORMS`)."""
    if target not in PLATFORMS:
        raise ValueError(f'tracing_for: target={target!r}; allowed: one of {PLATFORMS}')
    jax.clear_caches()
    token = _TARGET.set(target)
    try:
        yield
    finally:
        _TARGET.reset(token)
        jax.clear_caches()
