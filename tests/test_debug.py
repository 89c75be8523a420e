"""specjax.runtime.debug: value checks fire on bad values (inside jit and vmap), stay silent on
good ones, and trace nothing when off."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from specjax.runtime import debug


@pytest.fixture
def checks_on():
    was = debug.enabled()
    debug.set_enabled(True)
    yield
    debug.set_enabled(was)


def _dist_fn(atol=1e-4):
    @jax.jit
    def f(p):
        debug.check_distribution(p, "p", atol)
        return p.sum()

    return f


def test_checks_fire_inside_jit_and_vmap(checks_on):
    f = _dist_fn()
    f(jnp.full((3, 4), 0.25)).block_until_ready()  # a distribution: silent
    for bad in (
        jnp.full((3, 4), 0.3),
        jnp.array([[1.0, 0.0], [jnp.nan, 1.0]]),
        jnp.array([[1.5, -0.5]]),
    ):
        with pytest.raises(Exception, match="not a probability distribution"):
            jax.block_until_ready(f(bad))

    @jax.jit
    def lengths(n):
        debug.check_range(n, 1, 4, "committed")
        return n

    lengths(jnp.array([1, 4])).block_until_ready()
    with pytest.raises(Exception, match=r"committed: outside \[1, 4\]"):
        jax.block_until_ready(lengths(jnp.array([1, 5])))

    rowwise = jax.jit(jax.vmap(lambda x: (debug.check(x > 0, "positive"), x)[1]))
    rowwise(jnp.arange(1, 1000)).block_until_ready()
    with pytest.raises(Exception, match="positive"):
        jax.block_until_ready(rowwise(jnp.arange(0, 1000)))


def test_checks_off_trace_nothing():
    was = debug.enabled()
    debug.set_enabled(False)
    try:
        f = _dist_fn()
        jax.block_until_ready(f(jnp.full((2, 2), 0.9)))  # not checked: no error
        assert "callback" not in str(jax.make_jaxpr(_dist_fn())(jnp.ones((2, 2))))
    finally:
        debug.set_enabled(was)
