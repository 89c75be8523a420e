"""Checkpoints round-trip bit-exactly; missing or damaged ones give a one-line ValueError."""

import json
import os
import warnings

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from specjax.train import checkpoints as ckpt

# When tensorstore reports damaged files, orbax's asyncio runner closes its event loop
# while sibling reads are still in flight; their completion callbacks then hit the closed
# loop from a background thread ("Event loop is closed", reported by pytest as an
# unraisable exception in whichever test runs next). Harmless, and not ours to fix.
pytestmark = pytest.mark.filterwarnings('ignore::pytest.PytestUnraisableExceptionWarning')


def _exact(a, b):
    chex.assert_trees_all_equal_structs(a, b)
    jax.tree.map(
        lambda x, y: (
            np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
            or (np.asarray(x).dtype == np.asarray(y).dtype)
            or pytest.fail('dtype')
        ),
        a,
        b,
    )


def _one_line(excinfo, *needles):
    msg = str(excinfo.value)
    assert '\n' not in msg, msg
    for n in needles:
        assert n in msg, msg


def test_orbax_round_trip_is_bit_exact_and_silent(tmp_path, tiny_lm, tiny_params):
    tx = optax.adamw(1e-3)
    opt_state = tx.init(tiny_params)
    grads = jax.tree.map(jnp.ones_like, tiny_params)
    _, opt_state = tx.update(grads, opt_state, tiny_params)  # non-trivial moments
    d = str(tmp_path / 'run')
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        ckpt.save(d, 3, tiny_params, opt_state, metadata={'note': 'x', 'losses': [1.5, 2.25]})
        ckpt.save(d, 7, tiny_params)
        assert ckpt.latest_step(d) == 7
        out = ckpt.restore(
            d,
            tiny_lm.abstract_params(),
            step=3,
            opt_state_abstract=jax.eval_shape(tx.init, tiny_lm.abstract_params()),
        )
    assert out['step'] == 3 and out['metadata'] == {'note': 'x', 'losses': [1.5, 2.25]}
    _exact(out['params'], tiny_params)
    _exact(out['opt_state'], opt_state)
    assert ckpt.restore(d, tiny_params)['step'] == 7  # latest; arrays work as the abstract
    with pytest.raises(ValueError) as e:
        ckpt.save(d, 7, tiny_params)
    _one_line(e, 'step 7 already exists')


def test_orbax_missing_and_corrupt(tmp_path, tiny_lm, tiny_params):
    abstract = tiny_lm.abstract_params()
    missing = str(tmp_path / 'nothing')
    assert ckpt.latest_step(missing) is None
    with pytest.raises(ValueError) as e:
        ckpt.restore(missing, abstract)
    _one_line(e, missing, 'no such directory')
    empty = tmp_path / 'empty'
    empty.mkdir()
    with pytest.raises(ValueError) as e:
        ckpt.restore(str(empty), abstract)
    _one_line(e, str(empty), 'no complete checkpoint')

    d = str(tmp_path / 'run')
    ckpt.save(d, 1, tiny_params)
    with pytest.raises(ValueError) as e:
        ckpt.restore(d, abstract, step=2)
    _one_line(e, 'no step 2', 'available: [1]')
    with pytest.raises(ValueError) as e:
        ckpt.restore(d, abstract, opt_state_abstract={'x': jax.ShapeDtypeStruct((1,), jnp.float32)})
    _one_line(e, "no 'opt_state' item")
    wrong = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct((x.shape[0] + 1,) + x.shape[1:], x.dtype), abstract
    )
    with pytest.raises(ValueError) as e:
        ckpt.restore(d, wrong)
    _one_line(
        e,
        os.path.join(d, '1'),
        'params/embed is stored as float32[32, 32], requested float32[33, 32]',
    )

    # The recorded sha256 is checked after orbax has read the data.
    meta = os.path.join(d, '1', 'metadata', 'metadata')
    record = json.load(open(meta))
    good = record['_sha256']['params']
    record['_sha256']['params'] = '0' * 64
    json.dump(record, open(meta, 'w'))
    with pytest.raises(ValueError) as e:
        ckpt.restore(d, abstract)
    _one_line(e, os.path.join(d, '1'), 'params data is corrupt (sha256 mismatch)')
    record['_sha256']['params'] = good
    json.dump(record, open(meta, 'w'))
    _exact(ckpt.restore(d, abstract)['params'], tiny_params)

    # Damage every data file of the params item: orbax errors or the sha256 check fires.
    for root, _, files in os.walk(os.path.join(d, '1', 'params')):
        for f in files:
            if '/d' in root or f == 'manifest.ocdbt':
                p = os.path.join(root, f)
                data = bytearray(open(p, 'rb').read())
                data[len(data) // 2] ^= 0xFF
                open(p, 'wb').write(bytes(data))
    with pytest.raises(ValueError) as e:
        ckpt.restore(d, abstract)
    _one_line(e, os.path.join(d, '1'))


def test_params_file_round_trip_bit_exact(tmp_path, tiny_lm, tiny_params):
    p = str(tmp_path / 'model.npz')
    digest = ckpt.save_params_file(p, tiny_params)
    loaded = ckpt.load_params_file(p, tiny_lm.abstract_params(), expected_sha256=digest)
    _exact(loaded, tiny_params)
    # bfloat16 survives as its exact bit pattern.
    bf = {'w': jnp.asarray(np.random.default_rng(0).normal(size=(3, 5)), jnp.bfloat16)}
    ckpt.save_params_file(p, bf)
    _exact(ckpt.load_params_file(p, bf), bf)


def test_params_file_missing_corrupt_and_mismatched(tmp_path, tiny_lm, tiny_params):
    abstract = tiny_lm.abstract_params()
    p = str(tmp_path / 'model.npz')
    with pytest.raises(ValueError) as e:
        ckpt.load_params_file(p, abstract)
    _one_line(e, p, 'no such file')
    digest = ckpt.save_params_file(p, tiny_params)
    with pytest.raises(ValueError) as e:
        ckpt.load_params_file(p, abstract, expected_sha256='0' * 64)
    _one_line(e, p, 'not the expected')
    with pytest.raises(ValueError) as e:
        ckpt.load_params_file(p, {'embed': abstract['embed']})
    _one_line(e, p, 'unexpected')
    raw = open(p, 'rb').read()
    open(p, 'wb').write(raw[: len(raw) // 2])  # truncated
    with pytest.raises(ValueError) as e:
        ckpt.load_params_file(p, abstract)
    _one_line(e, p, 'corrupt')
    # One flipped byte inside the array data: the zip CRC or the sha256 catches it.
    data = bytearray(raw)
    data[len(data) // 3] ^= 0x01
    open(p, 'wb').write(bytes(data))
    with pytest.raises(ValueError) as e:
        ckpt.load_params_file(p, abstract, expected_sha256=digest)
    _one_line(e, p)
