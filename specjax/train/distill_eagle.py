"""Training a feature drafter (`specjax.models.eagle`) on the verifier's own hidden states.

Three steps, each a function:

  * `verifier_features` — the verifier's final-normed hidden states over its generations
    (`specjax.train.distill_data.Generated`), one forward per batch of rows: the drafter's inputs and
    regression targets, and (through the verifier's tied head) its exact next-token
    distribution at every position;
  * `train_eagle` — teacher-forced training on the reply positions: smooth-L1 between the
    drafter's output and the verifier's feature, plus the cross-entropy of the drafter's
    head distribution against the verifier's (both over the kept ids). A second pass feeds
    the drafter its own first-pass outputs as features — what it reads from its second
    draft on — so the training sees the drafts' own feature error (EAGLE-3's "training-time
    test", one step of it);
  * `feature_alpha` — Leviathan α (Σ min(p, q), verifier τ = 1) and τ = 0 agreement on
    held-out replies, at draft step 1 (true features) and step 2 (own features).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from specjax.atomic import atomic_file
from specjax.errors import NPZ_ERRORS, unreadable
from specjax.models.api import embedding_table
from specjax.models.eagle import EagleLM, eagle_config
from specjax.models.subset_vocab import most_frequent_ids
from specjax.train import distill_data
from specjax.train.distill import lr_schedule, optimizer
from specjax.train.distill_data import Generated

__all__ = [
    'EagleRecipe',
    'Features',
    'text_rows',
    'verifier_features',
    'initial_eagle',
    'train_eagle',
    'feature_alpha',
    'feature_alpha_positions',
]


@dataclasses.dataclass(frozen=True)
class EagleRecipe:
    """How a feature drafter is trained (recorded in the zoo manifest)."""

    kept: int = 4096  # head rows: the verifier's most frequent ids in the training text
    steps: int = 400
    batch: int = 8
    learning_rate: float = 1e-3
    warmup: int = 30
    weight_decay: float = 0.0
    ce_weight: float = 0.1  # EAGLE: regression + 0.1 · classification
    second_pass: float = 1.0  # weight of the pass that reads its own features (0: off)
    noise: float = 0.1  # uniform noise on the input features, × their RMS (EAGLE: 0.2)
    seed: int = 0
    # The verifier states read (EAGLE-3's low/mid/high; `EagleLM.feature_layers`): () for
    # the final-normed feature alone.
    feature_layers: tuple = ()
    reg_weight: float = 1.0  # weight of the regression on the verifier's final feature
    layers: int = 1  # decoder layers (EAGLE: one)
    # Weight of 1 − Σ min(p, q) over the kept ids (p: the verifier's law renormalised to
    # them): the acceptance rate itself as a loss (DistillSpec's total variation). Its
    # optimum is CE's (q = p on the kept ids); its gradient weighs only the ids where q < p.
    tv_weight: float = 0.0
    # Weight of 1 − the loop's expected acceptance per draft (`specjax.measure.loop_law`): each
    # position's Σ min(p, q_k) weighted by the probability that a rule-1 loop at γ
    # ``loop_gamma`` drafts there at step k, given the row's text (the weights from the
    # drafter's own accept probabilities, held constant): TV where the loop drafts.
    loop_weight: float = 0.0
    loop_gamma: int = 3


@dataclasses.dataclass
class Features:
    """Rows of verifier text and the verifier's features over them.

    tokens: i32[N, W] (right-padded); length: i32[N]; prompt_len: i32[N];
    feats: f16[N, W, D] the verifier's final-normed hidden state at each position;
    states: f16[N, W, n·D] or None: its states at ``layer_ids`` (i32[n]; `TransformerLM.
    forward_hidden`'s ``layers``), each D-slice RMS-normalised (what `EagleLM.
    input_features` does first anyway; half precision cannot hold a raw residual stream).
    """

    tokens: np.ndarray
    length: np.ndarray
    prompt_len: np.ndarray
    feats: np.ndarray
    states: np.ndarray | None = None
    layer_ids: np.ndarray | None = None

    def save(self, path) -> None:
        """Writes the features to ``path`` (.npz) atomically (`specjax.atomic`)."""

        with atomic_file(path) as f:
            np.savez(f, **{k: v for k, v in dataclasses.asdict(self).items() if v is not None})

    @classmethod
    def load(cls, path) -> 'Features':
        """The features `save` wrote to ``path``; a damaged or foreign file is one
        `ConfigError` line naming it."""

        try:
            with np.load(path) as z:
                return cls(**{f.name: z[f.name] for f in dataclasses.fields(cls) if f.name in z})
        except NPZ_ERRORS as e:
            raise unreadable(
                path, e, 'an .npz of features (train_eagle.py --stage=features)'
            ) from None

    @property
    def layers(self) -> tuple:
        """The verifier states held besides the final feature (() for none)."""
        return () if self.layer_ids is None else tuple(int(i) for i in self.layer_ids)

    def inputs(self, layers: tuple) -> np.ndarray:
        """The drafter inputs for a drafter reading ``layers`` (`EagleLM.feature_layers`):
        ``feats`` for (), else those of ``states`` (ValueError unless they are held)."""
        if not layers:
            return self.feats
        if not set(layers) <= set(self.layers):
            raise ValueError(
                f'Features: states of layers {self.layers}, a drafter reading {tuple(layers)} '
                f'(allowed: a subset of the states held)'
            )
        if tuple(layers) == self.layers:
            return self.states
        N, W, _ = self.states.shape
        st = self.states.reshape(N, W, len(self.layers), -1)
        return st[:, :, [self.layers.index(i) for i in layers]].reshape(N, W, -1)

    def take(self, rows) -> 'Features':
        """These rows only (``rows``: indices)."""
        rows = np.asarray(rows, np.int64)
        return dataclasses.replace(
            self,
            tokens=self.tokens[rows],
            length=self.length[rows],
            prompt_len=self.prompt_len[rows],
            feats=self.feats[rows],
            states=None if self.states is None else self.states[rows],
        )

    @classmethod
    def concat(cls, parts) -> 'Features':
        W = max(p.tokens.shape[1] for p in parts)
        pad = lambda a: np.pad(a, ((0, 0), (0, W - a.shape[1])) + ((0, 0),) * (a.ndim - 2))
        if len({p.layers for p in parts}) != 1:
            raise ValueError(f'Features.concat: parts of layers {[p.layers for p in parts]}')
        multi = parts[0].states is not None
        return cls(
            np.concatenate([pad(p.tokens) for p in parts]),
            np.concatenate([p.length for p in parts]),
            np.concatenate([p.prompt_len for p in parts]),
            np.concatenate([pad(p.feats) for p in parts]),
            np.concatenate([pad(p.states) for p in parts]) if multi else None,
            parts[0].layer_ids,
        )

    def reply_mask(self) -> np.ndarray:
        """bool[N, W]: positions t that predict a generated token (P-1 <= t < L-1)."""
        t = np.arange(self.tokens.shape[1])[None, :]
        return (t >= self.prompt_len[:, None] - 1) & (t < self.length[:, None] - 1)


def text_rows(
    model,
    domain: str,
    n: int,
    reply_tokens: int,
    seed: int = 0,
    *,
    prompt_text=None,
    prefix: tuple = (),
) -> Generated:
    """Rows of corpus text in `Generated`'s layout, for `verifier_features`: the ``n``
    train-split prompts `distill_data.domain_prompts` draws with ``seed`` (the same ones the
    verifier answers in `distill_data.generate` with that seed), each in the verifier's chat
    template, then the first ``reply_tokens`` tokens of the text that follows it in its
    document (`distill_data.domain_pairs`) as the reply. Nothing is sampled (``top_ids`` /
    ``top_logp`` hold no entries, ``temperature`` is NaN): the verifier only prefills
    these rows — its law at each position comes from its features — which costs a
    fraction of generating as many (EAGLE-1 trained on fixed text, not the target's).
    ``prompt_text(model, text)`` formats a prompt (default: the chat template) and
    ``prefix`` ids go before it (a base model's BOS)."""

    pairs = distill_data.domain_pairs(domain)
    prompts = distill_data.domain_prompts(domain, n, seed=seed)
    tok = model.tokenizer
    fmt = prompt_text or (lambda m, text: m.chat(text))
    rows = [
        ([*prefix, *tok.encode(fmt(model, p))], tok.encode(pairs[p])[:reply_tokens])
        for p in prompts
        if pairs[p].strip()
    ]
    if not rows:
        raise ValueError(f'text_rows: domain={domain!r} has no text after its prompts')
    return Generated.from_pairs(rows, float('nan'), width=reply_tokens)


def verifier_features(
    model, data: Generated, batch: int = 8, bucket: int = 64, log=print, layers: tuple = ()
):
    """`Features` of ``data``'s rows (prompt + reply) under ``model``'s verifier; with
    ``layers`` also its states there (`Features.states`)."""
    seqs = data.sequences()
    W = -(-max(len(s) for s in seqs) // bucket) * bucket
    if W > model.lm.max_len:
        raise ValueError(f'verifier_features: rows of {W} tokens exceed max_len={model.lm.max_len}')
    N, D = len(seqs), model.lm.config.d_model
    tokens = np.zeros((N, W), np.int32)
    for r, s in enumerate(seqs):
        tokens[r, : len(s)] = s
    layers = tuple(int(i) for i in layers)
    n_st = len(layers)
    feats = np.zeros((N, W, D), np.float16)
    states = np.zeros((N, W, n_st * D), np.float16) if n_st else None

    def run(p, x):
        if not n_st:
            return model.lm.hidden_full(p, x)[1]
        h = model.lm.hidden_full(p, x, layers=(*layers, model.lm.config.n_layers))[1]
        h = h.astype(jnp.float32).reshape(h.shape[:-1] + (n_st + 1, D))
        st = h[..., :n_st, :] * jax.lax.rsqrt(
            jnp.mean(h[..., :n_st, :] ** 2, -1, keepdims=True) + 1e-6
        )
        return jnp.concatenate([h[..., n_st, :], st.reshape(h.shape[:-2] + (n_st * D,))], -1)

    fn = jax.jit(run)
    t0 = time.perf_counter()
    for i in range(0, N, batch):
        x = tokens[i : i + batch]
        n = len(x)
        if n < batch:
            x = np.pad(x, ((0, batch - n), (0, 0)))
        out = np.asarray(fn(model.params, jnp.asarray(x)), np.float32)[:n]
        feats[i : i + n] = out[..., :D]
        if n_st:
            states[i : i + n] = out[..., D:]
        if (i // batch) % 10 == 0:
            log(f'features: {i + n}/{N} rows ({time.perf_counter() - t0:.0f} s)')
    length = np.array([len(s) for s in seqs], np.int32)
    ids = np.asarray(layers, np.int32) if n_st else None
    return Features(tokens, length, np.asarray(data.prompt_len, np.int32), feats, states, ids)


def initial_eagle(
    model, feats: Features, recipe: EagleRecipe, max_len: int = 1024, always: tuple | None = None
):
    """(lm, params): a fresh feature drafter for ``model``'s verifier, its head over the
    ``recipe.kept`` ids most frequent in ``feats``' text, ``always`` among them (default:
    the tokenizer's special tokens; a verifier listing thousands passes its few that
    matter, `specjax.train.verifiers.Verifier.always_kept`)."""
    V = model.lm.vocab_size
    seqs = [feats.tokens[r, : feats.length[r]] for r in range(len(feats.tokens))]
    counts = np.bincount(np.concatenate(seqs), minlength=V)
    if always is None:
        always = tuple(getattr(model.tokenizer, 'special_tokens', {}).values())
    keep = most_frequent_ids(counts, min(recipe.kept, V), always=tuple(int(i) for i in always))
    cfg = eagle_config(
        model.lm.config,
        len(keep),
        n_layers=recipe.layers,
        max_len=max_len,
        dtype='float32',
        param_dtype='float32',
        out_first=False,
    )
    lm = EagleLM(cfg, V, tuple(recipe.feature_layers))
    net = lm.init_net(recipe.seed)
    # The layer starts as a near-identity on the feature half (the residual stream
    # carries fc's output): fc = [small · E-part, I on the feature part].
    D = cfg.d_model
    fc = np.zeros((2 * D, D), np.float32)
    fc[D:] = np.eye(D, dtype=np.float32)
    fc[:D] = np.asarray(net["fc"])[:D] * 0.1
    net['fc'] = jnp.asarray(fc)
    embed = np.asarray(embedding_table(model.lm, model.params), np.float32)
    return lm, lm.attach(net, embed, keep)


def _step_losses(lm: EagleLM, params, tokens, feats, vin, mask, recipe: EagleRecipe, key):
    """(total, metrics) of one batch: tokens i32[B, W], feats f32[B, W, D] (the verifier's
    final features: targets), vin f32[B, W, `feature_width`] (its features the drafter
    reads: ``feats`` itself without ``feature_layers``), mask f32[B, W]."""
    vin = feats if vin is None else vin
    rms = jnp.sqrt(jnp.mean(jnp.square(vin)) + 1e-12)
    noise = recipe.noise * rms * jax.random.uniform(key, vin.shape, minval=-1.0, maxval=1.0)
    target_logits = lm.head_logits(params, feats)
    p = jax.nn.softmax(target_logits, -1)
    denom = jnp.maximum(jnp.sum(mask), 1.0)

    def losses(h):
        out = lm.head_input(params, h)
        reg = jnp.sum(optax.huber_loss(out, feats, delta=1.0).mean(-1) * mask) / denom
        logq = jax.nn.log_softmax(lm.head_logits(params, out), -1)
        ce = -jnp.sum(jnp.sum(p * logq, -1) * mask) / denom
        tv = 1.0 - jnp.sum(jnp.sum(jnp.minimum(p, jnp.exp(logq)), -1) * mask) / denom
        return reg, ce, tv, logq

    def weighted(reg, ce, tv):
        return recipe.reg_weight * reg + recipe.ce_weight * ce + recipe.tv_weight * tv

    h1 = lm.hidden_full(params, tokens, lm.input_features(params, vin + noise))
    reg1, ce1, tv1, logq1 = losses(h1)
    total = weighted(reg1, ce1, tv1)
    metrics = {'reg1': reg1, 'ce1': ce1, 'tv1': tv1}
    logqs = [logq1]
    if recipe.second_pass > 0:
        # Position t now reads h1[t-1] (its own output) instead of the verifier's feature.
        h2 = lm.hidden_full(params, tokens, h1)
        reg2, ce2, tv2, logq2 = losses(h2)
        total = total + recipe.second_pass * weighted(reg2, ce2, tv2)
        metrics.update(reg2=reg2, ce2=ce2, tv2=tv2)
        logqs.append(logq2)
    if recipe.loop_weight > 0:
        loop_tv = _loop_tv(p, logqs, tokens, params['keep'], mask, recipe.loop_gamma, lm)
        total = total + recipe.loop_weight * loop_tv
        metrics['loop_tv'] = loop_tv
    return total, metrics


def _loop_tv(p, logqs, tokens, keep, mask, gamma: int, lm: EagleLM):
    """1 − the expected acceptance of the drafts a rule-1 loop at γ ``gamma`` makes along
    these rows (`specjax.measure.loop_law.round_states`, in-graph): each position's Σ min(p, q_k)
    (p, q over the kept ids; q_k the step-k pass, deeper steps the last one) weighted by
    the probability that the loop drafts there at step k given the text, the weights
    held constant (from the drafter's accept probabilities min(1, q(x) / p(x)) at the
    committed tokens x; 0 for tokens outside the kept ids)."""
    n_kept = p.shape[-1]
    inv = jnp.full((lm.verifier_vocab,), -1, jnp.int32).at[keep].set(jnp.arange(n_kept))
    nxt = inv[jnp.concatenate([tokens[:, 1:], tokens[:, -1:]], axis=1)]
    j = jnp.maximum(nxt, 0)[..., None]
    p_x = jnp.take_along_axis(p, j, -1)[..., 0]
    alphas, accs = [], []
    for logq in logqs:
        q = jnp.exp(logq)
        alphas.append(jnp.sum(jnp.minimum(p, q), -1))
        q_x = jnp.take_along_axis(q, j, -1)[..., 0]
        accs.append(jnp.where(nxt >= 0, jnp.minimum(1.0, q_x / jnp.maximum(p_x, 1e-30)), 0.0))
    col = [min(k, len(logqs) - 1) for k in range(gamma)]
    alpha = jnp.stack(alphas, -1)[..., jnp.asarray(col)]  # [B, W, γ]
    acc = jax.lax.stop_gradient(jnp.stack(accs, -1)[..., jnp.asarray(col)])

    def step(s, xs):  # s [B, γ + 1]: P(d_t = k)
        a, m = xs
        nxt = jnp.concatenate(
            [s[:, gamma:] + jnp.sum(s[:, :gamma] * (1.0 - a), -1, keepdims=True), s[:, :gamma] * a],
            axis=-1,
        )
        return jnp.where(m[:, None] > 0, nxt, s), s * m[:, None]

    s0 = jnp.zeros((tokens.shape[0], gamma + 1)).at[:, 0].set(1.0)
    _, states = jax.lax.scan(step, s0, (acc.transpose(1, 0, 2), mask.T))
    w = jax.lax.stop_gradient(states.transpose(1, 0, 2)[..., :gamma])  # [B, W, γ]
    return 1.0 - jnp.sum(w * alpha) / jnp.maximum(jnp.sum(w), 1e-9)


def train_eagle(
    lm: EagleLM,
    params,
    data: Features,
    recipe: EagleRecipe = EagleRecipe(),
    *,
    time_budget_s: float | None = None,
    log=print,
    clock=time.perf_counter,
    checkpoint_every: int = 0,
    on_checkpoint=None,
):
    """Trains ``params['net']`` on ``data``'s reply positions. Returns (params, history).

    With ``checkpoint_every`` > 0, ``on_checkpoint(params)`` (a dict of measurements, e.g.
    held-out α) runs every that many steps and after the last one; the history's ``curve``
    records each as {step, rows_seen (steps × batch), epochs, seconds, **its result}. Its
    time counts neither in ``time_budget_s`` nor in the pace that sizes the schedule.

    With ``time_budget_s`` the warmup-cosine schedule is sized to the budget: after
    `_RATE_PROBE` steps the run's pace sets the schedule's length (at most
    ``recipe.steps``), re-estimated as it goes, so the run ends with its learning rate
    decayed rather than cut mid-schedule. The history records the steps run. ``clock``
    (seconds) is the run's clock; a test passes one that counts its calls.
    """
    tx = optimizer(recipe, injected=True)
    frozen = {k: v for k, v in params.items() if k != 'net'}
    net, opt = params['net'], tx.init(params['net'])
    mask_all = data.reply_mask()
    vin_all = data.inputs(lm.feature_layers)

    @jax.jit
    def step(net, opt, tokens, feats, vin, mask, key, lr):
        def f(net):
            return _step_losses(lm, {**frozen, 'net': net}, tokens, feats, vin, mask, recipe, key)

        (loss, metrics), g = jax.value_and_grad(f, has_aux=True)(net)
        opt = (opt[0], opt[1]._replace(hyperparams={**opt[1].hyperparams, 'learning_rate': lr}))
        upd, opt = tx.update(g, opt, net)
        return optax.apply_updates(net, upd), opt, loss, metrics

    rng = np.random.default_rng(recipe.seed)
    key = jax.random.key(recipe.seed)
    hist: dict[str, Any] = {
        'loss': [],
        'n_rows': len(data.tokens),
        'n_targets': int(mask_all.sum()),
    }
    t0 = clock()
    total = done = recipe.steps
    sched = lr_schedule(recipe, total)
    paused = 0.0

    def checkpoint(steps_done: int) -> float:
        """Runs ``on_checkpoint`` after ``steps_done`` steps; returns its seconds."""
        c0 = clock()
        res = on_checkpoint({**params, 'net': net})
        row = {
            'step': steps_done,
            'rows_seen': steps_done * recipe.batch,
            'epochs': round(steps_done * recipe.batch / max(1, len(data.tokens)), 3),
            'seconds': round(c0 - t0, 1),
            **res,
        }
        hist.setdefault('curve', []).append(row)
        log(f'checkpoint: {row}')
        return clock() - c0

    for s in range(recipe.steps):
        if s >= total:
            done = s
            break
        if checkpoint_every and on_checkpoint is not None and s and s % checkpoint_every == 0:
            spent = checkpoint(s)
            t0 += spent  # the budget and the pace count training alone
            paused += spent
        if time_budget_s is not None and s >= _RATE_PROBE and s % _RATE_PROBE == 0:
            pace = (clock() - t0) / s
            total = max(s + 1, min(recipe.steps, int(_BUDGET_SHARE * time_budget_s / pace)))
            sched = lr_schedule(recipe, total)
        idx = rng.integers(0, len(data.tokens), recipe.batch)
        W = int(-(-data.length[idx].max() // 32) * 32)
        net, opt, loss, m = step(
            net,
            opt,
            jnp.asarray(data.tokens[idx, :W]),
            jnp.asarray(data.feats[idx, :W], jnp.float32),
            jnp.asarray(vin_all[idx, :W], jnp.float32) if lm.feature_layers else None,
            jnp.asarray(mask_all[idx, :W], jnp.float32),
            jax.random.fold_in(key, s),
            jnp.float32(sched(s)),
        )
        if s % 25 == 0 or s == total - 1:
            row = {k: round(float(v), 4) for k, v in m.items()}
            hist['loss'].append((s, float(loss), row))
            log(
                f'train: step {s}/{recipe.steps} loss {float(loss):.3f} {row} '
                f'({clock() - t0:.0f} s)'
            )
        if time_budget_s is not None and clock() - t0 > time_budget_s:
            log(f'train: time budget {time_budget_s:.0f} s reached at step {s} of {total}')
            done = s + 1
            break
    if checkpoint_every and on_checkpoint is not None:
        last = hist.get('curve', [{}])[-1].get('step')
        if last != done:
            spent = checkpoint(done)
            t0 += spent
            paused += spent
        hist['checkpoint_seconds'] = round(paused, 1)
    hist['seconds'] = clock() - t0
    hist['steps_run'] = done
    hist['schedule_steps'] = total
    return {**params, 'net': net}, hist


_RATE_PROBE = 50  # steps between estimates of the run's pace (a time-budgeted schedule)
_BUDGET_SHARE = 0.95  # the schedule is sized to end within this share of the budget


def feature_alpha(
    lm: EagleLM, params, data: Features, batch: int = 8, temperature: float = 1.0, top_m: int = 1
) -> dict[str, float]:
    """α against the verifier on ``data``'s reply positions, teacher forced.

    The verifier's distribution at position t is softmax(E f_t) over all V ids (its tied
    head on its own feature); the drafter's is its head over the kept ids on h_t, at
    ``temperature`` (> 0; its logits divided by it).
    ``alpha1`` / ``top1_1``: step 1 (h from the verifier's feature at t - 1);
    ``alpha2`` / ``top1_2``: step 2 (h from the drafter's own output at t - 1);
    ``top{m}_1`` for m = 2 … ``top_m``: how often the verifier's argmax is among the
    drafter's m most likely ids at step 1 — the root acceptance at verifier τ 0 of m twins
    drafting greedily without replacement (`specjax.engine.drafting.draft_group`).
    """
    if not temperature > 0:
        raise ValueError(f'temperature: got {temperature!r}; allowed: > 0')
    mask_all = data.reply_mask()
    vin_all = data.inputs(lm.feature_layers)
    ms = tuple(range(2, int(top_m) + 1))

    @jax.jit
    def score(params, tokens, feats, vin, mask):  # params an argument: not folded as constants
        v_logits = jnp.einsum('btd,vd->btv', feats, lm.table(params).astype(jnp.float32))
        p = jax.nn.softmax(v_logits, -1)
        vin = feats if vin is None else vin
        h1 = lm.hidden_full(params, tokens, lm.input_features(params, vin))
        h2 = lm.hidden_full(params, tokens, h1)
        out, logits = [], [lm.scatter(params, lm.draft_logits(params, h)) for h in (h1, h2)]
        for lg in logits:
            q = jax.nn.softmax(lg / temperature, -1)
            a = jnp.minimum(p, q).sum(-1)
            t1 = jnp.argmax(v_logits, -1) == jnp.argmax(q, -1)
            out += [jnp.sum(a * mask), jnp.sum(t1 * mask)]
        if ms:  # step 1's logits
            top = jax.lax.top_k(logits[0], ms[-1])[1]
            hit = top == jnp.argmax(v_logits, -1)[..., None]
            out += [jnp.sum(jnp.any(hit[..., :m], -1) * mask) for m in ms]
        return jnp.stack(out)

    tot = np.zeros(4 + len(ms))
    for i in range(0, len(data.tokens), batch):
        sl = slice(i, i + batch)
        W = int(-(-data.length[sl].max() // 32) * 32)
        tot += np.asarray(
            score(
                params,
                jnp.asarray(data.tokens[sl, :W]),
                jnp.asarray(data.feats[sl, :W], jnp.float32),
                jnp.asarray(vin_all[sl, :W], jnp.float32) if lm.feature_layers else None,
                jnp.asarray(mask_all[sl, :W], jnp.float32),
            )
        )
    n = float(mask_all.sum())
    return {
        'alpha1': tot[0] / n,
        'top1_1': tot[1] / n,
        'alpha2': tot[2] / n,
        'top1_2': tot[3] / n,
        **{f'top{m}_1': tot[4 + i] / n for i, m in enumerate(ms)},
        'positions': int(n),
    }


def feature_alpha_positions(
    lm: EagleLM, params, data: Features, steps: int = 3, batch: int = 8, temperature: float = 1.0
) -> dict[str, np.ndarray]:
    """Per-position acceptance of the drafter, teacher forced, for `specjax.measure.loop_law`.

    Step 1 reads the verifier's feature at t - 1 (as `feature_alpha`); step k > 1 the
    drafter's own step-(k - 1) outputs at every earlier position (so its attention reads
    own-feature keys where the loop's cache holds the verifier's for the committed
    prefix: deep steps are approximated, slightly pessimistically).

    Returns ``alpha`` f32[N, W, steps] (Σ_v min(p_t, q_t) at τ 1 / ``temperature``),
    ``accept`` f32[N, W, steps] (min(1, q_t(x) / p_t(x)) for the committed x = the row's
    token t + 1: the draft's accept probability given that token) and ``mask``
    bool[N, W] (`Features.reply_mask`)."""
    if not temperature > 0:
        raise ValueError(f'temperature: got {temperature!r}; allowed: > 0')
    if int(steps) < 1:
        raise ValueError(f'steps: got {steps!r}; allowed: >= 1')
    mask_all = data.reply_mask()
    vin_all = data.inputs(lm.feature_layers)

    @jax.jit
    def score(params, tokens, feats, vin):
        p = jax.nn.softmax(
            jnp.einsum('btd,vd->btv', feats, lm.table(params).astype(jnp.float32)), -1
        )
        nxt = jnp.concatenate([tokens[:, 1:], tokens[:, -1:]], axis=1)
        p_x = jnp.take_along_axis(p, nxt[..., None], -1)[..., 0]
        h = lm.input_features(params, feats if vin is None else vin)
        alphas, accepts = [], []
        for _ in range(int(steps)):
            h = lm.hidden_full(params, tokens, h)
            q = jax.nn.softmax(lm.scatter(params, lm.draft_logits(params, h)) / temperature, -1)
            alphas.append(jnp.minimum(p, q).sum(-1))
            q_x = jnp.take_along_axis(q, nxt[..., None], -1)[..., 0]
            accepts.append(jnp.minimum(1.0, q_x / jnp.maximum(p_x, 1e-30)))
        return jnp.stack(alphas, -1), jnp.stack(accepts, -1)

    N, W_all = data.tokens.shape
    alpha = np.zeros((N, W_all, int(steps)), np.float32)
    accept = np.zeros_like(alpha)
    for i in range(0, N, batch):
        sl = slice(i, i + batch)
        W = min(W_all, int(-(-data.length[sl].max() // 32) * 32))
        a, acc = score(
            params,
            jnp.asarray(data.tokens[sl, :W]),
            jnp.asarray(data.feats[sl, :W], jnp.float32),
            jnp.asarray(vin_all[sl, :W], jnp.float32) if lm.feature_layers else None,
        )
        alpha[sl, :W], accept[sl, :W] = np.asarray(a), np.asarray(acc)
    return {'alpha': alpha, 'accept': accept, 'mask': mask_all}
