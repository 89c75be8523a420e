"""Next-token training of any LM with ``logits_full`` (the zoo's transformers).

AdamW with linear warm-up and cosine decay, global-norm gradient clipping, a jitted step
over plain pytrees (params, opt_state), batches of random windows from a 1-D token array,
periodic held-out evaluation, orbax checkpoints with resume, and a wall-clock budget.

Reproducibility: the batch of step ``s`` is drawn from ``numpy.random.default_rng((seed,
s))``, so it depends on the seed and the step only. A run killed at any point and
restarted with the same arguments resumes from its last checkpoint and produces the same
losses, bit for bit, as a run that was never interrupted (tested).

Usage::

    params, history = train(lm, TrainConfig(steps=2000), train_tokens, eval_tokens,
                            workdir='runs/verifier')
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import os
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from specjax.train import checkpoints

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Hyperparameters of one training run."""

    steps: int = 1000  # optimizer steps in total (a resumed run continues to it)
    batch_size: int = 32  # windows per step
    seq_len: int = 128  # predicted tokens per window (<= the model's max_len)
    learning_rate: float = 3e-3  # peak learning rate, reached after warm-up
    warmup_steps: int = 100  # linear warm-up from 0 (<= steps)
    final_lr_ratio: float = 0.1  # cosine decay ends at learning_rate * final_lr_ratio
    weight_decay: float = 0.1  # AdamW decoupled decay, on matrices only (not norms)
    b1: float = 0.9  # Adam first-moment decay
    b2: float = 0.95  # Adam second-moment decay
    grad_clip: float = 1.0  # global gradient-norm clip
    eval_every: int = 0  # steps between held-out evaluations (0: at the end only)
    eval_max_tokens: int = 65_536  # held-out tokens scored per evaluation (a prefix)
    eval_batch_size: int = 8  # windows per evaluation batch
    checkpoint_every: int = 0  # steps between checkpoints (0: at the end only); needs workdir
    keep_checkpoints: int = 3  # newest checkpoints kept on disk
    seed: int = 0  # batch sampling, and the initialisation if no params given
    time_budget_s: float | None = None  # stop (and checkpoint) after this many seconds
    log_every: int = 50  # steps between loss fetches / log lines

    def __post_init__(self):
        def need(field, ok, allowed):
            if not ok:
                raise ValueError(f'TrainConfig.{field}={getattr(self, field)!r}: must be {allowed}')

        def is_int(v):
            return isinstance(v, (int, np.integer)) and not isinstance(v, bool)

        for f in (
            'steps',
            'batch_size',
            'seq_len',
            'eval_max_tokens',
            'eval_batch_size',
            'keep_checkpoints',
            'log_every',
        ):
            need(f, is_int(getattr(self, f)) and getattr(self, f) >= 1, 'an integer >= 1')
        for f in ('eval_every', 'checkpoint_every'):
            need(
                f,
                is_int(getattr(self, f)) and getattr(self, f) >= 0,
                'an integer >= 0 (0: at the end)',
            )
        need(
            'warmup_steps',
            is_int(self.warmup_steps) and 0 <= self.warmup_steps <= self.steps,
            f'an integer in [0, steps={self.steps}]',
        )
        need('seed', is_int(self.seed), 'an integer')
        need('learning_rate', self.learning_rate > 0, '> 0')
        need('final_lr_ratio', 0 <= self.final_lr_ratio <= 1, 'in [0, 1]')
        need('weight_decay', self.weight_decay >= 0, '>= 0')
        need('b1', 0 <= self.b1 < 1, 'in [0, 1)')
        need('b2', 0 <= self.b2 < 1, 'in [0, 1)')
        need('grad_clip', self.grad_clip > 0, '> 0')
        need(
            'time_budget_s',
            self.time_budget_s is None or self.time_budget_s > 0,
            'None or > 0 seconds',
        )


# ----------------------------------------------------------------------------------------
# Optimizer and step
# ----------------------------------------------------------------------------------------


def lr_schedule(config: TrainConfig) -> optax.Schedule:
    return optax.warmup_cosine_decay_schedule(
        init_value=0.0,
        peak_value=config.learning_rate,
        warmup_steps=config.warmup_steps,
        decay_steps=config.steps,
        end_value=config.learning_rate * config.final_lr_ratio,
    )


