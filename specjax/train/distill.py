"""Drafters distilled from a real verifier: its own generations, with its soft targets.

The recipe (DistillSpec's on-policy data, FR-Spec's subset head), in three steps::

    prompts = domain_prompts('code', n=700)                         # train split only
    data = generate(verifier, [verifier.chat(p) for p in prompts],   # the verifier writes
                    new_tokens=160, batch=32, top_k=16)              # the training text
    lm, params, log = train_drafter(data, verifier, d_model=256, n_layers=4, kept=8192)

1. **Prompts** of a domain, cut from the corpus's train split the way the shipped plan
   prompts are cut from its held-out split (`specjax.data.shipped`): functions' first
   lines (code), a chapter heading and a verse (prose), a question (reasoning). Held-out
   documents are never used, so α measured on the shipped prompts is held-out.
2. **Generation** by the verifier at temperature τ, batched and jitted (a ragged prefill,
   then a `lax.scan` of one-token steps with the KV cache): each generated position keeps
   the sampled token and the verifier's top-k log-probabilities — soft targets at no extra
   cost — until the row emits EOS.
3. **Training** of a `SubsetVocabLM` (the verifier's ids in and out, a head over the
   ``kept`` most frequent ids of the generated text) on the generated positions: the
   cross-entropy against the verifier's top-k distribution (``targets='soft'``) or against
   the sampled token (``'hard'``, sequence-level distillation). The embedding and head
   start from the verifier's embedding rows projected to ``d_model`` (PCA).
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from specjax.models.api import embedding_table
from specjax.models.subset_vocab import SubsetVocabLM, most_frequent_ids
from specjax.models.transformer import TransformerConfig
from specjax.train.distill_data import Generated, domain_prompts, generate

__all__ = [
    'Generated',
    'domain_prompts',
    'generate',
    'train_drafter',
    'DrafterRecipe',
    'reply_alpha',
]


# ----------------------------------------------------------------------------------------
# Training
# ----------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class DrafterRecipe:
    """How a distilled drafter is built (recorded in the zoo manifest)."""

    d_model: int = 256
    n_layers: int = 4
    n_heads: int = 4
    n_kv_heads: int = 2
    d_ff: int = 688
    kept: int = 4096  # FR-Spec head: most frequent verifier ids (tied table)
    max_len: int = 1024
    targets: str = 'soft'  # 'soft' (top-k distribution) | 'hard' (sampled token)
    steps: int = 600
    batch: int = 16
    learning_rate: float = 2e-3
    warmup: int = 50
    weight_decay: float = 0.05
    seed: int = 0


def _windows(data: Generated, seq: int):
    """(tokens i32[N, seq+1], target mask bool[N, seq], top ids, top logp [N, seq, k]):
    row r predicts, at position t, token t+1; generated positions carry soft targets."""
    N, k = len(data.tokens), data.top_ids.shape[-1]
    toks = np.zeros((N, seq + 1), np.int32)
    mask = np.zeros((N, seq), bool)
    tid = np.zeros((N, seq, k), np.int32)
    # Positions without a target keep finite log-probs (a uniform row): an all -inf row
    # would make the soft targets NaN there, and NaN * (mask 0) is still NaN in the loss
    # and its gradient.
    tlp = np.zeros((N, seq, k), np.float32)
    for r in range(N):
        p = int(data.prompt_len[r])
        g = data.tokens[r][data.valid[r]]
        full = np.concatenate([data.prompt[r, :p], g])[: seq + 1]
        toks[r, : len(full)] = full
        # Position p-1+j predicts generated token j (sampled from the verifier's top-k there).
        n = min(len(g), seq - (p - 1))
        if n > 0:
            mask[r, p - 1 : p - 1 + n] = True
            tid[r, p - 1 : p - 1 + n] = data.top_ids[r][data.valid[r]][:n]
            tlp[r, p - 1 : p - 1 + n] = data.top_logp[r][data.valid[r]][:n]
    return toks, mask, tid, tlp


def _pca_init(verifier_embed: np.ndarray, keep: np.ndarray, d: int, seed: int):
    """Embedding [K+1, d] of the kept rows projected on their top-d principal directions
    (unit variance per coordinate); the "other" row is the mean of the rest."""
    E = np.asarray(verifier_embed, np.float64)
    mean = E.mean(0)
    rest = np.ones(len(E), bool)
    rest[keep] = False
    rows = np.concatenate([E[keep], E[rest].mean(0, keepdims=True) if rest.any() else mean[None]])
    X = rows - mean
    _, _, vt = np.linalg.svd(X[:: max(1, len(X) // 8192)], full_matrices=False)
    proj = np.zeros((len(X), d))
    proj[:, : min(d, len(vt))] = X @ vt[:d].T
    # Coordinates without a principal direction (a verifier narrower than d, or fewer
    # kept rows than d: the "other" row is a combination of the rest, so K + 1 rows span
    # at most K) start as seeded Gaussian noise, so each has unit variance.
    std = proj.std(0)
    dead = std <= 1e-6 * max(float(std.max()), 1e-30)
    proj[:, dead] = np.random.default_rng(seed).standard_normal((len(X), int(dead.sum())))
    proj /= proj.std(0, keepdims=True) + 1e-8
    return proj.astype(np.float32)


def _token_counts(data: Generated, vocab: int) -> np.ndarray:
    """f64[vocab]: how often each id occurs in ``data``'s sequences (prompts and replies)."""
    return np.bincount(np.concatenate(data.sequences()), minlength=vocab).astype(np.float64)


