"""Value checks in the code paths (SPEC §9): on behind a flag, free when off.

Shape checks are `chex` asserts at trace time and always on. *Value* checks (finite
probabilities, rows summing to one, committed lengths within ``[1, γ + 1]``, caches rolled
back) need the values, so inside ``jit`` they are a host callback that raises: that costs a
device→host transfer, so they are traced only when checks are enabled.

Enable them with ``SPECJAX_CHECKS=1`` in the environment (the test suite does, in
``tests/conftest.py``) or `set_enabled(True)` before the functions are first traced. The
flag is read at trace time: a function compiled with checks off stays unchecked, and
``SPECJAX_CHECKS`` is part of nothing that is cached on disk, since a checked program's HLO
differs from an unchecked one.

Usage, inside or outside ``jit``::

    from specjax.runtime import debug
    debug.check(jnp.all(jnp.isfinite(p)), 'probabilities are not finite')
    debug.check_distribution(p, 'verifier p')
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from specjax.errors import env_value

__all__ = [
    'CheckFailedError',
    'enabled',
    'set_enabled',
    'check',
    'check_distribution',
    'check_range',
]

#: None: ``$SPECJAX_CHECKS``, read at the first check traced (never at import: a bad value
#: is a ConfigError naming the variable there); `set_enabled` sets it.
_ENABLED: bool | None = None


class CheckFailedError(AssertionError):
    """A value check in a code path failed (only raised when checks are enabled)."""


def enabled() -> bool:
    """Whether value checks are traced into the functions traced from now on."""
    global _ENABLED
    if _ENABLED is None:
        _ENABLED = bool(env_value('SPECJAX_CHECKS'))
    return _ENABLED


def set_enabled(flag: bool) -> None:
    """Switches value checks on or off for functions traced from now on."""
    global _ENABLED
    _ENABLED = bool(flag)


def _raise_if_false(ok, message: str) -> None:
    if not bool(np.all(np.asarray(ok))):
        raise CheckFailedError(message)


def check(pred, message: str) -> None:
    """Raises `CheckFailedError` (wrapped by JAX's runtime error inside ``jit``) where
    ``pred`` is not all True; nothing is traced when checks are off.

    Under ``vmap`` (the rules are written for one row and vmapped) the check is made once
    for the whole batch, not once per row: a plain ``jax.debug.callback`` would be called
    100,000 times for a 100,000-row batch.
    """
    if not enabled():
        return
    _checker(message)(jnp.all(jnp.asarray(pred)))


@functools.lru_cache(maxsize=None)
def _checker(message: str):
    """A per-message check whose batching rule reduces the batch to one callback."""

    @jax.custom_batching.custom_vmap
    def checked(pred):
        jax.debug.callback(_raise_if_false, pred, message=message, ordered=False)
        return pred

    @checked.def_vmap
    def _batched(axis_size, in_batched, pred):  # pylint: disable=unused-argument
        return jnp.broadcast_to(checked(jnp.all(pred)), (axis_size,)), True

    return checked


def check_distribution(p, what: str, atol: float = 1e-4, *, allow_zero_rows: bool = False) -> None:
    """``p: f32[..., V]``: finite, non-negative, each row summing to 1 within ``atol``
    (or, with ``allow_zero_rows``, exactly 0: padding rows)."""
    if not enabled():
        return
    p = jnp.asarray(p)
    total = jnp.sum(p, axis=-1)
    row_ok = jnp.abs(total - 1.0) <= atol
    if allow_zero_rows:
        row_ok = row_ok | (total == 0)
    ok = jnp.all(jnp.isfinite(p)) & jnp.all(p >= 0) & jnp.all(row_ok)
    check(
        ok,
        f'{what}: not a probability distribution (non-finite, negative, or a row '
        f'not summing to 1 within {atol})',
    )


def check_range(x, lo, hi, what: str) -> None:
    """Every element of ``x`` within ``[lo, hi]`` (bounds may be arrays that broadcast)."""
    if not enabled():
        return
    x = jnp.asarray(x)
    check(jnp.all((x >= lo) & (x <= hi)), f'{what}: outside [{lo}, {hi}]')