def make_optimizer(config: TrainConfig) -> optax.GradientTransformation:
    decay_mask = functools.partial(jax.tree.map, lambda x: x.ndim > 1)  # no decay on norms
    return optax.chain(
        optax.clip_by_global_norm(config.grad_clip),
        optax.adamw(
            lr_schedule(config),
            b1=config.b1,
            b2=config.b2,
            weight_decay=config.weight_decay,
            mask=decay_mask,
        ),
    )


def next_token_loss(lm, params, windows: jax.Array, mask: jax.Array | None = None):
    """Mean next-token cross-entropy (nats) of ``windows: i32[B, S + 1]``.

    With ``mask: f32[B, S]`` returns ``(sum of masked losses, number counted)`` instead.
    """
    logits = lm.logits_full(params, windows[:, :-1])
    nll = optax.softmax_cross_entropy_with_integer_labels(logits, windows[:, 1:])
    if mask is None:
        return nll.mean()
    return (nll * mask).sum(), mask.sum()


def _global_norm(tree) -> jax.Array:
    return jnp.sqrt(sum(jnp.sum(jnp.square(x.astype(jnp.float32))) for x in jax.tree.leaves(tree)))


_OPTIMIZER_FIELDS = (
    'steps',
    'learning_rate',
    'warmup_steps',
    'final_lr_ratio',
    'weight_decay',
    'b1',
    'b2',
    'grad_clip',
)


def _optimizer_only(config: TrainConfig) -> TrainConfig:
    """``config`` with every field the update does not depend on at its default, so runs
    that differ only in logging, evaluation, checkpoints or seed share one compilation."""
    return TrainConfig(**{f: getattr(config, f) for f in _OPTIMIZER_FIELDS})


@functools.partial(jax.jit, static_argnums=(0, 1), donate_argnums=(2, 3))
def _train_step(lm, config: TrainConfig, params, opt_state, windows):
    tx = make_optimizer(config)
    loss, grads = jax.value_and_grad(functools.partial(next_token_loss, lm))(params, windows)
    updates, opt_state = tx.update(grads, opt_state, params)
    params = optax.apply_updates(params, updates)
    return params, opt_state, {'loss': loss, 'grad_norm': _global_norm(grads)}


def make_train_step(lm, config: TrainConfig) -> Callable:
    """``step(params, opt_state, windows) -> (params, opt_state, {'loss', 'grad_norm'})``:
    one jitted AdamW update (params and opt_state are donated)."""
    return functools.partial(_train_step, lm, _optimizer_only(config))


def sample_windows(tokens: np.ndarray, batch_size: int, seq_len: int, seed: int, step: int):
    """i32[batch_size, seq_len + 1] random windows of ``tokens``; a function of (seed, step)."""
    n = len(tokens) - seq_len - 1
    if n < 0:
        raise ValueError(
            f'training tokens: {len(tokens)} tokens are fewer than one window of '
            f'seq_len+1={seq_len + 1}'
        )
    starts = np.random.default_rng((seed, step)).integers(0, n + 1, size=batch_size)
    return tokens[starts[:, None] + np.arange(seq_len + 1)[None, :]].astype(np.int32)


# ----------------------------------------------------------------------------------------
# Evaluation
# ----------------------------------------------------------------------------------------


@functools.partial(jax.jit, static_argnums=0)
def _masked_nll(lm, params, windows, mask):
    return next_token_loss(lm, params, windows, mask)


