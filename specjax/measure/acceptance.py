"""Each drafter's acceptance against its verifier, in the loop and teacher forced, for any
deployment — drafters of another tokenizer (the cross-vocabulary path) included.

  loop_acceptance   the loop's own per-step α (each drafter's chain tested alone with rule
                    1's test: `Counters.own_accepted_at / own_reached_at`), tokens per round,
                    and the committed paths
  teacher_forced    on given committed paths: Σ_x min(p(x), q(x)) (Leviathan's α at the
                    verifier's τ), the argmax agreement (α at τ 0, drafting greedily), and
                    the share of the drafter's own probability that lies on ids the
                    verifier's vocabulary spells identically (what the token-level
                    intersection keeps of its proposals), per drafter

``q`` is what the engine's first draft of a round samples from: the drafter reads the
prompt in its own ids (`Deployment.drafter_encode`) and each committed verifier token re-spelt
through its re-tokenisation table, and is read at the verifier-token boundary; its law is
masked to the intersection, renormalised and carried into the verifier's ids
(`to_verifier_space`) — the same as `specjax.engine.deployment.prefix_distributions`, one
forward per row.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from specjax.engine.features import feature_layout
from specjax.engine.spec import EngineConfig
from specjax.measure import rule_pairs
from specjax.verify.distributions import sampling_probs, to_verifier_space

__all__ = ['loop_acceptance', 'teacher_forced']


def _ratio_se(num: np.ndarray, den: np.ndarray, axis: int = 0):
    """(Σnum / Σden, its standard error over rows by the delta method)."""
    r = num.sum(axis) / np.maximum(den.sum(axis), 1e-12)
    dev = num - np.expand_dims(r, axis) * den
    n = num.shape[axis]
    se = np.sqrt(dev.var(axis, ddof=1) * n) / np.maximum(den.sum(axis), 1e-12) if n > 1 else 0 * r
    return r, se


def loop_acceptance(
    dep,
    texts: Sequence[str],
    *,
    gamma: int,
    tau: float,
    new_tokens: int,
    batch: int,
    seeds,
    rule: str = 'rejection',
    stream: str = 'loop_alpha',
) -> dict:
    """The loop's per-step acceptance of ``dep``'s single drafter over ``texts``.

    Returns ``step_alpha`` (accepted ÷ reached at draft step 1..γ, its chain tested alone)
    with ``step_alpha_se`` over rows, ``tokens_per_round`` (± ``tokens_per_round_se``),
    ``kept_per_round`` / ``kept_per_round_rule1`` (the drafts each round's block was
    expected to keep under the rule and under rule 1, same blocks) and their ratio − 1
    ``kept_gain_over_rule1`` (± ``kept_gain_se``), ``rounds``, ``rows`` and ``paths``
    ((prompt ids, committed ids) per row, the loop's own text)."""
    cfg = EngineConfig(gamma=gamma, max_new_tokens=new_tokens, verifier_temperature=tau, rule=rule)
    v = [dep.encode(t) for t in texts]
    acc, reach, tokens, rounds, kept, kept1, paths, which = [], [], [], [], [], [], [], []
    for _, n, rows, r in rule_pairs.calls(dep, texts, cfg, batch=batch, seeds=seeds, stream=stream):
        c = r.counters
        acc.append(np.asarray(c.own_accepted_at)[:n, 0])  # [rows, γ]
        reach.append(np.asarray(c.own_reached_at)[:n, 0])
        tokens.append(np.asarray(r.length - r.start)[:n])
        rounds.append(np.asarray(c.rounds)[:n])
        kept.append(np.asarray(c.kept_expected)[:n])
        kept1.append(np.asarray(c.kept_rule1)[:n])
        paths += [(v[rows[j]], r.new_tokens(j)) for j in range(n)]
        which += rows[:n]
    acc, reach = np.concatenate(acc).astype(float), np.concatenate(reach).astype(float)
    alpha, se = _ratio_se(acc, reach)
    tokens, rounds = np.concatenate(tokens).astype(float), np.concatenate(rounds).astype(float)
    tpr, tpr_se = _ratio_se(tokens, rounds)
    kept, kept1 = np.concatenate(kept).astype(float), np.concatenate(kept1).astype(float)
    ratio, gain_se = _ratio_se(kept, kept1)
    return dict(
        step_alpha=alpha.tolist(),
        step_alpha_se=np.asarray(se).tolist(),
        reached=reach.sum(0).astype(int).tolist(),
        rows=len(acc),
        tokens_per_round=float(tpr),
        tokens_per_round_se=float(tpr_se),
        kept_per_round=float(kept.sum() / max(rounds.sum(), 1)),
        kept_per_round_rule1=float(kept1.sum() / max(rounds.sum(), 1)),
        kept_gain_over_rule1=float(ratio - 1),
        kept_gain_se=float(gain_se),
        rounds=int(rounds.sum()),
        paths=paths,
        texts=which,
    )


@functools.partial(jax.jit, static_argnames=('lm', 'tau'))
def _verifier_at(lm, params, tokens, at, tau: float):
    """The verifier's sampling law (τ > 0) and argmax at the positions ``at`` [B, N]."""
    logits = lm.logits_full(params, tokens)
    logits = jnp.take_along_axis(logits, at[:, :, None], axis=1).astype(jnp.float32)
    p = sampling_probs(logits, tau) if tau > 0 else None
    return p, jnp.argmax(logits, -1)


@functools.partial(jax.jit, static_argnames=('spec', 'v_vocab'))
def _drafter_sums(spec, data, temperature, p, v_top, ids, ends, valid, v_vocab):
    """Per row: Σ min(p, q), Σ [argmax agrees], Σ intersection mass, over valid positions."""
    logits = spec.lm.logits_full(data.params, ids)
    at = jnp.take_along_axis(logits, ends[:, :, None], axis=1).astype(jnp.float32)
    inter = data.to_verifier >= 0
    q = sampling_probs(at, temperature, top_k=spec.top_k, top_p=spec.top_p, mask=inter)
    qv = to_verifier_space(q, data.to_verifier, v_vocab)
    own = sampling_probs(at, temperature, top_k=spec.top_k, top_p=spec.top_p)
    kept = jnp.where(inter, own, 0.0).sum(-1)
    greedy = data.to_verifier[jnp.argmax(jnp.where(inter, at, -jnp.inf), -1)]
    top1 = (greedy == v_top).astype(jnp.float32)
    alpha = jnp.minimum(p, qv).sum(-1) if p is not None else top1
    w = valid.astype(jnp.float32)
    return (alpha * w).sum(-1), (top1 * w).sum(-1), (kept * w).sum(-1), w.sum(-1)


def _feature_forced(dep, seqs, plen, n_new, tau: float, batch: int, bucket: int) -> list[dict]:
    """`teacher_forced`'s figures for feature drafters (every drafter of ``dep`` reads the
    verifier's hidden states), from the router's scorer (`policy.scores.teacher_forced`: the
    verifier's pass gives the features, each drafter reads them as in the engine's prefill):
    Σ min(p, q) at τ 1 — the scorer's verifier law is τ 1's, so τ > 0 other than 1 is
    refused — and the argmax agreement at τ 0, over each row's committed positions.
    ``kept`` is the share of the drafter's ids the verifier spells identically (a feature
    drafter drafts in the verifier's own ids: 1)."""
    from specjax.policy import scores  # pylint: disable=import-outside-toplevel

    if tau not in (0.0, 1.0):
        raise ValueError(
            f'teacher_forced: tau {tau:g} with a feature drafter (allowed: 0 or 1, the '
            "router's scorer's verifier law)"
        )
    rows = [list(map(int, x)) for x in seqs]
    width = -(-max(len(r) for r in rows) // bucket) * bucket  # one program for every batch
    k_n, n_rows = len(dep.drafters), len(rows)
    a, t = np.zeros((k_n, n_rows)), np.zeros((k_n, n_rows))
    for lo in range(0, n_rows, batch):
        idx = [min(i, n_rows - 1) for i in range(lo, lo + batch)]
        alpha, _, top1, _ = scores.teacher_forced(dep, [rows[i] for i in idx], width=width)
        got = top1 if tau == 0.0 else alpha
        for j, r in enumerate(idx[: min(batch, n_rows - lo)]):
            span = slice(plen[r] - 1, plen[r] - 1 + n_new[r])
            a[:, r] = got[:, j, span].sum(-1)
            t[:, r] = top1[:, j, span].sum(-1)
    w = np.asarray(n_new, np.float64)
    return [
        _figures(a[k], t[k], float((np.asarray(data.to_verifier) >= 0).mean()), w)
        for k, data in enumerate(dep.d_data)
    ]


def _figures(a, t, kept: float, w) -> dict:
    """One drafter's `teacher_forced` figures from its per-row sums (α, top-1, weights)."""
    alpha, alpha_se = _ratio_se(a, w)
    top1, top1_se = _ratio_se(t, w)
    return dict(
        alpha=float(alpha),
        alpha_se=float(alpha_se),
        top1=float(top1),
        top1_se=float(top1_se),
        kept=kept,
        positions=int(np.sum(w)),
    )


def _pad(rows: list[np.ndarray], width: int) -> np.ndarray:
    out = np.zeros((len(rows), width), np.int32)
    for r, x in enumerate(rows):
        out[r, : len(x)] = x
    return out


def teacher_forced(
    dep,
    texts: Sequence[str],
    paths: Sequence[tuple[Sequence[int], Sequence[int]]],
    *,
    tau: float,
    batch: int = 4,
    bucket: int = 64,
) -> list[dict]:
    """Each drafter of ``dep`` teacher forced on ``paths`` (the verifier's committed text).

    Args:
      texts: the prompt text of each path (the drafters read it in their own ids).
      paths: (prompt ids, committed ids) in the verifier's ids, per row.
      tau: the verifier's temperature; 0: ``alpha`` is the argmax agreement.

    Returns:
      One dict per drafter, in ``dep.drafters`` order: ``alpha`` (Σ min(p, q) at τ > 0, the
      argmax agreement at τ 0) and ``top1`` (the argmax agreement), each with a standard
      error over rows (``*_se``), ``kept`` (the mean share of the drafter's probability on
      ids in the intersection: what its proposals keep), ``positions``.
    """
    n_rows = len(paths)
    if n_rows == 0 or len(texts) != n_rows:
        raise ValueError(
            f'teacher_forced: {len(texts)} texts for {n_rows} paths (allowed: equal, ≥ 1)'
        )
    seqs = [np.concatenate([np.asarray(p, np.int32), np.asarray(c, np.int32)]) for p, c in paths]
    plen = np.array([len(p) for p, _ in paths])
    n_new = np.array([len(c) for _, c in paths])
    N = max(1, int(n_new.max()))
    L = -(-max(len(s) for s in seqs) // bucket) * bucket
    at = np.minimum(plen[:, None] - 1 + np.arange(N)[None, :], L - 1).astype(np.int32)
    valid = np.arange(N)[None, :] < n_new[:, None]
    v_vocab = dep.verifier.vocab_size
    _, picks = feature_layout(dep.verifier, [d.lm for d in dep.drafters])
    feature = [spec.name for spec, pick in zip(dep.drafters, picks) if pick is not None]
    if feature:  # its q needs the verifier's states: the router's scorer reads them
        tokens = [spec.name for spec, pick in zip(dep.drafters, picks) if pick is None]
        by_name = dict(
            zip(
                feature, _feature_forced(dep.subset(feature), seqs, plen, n_new, tau, batch, bucket)
            )
        )
        if tokens:
            sub = dep.subset(tokens)
            by_name.update(
                zip(tokens, teacher_forced(sub, texts, paths, tau=tau, batch=batch, bucket=bucket))
            )
        return [by_name[spec.name] for spec in dep.drafters]
    # The drafters' streams: the prompt in their own ids, then each committed token re-spelt.
    streams = []
    for k, (spec, data) in enumerate(zip(dep.drafters, dep.d_data)):
        retok, rlen = np.asarray(data.retok), np.asarray(data.retok_len)
        rows, ends = [], np.zeros((n_rows, N), np.int32)
        for r, ((_, c), text) in enumerate(zip(paths, texts)):
            head = np.asarray(dep.drafter_encode[k](text), np.int32)
            c = np.asarray(c, np.int32)
            tail = [retok[t, : rlen[t]] for t in c]
            rows.append(np.concatenate([head, *tail]) if tail else head)
            e = len(head) - 1 + np.concatenate([[0], np.cumsum(rlen[c])])[: len(c)]
            ends[r, : len(c)] = e
        width = -(-max(len(x) for x in rows) // bucket) * bucket
        if width > spec.lm.max_len:
            raise ValueError(
                f'teacher_forced: drafter {spec.name!r} needs {width} positions, its context is '
                f'{spec.lm.max_len} (allowed: shorter paths)'
            )
        streams.append((_pad(rows, width), ends))
    sums = np.zeros((len(dep.drafters), 4, n_rows))
    pad_to = -(-n_rows // batch) * batch
    for lo in range(0, pad_to, batch):
        idx = [min(i, n_rows - 1) for i in range(lo, lo + batch)]
        real = min(batch, n_rows - lo)
        v_tok = jnp.asarray(_pad([seqs[i] for i in idx], L))
        p, v_top = _verifier_at(dep.verifier, dep.v_params, v_tok, jnp.asarray(at[idx]), float(tau))
        for k, (spec, data) in enumerate(zip(dep.drafters, dep.d_data)):
            ids, ends = streams[k]
            out = _drafter_sums(
                dataclasses.replace(spec.static, gamma=None),
                data,
                jnp.float32(spec.temperature),
                p,
                v_top,
                jnp.asarray(ids[idx]),
                jnp.asarray(ends[idx]),
                jnp.asarray(valid[idx]),
                v_vocab,
            )
            sums[k, :, lo : lo + real] = np.stack([np.asarray(x)[:real] for x in out])
    return [
        _figures(a, t, float(kept.sum() / max(w.sum(), 1)), w)
        for a, t, kept, w in (sums[k] for k in range(len(dep.drafters)))
    ]