def _coverage(counts: np.ndarray, keep: np.ndarray) -> float:
    """The share of the counted tokens that the kept ids cover."""
    return float(counts[keep].sum() / counts.sum())


def _initial_drafter(data: Generated, verifier, recipe: DrafterRecipe):
    """The untrained drafter: its vocabulary the verifier's `recipe.kept` most frequent ids
    in `data` (special tokens always), its embedding the PCA of the verifier's rows —
    (lm, params, the share of `data`'s tokens the subset covers)."""
    V = verifier.lm.vocab_size
    counts = _token_counts(data, V)
    specials = tuple(int(i) for i in getattr(verifier.tokenizer, 'special_tokens', {}).values())
    keep = most_frequent_ids(counts, min(recipe.kept, V), always=specials)
    coverage = _coverage(counts, keep)
    cfg = TransformerConfig(
        vocab_size=len(keep) + 1,
        d_model=recipe.d_model,
        n_layers=recipe.n_layers,
        n_heads=recipe.n_heads,
        n_kv_heads=recipe.n_kv_heads,
        d_ff=recipe.d_ff,
        max_len=recipe.max_len,
        rope_theta=verifier.lm.config.rope_theta,
        tie_embeddings=True,
        embed_input_scale=False,
    )
    lm = SubsetVocabLM(cfg, V)
    params = lm.init_params(recipe.seed, keep)
    init = _pca_init(
        np.asarray(embedding_table(verifier.lm, verifier.params), np.float32),
        keep,
        recipe.d_model,
        recipe.seed,
    )
    params['inner']['embed'] = jnp.asarray(init / math.sqrt(recipe.d_model))
    return lm, params, coverage


def lr_schedule(recipe, steps: int | None = None):
    """A drafter recipe's warmup-cosine schedule (``warmup``, ``learning_rate``) over
    ``steps`` (default ``recipe.steps``) steps 0 … steps - 1: the last one runs at a tenth
    of the peak (optax's schedule reaches its end value at ``decay_steps``, so that is
    ``steps - 1``, not ``steps``: a short time-budgeted run ended a cosine segment short)."""
    steps = recipe.steps if steps is None else int(steps)
    warmup = min(recipe.warmup, max(steps - 2, 0))
    lr = recipe.learning_rate
    return optax.warmup_cosine_decay_schedule(0.0, lr, warmup, max(steps - 1, warmup + 1), lr * 0.1)