def eval_loss(
    lm,
    params,
    tokens,
    seq_len: int | None = None,
    batch_size: int = 8,
    max_tokens: int | None = None,
) -> float:
    """Held-out next-token loss in nats/token over a 1-D token array.

    The array (its first ``max_tokens + 1`` tokens if given) is cut into consecutive
    windows of ``seq_len`` predictions (default: the model's ``max_len``), so every
    token after the first is predicted exactly once, each with the context since the start
    of its window. Padding keeps one compiled shape.
    """
    tokens = np.asarray(tokens)
    if max_tokens is not None:
        tokens = tokens[: max_tokens + 1]
    n_pred = len(tokens) - 1
    if n_pred < 1:
        raise ValueError(f'eval_loss: need at least 2 tokens, got {len(tokens)}')
    S = min(seq_len or lm.max_len, n_pred)
    n_win = math.ceil(n_pred / S)
    n_win_padded = math.ceil(n_win / batch_size) * batch_size
    padded = np.zeros(n_win_padded * S + 1, np.int32)
    padded[: len(tokens)] = tokens
    idx = np.arange(n_win_padded)[:, None] * S + np.arange(S + 1)[None, :]
    windows = padded[idx]
    mask = (idx[:, 1:] <= n_pred).astype(np.float32)
    total, count = 0.0, 0.0
    for i in range(0, n_win_padded, batch_size):
        s, c = _masked_nll(
            lm,
            params,
            jnp.asarray(windows[i : i + batch_size]),
            jnp.asarray(mask[i : i + batch_size]),
        )
        total += float(s)
        count += float(c)
    return total / count


# ----------------------------------------------------------------------------------------
# The loop
# ----------------------------------------------------------------------------------------


def _empty_history() -> dict[str, Any]:
    return {'step': [], 'loss': [], 'grad_norm': [], 'lr': [], 'eval_step': [], 'eval_loss': []}


def train(
    lm,
    config: TrainConfig,
    train_tokens,
    eval_tokens=None,
    *,
    workdir: str | None = None,
    params=None,
    callback: Callable[[int, dict], None] | None = None,
):
    """Trains ``lm`` on a token stream; resumes from ``workdir`` if it holds checkpoints.

    Args:
      lm: any LM with ``logits_full`` and ``init_params`` / ``abstract_params``.
      config: the :class:`TrainConfig`.
      train_tokens, eval_tokens: 1-D integer arrays (eval optional).
      workdir: checkpoints go to ``workdir/checkpoints``; None: no checkpoints, no resume.
      params: initial parameters (default: ``lm.init_params(seed)``); ignored on resume.
      callback: called as ``callback(step, metrics)`` after every step (metrics are device
        scalars); an exception from it stops training (how the tests simulate a kill).

    Returns:
      ``(params, history)``; history has per-step lists ``step``, ``loss``, ``grad_norm``,
      ``lr``, evaluation lists ``eval_step``, ``eval_loss`` (nats/token), and
      ``stopped`` ('steps' | 'time_budget'), ``resumed_from`` (step or None),
      ``final_step``, ``wall_s``, ``tokens_per_s`` (this process's steps only).
    """
    train_tokens = _check_inputs(lm, config, train_tokens, workdir)
    run = _Run.begin(lm, config, workdir, params)
    t0 = time.monotonic()
    stopped, step = 'steps', run.start
    for step in range(run.start + 1, config.steps + 1):
        windows = sample_windows(train_tokens, config.batch_size, config.seq_len, config.seed, step)
        run.params, run.opt_state, metrics = run.step_fn(
            run.params, run.opt_state, jnp.asarray(windows)
        )
        run.pending.append((step, metrics))
        if callback is not None:
            callback(step, metrics)
        if step % config.log_every == 0:
            run.flush()
            log.info('step %d: loss %.4f', step, run.history['loss'][-1])
        out_of_time = (
            config.time_budget_s is not None and time.monotonic() - t0 > config.time_budget_s
        )
        last = step == config.steps or out_of_time
        if (config.eval_every and step % config.eval_every == 0) or last:
            run.evaluate(step, eval_tokens)
        if (config.checkpoint_every and step % config.checkpoint_every == 0) or last:
            run.save(step)
        if out_of_time:
            stopped = 'time_budget'
            break
    run.flush()
    wall = time.monotonic() - t0
    run.history.update(
        stopped=stopped,
        resumed_from=run.resumed_from,
        final_step=step,
        wall_s=wall,
        tokens_per_s=(step - run.start) * config.batch_size * config.seq_len / max(wall, 1e-9),
    )
    return run.params, run.history


