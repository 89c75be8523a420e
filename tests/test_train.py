"""Training: the loss falls on a toy stream; a killed run resumes bit-exactly."""

import os
import signal
import subprocess
import sys
import textwrap

import chex
import jax
import numpy as np
import optax
import pytest

from specjax.train.loop import TrainConfig, eval_loss, sample_windows, train


def _toy_stream(n, vocab=32, seed=0):
    """A noisy cycle: token t+1 = token t + 1 (mod 16) with probability 0.9, else random."""
    rng = np.random.default_rng(seed)
    out = np.empty(n, np.int32)
    out[0] = 0
    for i in range(1, n):
        out[i] = (out[i - 1] + 1) % 16 if rng.random() < 0.9 else rng.integers(vocab)
    return out


TRAIN, HELD_OUT = _toy_stream(4000, seed=0), _toy_stream(400, seed=1)
SMALL = dict(
    batch_size=8, seq_len=16, learning_rate=1e-2, warmup_steps=3, eval_max_tokens=256, log_every=5
)


def test_config_validation_names_field_value_and_range():
    with pytest.raises(
        ValueError, match=r'TrainConfig.warmup_steps=20: must be an integer in \[0, steps=10\]'
    ):
        TrainConfig(steps=10, warmup_steps=20)
    with pytest.raises(ValueError, match=r'TrainConfig.b2=1.0'):
        TrainConfig(b2=1.0)
    with pytest.raises(ValueError, match=r'TrainConfig.time_budget_s=0'):
        TrainConfig(time_budget_s=0)


def test_windows_depend_on_seed_and_step_only():
    a = sample_windows(TRAIN, 4, 8, seed=3, step=7)
    np.testing.assert_array_equal(a, sample_windows(TRAIN, 4, 8, seed=3, step=7))
    assert a.shape == (4, 9) and not np.array_equal(a, sample_windows(TRAIN, 4, 8, 3, 8))


def test_eval_loss_is_mean_nll_over_consecutive_windows(tiny_lm, tiny_params):
    tokens = _toy_stream(20, seed=2)
    expected, count = 0.0, 0
    full = jax.jit(tiny_lm.logits_full)
    for start in range(0, 19, 8):
        w = tokens[start : start + 9][None]
        logits = full(tiny_params, w[:, :-1])
        nll = optax.softmax_cross_entropy_with_integer_labels(logits, w[:, 1:])
        expected, count = expected + float(nll.sum()), count + nll.size
    got = eval_loss(tiny_lm, tiny_params, tokens, seq_len=8, batch_size=2)
    np.testing.assert_allclose(got, expected / count, rtol=1e-6)


def test_loss_decreases_on_toy_stream(tiny_lm):
    cfg = TrainConfig(steps=40, eval_every=20, **SMALL)
    params, hist = train(tiny_lm, cfg, TRAIN, HELD_OUT)
    assert hist['step'] == list(range(1, 41)) and hist['stopped'] == 'steps'
    assert np.mean(hist['loss'][-5:]) < hist['loss'][0] - 1.0, hist['loss']
    assert hist['eval_step'] == [20, 40]
    assert hist['eval_loss'][-1] < np.log(tiny_lm.vocab_size) - 1.0
    np.testing.assert_allclose(
        hist['eval_loss'][-1], eval_loss(tiny_lm, params, HELD_OUT, 16, max_tokens=256), rtol=1e-6
    )
    assert hist['lr'][0] == 0.0 and max(hist['lr']) == pytest.approx(1e-2)


class _Killed(Exception):
    pass


def _kill_at(n):
    def callback(step, metrics):
        if step == n:
            raise _Killed

    return callback


def test_resume_after_kill_reproduces_uninterrupted_run(tmp_path, tiny_lm):
    cfg = TrainConfig(steps=12, eval_every=6, checkpoint_every=4, **SMALL)
    ref_params, ref = train(tiny_lm, cfg, TRAIN, HELD_OUT, workdir=str(tmp_path / 'ref'))

    run = str(tmp_path / 'run')
    with pytest.raises(_Killed):  # dies after step 10; the last checkpoint is step 8
        train(tiny_lm, cfg, TRAIN, HELD_OUT, workdir=run, callback=_kill_at(10))
    params, hist = train(tiny_lm, cfg, TRAIN, HELD_OUT, workdir=run)

    assert hist['resumed_from'] == 8 and hist['final_step'] == 12
    for key in ('step', 'loss', 'grad_norm', 'lr', 'eval_step', 'eval_loss'):
        assert hist[key] == ref[key], key  # identical floats, not just close
    chex.assert_trees_all_equal(params, ref_params)
    # A finished run resumed again does nothing.
    again, hist2 = train(tiny_lm, cfg, TRAIN, HELD_OUT, workdir=run)
    assert hist2['resumed_from'] == 12 and hist2['loss'] == ref['loss']
    chex.assert_trees_all_equal(again, ref_params)


def test_time_budget_stops_and_checkpoints(tmp_path, tiny_lm):
    cfg = TrainConfig(steps=1000, time_budget_s=1e-6, **SMALL)
    _, hist = train(tiny_lm, cfg, TRAIN, HELD_OUT, workdir=str(tmp_path))
    assert hist['stopped'] == 'time_budget' and hist['final_step'] == 1
    assert hist['eval_step'] == [1]
    from specjax.train.checkpoints import latest_step

    assert latest_step(str(tmp_path / 'checkpoints')) == 1


@pytest.mark.slow
def test_resume_after_sigkill_of_the_process(tmp_path, tiny_lm, tiny_config):
    """A real kill -9 of a training process mid-run (no cleanup runs)."""
    cfg = TrainConfig(steps=12, checkpoint_every=4, **SMALL)
    _, ref = train(tiny_lm, cfg, TRAIN, workdir=str(tmp_path / 'ref'))
    run = str(tmp_path / 'run')
    script = textwrap.dedent(f'''
        import os, signal
        from tests.test_train import TRAIN, SMALL
        from specjax.models.api import TransformerLM
        from specjax.models.transformer import TransformerConfig
        from specjax.train.loop import TrainConfig, train
        def die(step, metrics):
            if step == 10:
                os.kill(os.getpid(), signal.SIGKILL)
        lm = TransformerLM(TransformerConfig(**{tiny_config.to_dict()!r}))
        train(lm, TrainConfig(steps=12, checkpoint_every=4, **SMALL), TRAIN, workdir={run!r},
              callback=die)
    ''')
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, 'PYTHONPATH': root, 'JAX_PLATFORMS': 'cpu'}
    proc = subprocess.run(
        [sys.executable, '-c', script],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    _, hist = train(tiny_lm, cfg, TRAIN, workdir=run)
    assert hist['resumed_from'] == 8
    assert hist['loss'] == ref['loss']