def optimizer(recipe, injected: bool = False) -> optax.GradientTransformation:
    """A drafter recipe's optimizer (``steps``, ``warmup``, ``learning_rate``,
    ``weight_decay``): AdamW (β 0.9 / 0.95) under `lr_schedule`, gradients clipped to global
    norm 1. ``injected``: the learning rate is instead an input of each step (the state's
    ``[1].hyperparams['learning_rate']``), for a caller that sizes the schedule as it runs."""
    adamw = optax.inject_hyperparams(optax.adamw) if injected else optax.adamw
    lr = recipe.learning_rate if injected else lr_schedule(recipe)
    return optax.chain(
        optax.clip_by_global_norm(1.0),
        adamw(lr, b1=0.9, b2=0.95, weight_decay=recipe.weight_decay),
    )


def train_drafter(
    data: Generated,
    verifier,
    recipe: DrafterRecipe = DrafterRecipe(),
    *,
    seq: int | None = None,
    time_budget_s: float | None = None,
    init=None,
    log=print,
):
    """Trains a `SubsetVocabLM` drafter on the verifier's generations.

    ``init``: an existing drafter ``(lm, params)`` to continue from (its architecture and
    kept subset; the recipe's architecture fields are then unused) instead of a fresh one.

    Returns (lm, params, history dict).
    """
    if init is None:
        lm, params, coverage = _initial_drafter(data, verifier, recipe)
    else:
        lm, params, coverage = _continued_drafter(init, data, verifier)
    if seq is None:
        seq = int(min(lm.max_len, max(data.prompt_len) + data.tokens.shape[1]))
    toks, mask, tid, tlp = _windows(data, seq)
    to_inner = np.asarray(params['to_inner'])
    tid_inner = to_inner[tid]  # outside the subset -> the "other" row

    tx = optimizer(recipe)
    trainable = params['inner']
    opt = tx.init(trainable)
    if recipe.targets not in ('soft', 'hard'):
        raise ValueError(f"DrafterRecipe.targets={recipe.targets!r} (allowed: 'soft', 'hard')")
    step = _train_step(lm, to_inner, recipe.targets == 'soft', tx)

    rng = np.random.default_rng(recipe.seed)
    hist, t0 = (
        {
            'loss': [],
            'coverage': coverage,
            'seq': seq,
            'n_rows': len(toks),
            'n_targets': int(mask.sum()),
        },
        time.perf_counter(),
    )
    for s in range(recipe.steps):
        idx = rng.integers(0, len(toks), recipe.batch)
        trainable, opt, loss = step(trainable, opt, toks[idx], mask[idx], tid_inner[idx], tlp[idx])
        if s % 50 == 0 or s == recipe.steps - 1:
            hist['loss'].append((s, float(loss)))
            log(
                f'train: step {s}/{recipe.steps} loss {float(loss):.3f} '
                f'({time.perf_counter() - t0:.0f} s)'
            )
        if time_budget_s is not None and time.perf_counter() - t0 > time_budget_s:
            log(f'train: time budget {time_budget_s:.0f} s reached at step {s}')
            break
    hist['seconds'] = time.perf_counter() - t0
    params = {**params, 'inner': trainable}
    return lm, params, hist


def _continued_drafter(init, data: Generated, verifier) -> tuple:
    """(lm, params, coverage) of an existing drafter ``init`` to continue training from,
    after checking it is a `SubsetVocabLM` over the verifier's ids."""
    lm, params = init
    V = verifier.lm.vocab_size
    if not isinstance(lm, SubsetVocabLM) or lm.verifier_vocab != V:
        raise ValueError(
            f'train_drafter: init={type(lm).__name__} over '
            f'{getattr(lm, "verifier_vocab", None)} ids (allowed: a SubsetVocabLM over '
            f"the verifier's {V} ids)"
        )
    coverage = _coverage(_token_counts(data, V), np.asarray(params['keep']))
    return lm, params, coverage


