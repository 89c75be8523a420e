"""Shared test setup: 8 fake CPU devices (set before JAX is imported) and a tiny model."""

import os

_flag = '--xla_force_host_platform_device_count=8'
if _flag not in os.environ.get('XLA_FLAGS', ''):
    os.environ['XLA_FLAGS'] = (os.environ.get('XLA_FLAGS', '') + ' ' + _flag).strip()
os.environ.setdefault('JAX_PLATFORMS', 'cpu')
# Value checks in the code paths (finite, normalised distributions, committed lengths,
# rollback; SPEC §9, `specjax.runtime.debug`), read at trace time. `make test-all` runs the whole
# suite with them on; `make test` leaves them to the tests that turn them on themselves
# (test_engine's value-check test covers every rule on transformer caches): a checked
# program is larger, carries host callbacks and is never cached on disk (~20% of the run).
os.environ.setdefault('SPECJAX_CHECKS', '0')

import jax  # noqa: E402
import pytest  # noqa: E402

from specjax.runtime import compile_cache  # noqa: E402

compile_cache.enable()  # xdist workers and the subprocess tests share compiled programs

from specjax.models.api import TransformerLM  # noqa: E402
from specjax.models.transformer import TransformerConfig  # noqa: E402

# Tiny but exercising every feature: GQA (4 query heads over 2 KV heads), 2 layers.
TINY = TransformerConfig(
    vocab_size=32, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=64, max_len=32
)


@pytest.fixture(scope='session')
def tiny_config() -> TransformerConfig:
    return TINY


@pytest.fixture(scope='session')
def tiny_lm(tiny_config) -> TransformerLM:
    return TransformerLM(tiny_config)


@pytest.fixture(scope='session')
def tiny_params(tiny_lm):
    return tiny_lm.init_params(jax.random.key(0))