def _check_inputs(lm, config: TrainConfig, train_tokens, workdir) -> np.ndarray:
    """The training tokens as a 1-D array, checked against the config and the model."""
    if config.seq_len > lm.max_len:
        raise ValueError(
            f'TrainConfig.seq_len={config.seq_len}: must be <= the model\'s max_len={lm.max_len}'
        )
    if config.checkpoint_every and workdir is None:
        raise ValueError(f'TrainConfig.checkpoint_every={config.checkpoint_every}: needs a workdir')
    train_tokens = np.asarray(train_tokens)
    if train_tokens.ndim != 1 or len(train_tokens) < config.seq_len + 1:
        raise ValueError(
            f'train_tokens: need a 1-D array of >= seq_len+1={config.seq_len + 1} '
            f'tokens, got shape {train_tokens.shape}'
        )
    return train_tokens


@dataclasses.dataclass
class _Run:
    """One training run's state between steps: parameters, optimizer state, history,
    metrics not yet fetched from the device (`pending`) and the last checkpointed step."""

    lm: Any
    config: TrainConfig
    params: Any
    opt_state: Any
    history: dict
    start: int
    resumed_from: int | None
    ckpt_dir: str | None
    step_fn: Callable
    schedule: optax.Schedule
    saved_step: int | None = None
    pending: list = dataclasses.field(default_factory=list)

    @classmethod
    def begin(cls, lm, config: TrainConfig, workdir: str | None, params) -> '_Run':
        """A fresh run (``params`` or ``lm.init_params(seed)``), or the one checkpointed in
        ``workdir``, resumed."""
        tx = make_optimizer(config)
        schedule = lr_schedule(config)
        ckpt_dir = os.path.join(workdir, 'checkpoints') if workdir else None
        history = _empty_history()
        start, resumed_from = 0, None
        if ckpt_dir and checkpoints.latest_step(ckpt_dir) is not None:
            abstract = lm.abstract_params()
            restored = checkpoints.restore(
                ckpt_dir, abstract, opt_state_abstract=jax.eval_shape(tx.init, abstract)
            )
            params, opt_state = restored['params'], restored['opt_state']
            history = restored['metadata'].get('history', history)
            start = resumed_from = restored['step']
            log.info('resumed from %s at step %d', ckpt_dir, start)
        else:
            if params is None:
                params = lm.init_params(jax.random.key(config.seed))
            params = jax.tree.map(jnp.array, params)  # a private copy: the step donates it
            opt_state = tx.init(params)
        return cls(
            lm=lm,
            config=config,
            params=params,
            opt_state=opt_state,
            history=history,
            start=start,
            resumed_from=resumed_from,
            ckpt_dir=ckpt_dir,
            step_fn=make_train_step(lm, config),
            schedule=schedule,
            saved_step=start if resumed_from is not None else None,
        )

    def metadata(self) -> dict:
        """What a checkpoint records besides the arrays: history and both configs."""
        lm = self.lm
        return {
            'history': self.history,
            'train_config': dataclasses.asdict(self.config),
            'model_config': (lm.config.to_dict() if hasattr(lm, 'config') else None),
        }

    def evaluate(self, step: int, eval_tokens) -> None:
        """Held-out loss at this step, into the history (nothing without eval tokens)."""
        if eval_tokens is None:
            return
        c = self.config
        loss = eval_loss(
            self.lm, self.params, eval_tokens, c.seq_len, c.eval_batch_size, c.eval_max_tokens
        )
        self.history['eval_step'].append(step)
        self.history['eval_loss'].append(loss)
        log.info('step %d: eval loss %.4f nats/token', step, loss)

    def flush(self) -> None:
        """The pending steps' metrics fetched (one transfer) into the history."""
        for s, m in jax.device_get(self.pending):
            self.history['step'].append(s)
            self.history['loss'].append(float(m['loss']))
            self.history['grad_norm'].append(float(m['grad_norm']))
            self.history['lr'].append(float(self.schedule(s - 1)))
        self.pending.clear()

    def save(self, step: int) -> None:
        """A checkpoint of this step (once; none without a workdir)."""
        if self.ckpt_dir and self.saved_step != step:
            self.flush()
            checkpoints.save(
                self.ckpt_dir,
                step,
                self.params,
                self.opt_state,
                self.metadata(),
                max_to_keep=self.config.keep_checkpoints,
            )
            self.saved_step = step