def _train_step(lm, to_inner: np.ndarray, soft: bool, tx):
    """The jitted training step of the drafter's inner model: the cross-entropy to the
    verifier's top-k law (``soft``) or its sampled tokens, on the kept rows."""

    def loss_fn(inner, tokens, m, ids, lp):
        logits = lm.inner.logits_full(inner, jnp.asarray(to_inner)[tokens[:, :-1]])
        logq = jax.nn.log_softmax(logits, axis=-1)
        if soft:
            # Top-k renormalised; zero where no target (no NaN can leak from there).
            p = jnp.where(m[..., None], jax.nn.softmax(lp, axis=-1), 0.0)
            ce = -jnp.sum(p * jnp.take_along_axis(logq, ids, axis=-1), axis=-1)
        else:
            tgt = jnp.asarray(to_inner)[tokens[:, 1:]]
            ce = -jnp.take_along_axis(logq, tgt[..., None], axis=-1)[..., 0]
        return jnp.sum(ce * m) / jnp.maximum(jnp.sum(m), 1)

    @jax.jit
    def step(inner, opt, tokens, m, ids, lp):
        loss, g = jax.value_and_grad(loss_fn)(inner, tokens, m, ids, lp)
        upd, opt = tx.update(g, opt, inner)
        return optax.apply_updates(inner, upd), opt, loss

    return step


def reply_alpha(
    verifier, lm, params, data: Generated, temperature: float = 1.0, bucket: int = 64
) -> dict[str, float]:
    """A verifier-tokenizer drafter's acceptance on ``data``'s reply positions only.

    Each row (its own prompt, then the verifier's reply) is scored whole by both models;
    only the positions that predict a generated token count — the positions a speculative
    round meets — not the template and prompt, and no row sees another's text (what
    `specjax.measure.evaluation.acceptance_rates` on the joined text counts as well).

    Returns:
      ``alpha``: mean Σ_x min(p(x), q(x)) with p, q at ``temperature`` (Leviathan α);
      ``top1``: the share of positions where the two argmaxes agree (α at τ = 0, teacher
      forced); ``positions``: how many counted.
    """
    if temperature <= 0:
        raise ValueError(f'reply_alpha: temperature={temperature} (allowed: > 0; top1 is τ 0)')
    v_fn = jax.jit(verifier.lm.logits_full)
    d_fn = jax.jit(lm.logits_full)

    @jax.jit
    def score(lv, ld, m):
        p = jax.nn.softmax(lv.astype(jnp.float32) / temperature, -1)
        q = jax.nn.softmax(ld.astype(jnp.float32) / temperature, -1)
        a = jnp.minimum(p, q).sum(-1)
        t1 = jnp.argmax(lv, -1) == jnp.argmax(ld, -1)
        return jnp.sum(a * m), jnp.sum(t1 * m)

    a_sum = t_sum = 0.0
    n = 0
    for r, seq in enumerate(data.sequences()):
        P, L = int(data.prompt_len[r]), len(seq)
        if L <= P:
            continue
        width = -(-L // bucket) * bucket
        x = np.zeros((1, width), np.int32)
        x[0, :L] = seq
        m = np.zeros((1, width), np.float32)
        m[0, P - 1 : L - 1] = 1.0  # position t predicts token t + 1: the reply's tokens
        x = jnp.asarray(x)
        a, t = score(v_fn(verifier.params, x), d_fn(params, x), jnp.asarray(m))
        a_sum, t_sum, n = a_sum + float(a), t_sum + float(t), n + L - P
    if n == 0:
        raise ValueError('reply_alpha: data has no generated tokens')
    return {'alpha': a_sum / n, 'top1': t_sum / n, 'positions': n}


def heldout_text(model, prompts: Sequence[str], data: Generated) -> list[str]:
    """Each held-out row as the text the verifier saw and wrote (template + reply)."""
    del prompts
    return [model.tokenizer.decode(s) for s in data.sequences()]


def summarize(data: Generated) -> dict[str, Any]:
    return {
        'rows': len(data.tokens),
        'generated': data.n_generated,
        'ended': int((~data.valid[:, -1]).sum()),
    }
