"""What teacher-forced acceptance predicts for the speculative loop: the law of its rounds
given the text.

Teacher-forced α averages a drafter's acceptance Σ_v min(p_t(v), q_t(v)) over every
position of a text. The loop drafts step 1 only where a round starts, and a round starts
right after the previous one ended: after a rejection (a token drawn from the residual
(p − q)₊, i.e. one the drafter under-weighted) or after a bonus token. Those positions are
not a uniform sample of the text, so the loop's per-step acceptance can differ from the
teacher-forced one with nothing wrong in either.

Under rule 1 the committed text has the verifier's law whatever happens, and given the
text the accept events are independent: a draft of x at a position where the verifier's
law is p and the drafter's q is accepted with probability min(p(x), q(x)) / p(x) given
that the committed token is x (P(x, accepted) = min(p(x), q(x)); P(x, rejected) =
p(x) − min(p(x), q(x))). So the round state along a text — how many drafts of the
current round are already accepted — is a Markov chain whose transition at position t
needs only the posterior accept probability of the draft of x_{t+1} at that depth.
`round_states` runs it forward; `loop_alpha` weighs each position's expected acceptance
by the probability that the loop drafts there at each step: the loop's per-step α,
tokens per round and the share of positions that start a round, predicted from
teacher-forced quantities alone (`specjax.train.distill_eagle.feature_alpha_positions` computes
them for a feature drafter). The expectation is exact for rule 1 when the drafter's law
at depth k is the one given (teacher-forced evaluation approximates a deep draft's
context; see there).

Offline analysis (NumPy, host side): nothing here runs inside a round.
"""

from __future__ import annotations

import numpy as np

__all__ = ['loop_alpha', 'paired_difference', 'round_states']


def _checked(acc, mask, gamma: int):
    acc = np.asarray(acc, np.float64)
    mask = np.asarray(mask, bool)
    if acc.ndim != 3 or acc.shape[2] < 1:
        raise ValueError(f'acc: shape {acc.shape}; allowed: [N, T, K] with K >= 1')
    if mask.shape != acc.shape[:2]:
        raise ValueError(f'mask: shape {mask.shape}; allowed: {acc.shape[:2]} (acc\'s [N, T])')
    if int(gamma) < 1:
        raise ValueError(f'gamma: got {gamma!r}; allowed: >= 1')
    if np.any((acc < -1e-9) | (acc > 1 + 1e-9)):
        raise ValueError('acc: probabilities must lie in [0, 1]')
    return np.clip(acc, 0.0, 1.0), mask


def round_states(acc, mask, gamma: int) -> np.ndarray:
    """f64[N, T, γ + 1]: P(d_t = k | text), d_t the drafts of the current round already
    accepted when the loop reaches position t (0: a round starts there, the drafter's
    step 1 drafts x_{t+1}; k < γ: step k + 1 drafts it; γ: x_{t+1} is the bonus token).

    ``acc`` f[N, T, K]: the posterior probability that a draft of x_{t+1} at step k + 1
    is accepted given the committed x_{t+1} (steps beyond K use the K-th); ``mask`` bool[N, T]: the positions the loop runs over (each row's
    first one starts a round; they need not be contiguous, only ordered)."""
    acc, mask = _checked(acc, mask, gamma)
    N, T, K = acc.shape
    out = np.zeros((N, T, gamma + 1))
    s = np.zeros((N, gamma + 1))
    s[:, 0] = 1.0
    col = np.minimum(np.arange(gamma), K - 1)
    for t in range(T):
        m = mask[:, t]
        if not m.any():
            continue
        out[m, t] = s[m]
        a = acc[:, t, col]  # [N, γ]
        nxt = np.zeros_like(s)
        nxt[:, 1:] = s[:, :gamma] * a
        nxt[:, 0] = s[:, gamma] + np.sum(s[:, :gamma] * (1.0 - a), axis=1)
        s = np.where(m[:, None], nxt, s)
    return out


def loop_alpha(alpha, acc, mask, gamma: int) -> dict:
    """The loop's figures predicted from teacher-forced ones, pooled over rows.

    ``alpha`` f[N, T, K]: the expected acceptance Σ_v min(p, q_k) of a draft at each
    position and step (k = 1 … K; deeper steps use the K-th); ``acc``: the posterior
    accept probabilities (`round_states`); ``mask``: the positions the loop runs over.

    Returns ``step_alpha`` [γ] (accepted ÷ reached, as the loop counts it) and
    ``step_alpha_se`` (over rows: each row a text), ``reached`` [γ] (expected drafts at
    each step), ``forced_alpha`` [min(γ, K)] (the plain
    teacher-forced means over ``mask``), ``rounds`` and ``tokens_per_round`` (positions ÷
    expected round starts) with ``tokens_per_round_se``, ``round_start_share``."""
    alpha = np.asarray(alpha, np.float64)
    if alpha.shape != np.shape(acc):
        raise ValueError(f'alpha: shape {alpha.shape}; allowed: {np.shape(acc)} (acc\'s)')
    states = round_states(acc, mask, gamma)
    mask = np.asarray(mask, bool)
    K = alpha.shape[2]
    col = np.minimum(np.arange(gamma), K - 1)
    w = states[..., :gamma] * mask[..., None]  # [N, T, γ]
    reached_r = w.sum(axis=1)  # [N, γ]
    accepted_r = (w * alpha[:, :, col]).sum(axis=1)
    n_r = mask.sum(axis=1).astype(np.float64)
    rounds_r = np.where(mask, states[..., 0], 0.0).sum(axis=1)
    reached, accepted = reached_r.sum(0), accepted_r.sum(0)
    n, rounds = float(n_r.sum()), float(rounds_r.sum())
    return {
        'step_alpha': accepted / np.maximum(reached, 1e-300),
        'step_alpha_se': np.array(
            [_ratio_se(accepted_r[:, k], reached_r[:, k]) for k in range(gamma)]
        ),
        'reached': reached,
        'forced_alpha': alpha[mask][:, : min(gamma, K)].mean(axis=0),
        'rounds': rounds,
        'tokens_per_round': n / rounds if rounds else float('nan'),
        'tokens_per_round_se': _ratio_se(n_r, rounds_r),
        'round_start_share': rounds / n if n else float('nan'),
        'positions': int(n),
        # Per text (row), for `paired_difference`.
        'rows': {
            'positions': n_r,
            'rounds': rounds_r,
            'reached': reached_r,
            'accepted': accepted_r,
        },
    }


def paired_difference(a: dict, b: dict) -> dict:
    """``a`` minus ``b``, two `loop_alpha` results on the same texts (two drafters, say):
    tokens per round and per-step α, each with the standard error of the difference over
    the paired texts (the delta method on each text's contribution to both ratios), far
    below either figure's own when the texts are shared."""
    ra, rb = a['rows'], b['rows']
    if ra['positions'].shape != rb['positions'].shape or np.any(ra['positions'] != rb['positions']):
        raise ValueError('paired_difference: the two results are not over the same texts')

    def infl(num, den):  # each row's first-order contribution to Σ num / Σ den
        r = num.sum() / den.sum()
        return r, (num - r * den) / den.sum()

    def diff(num_a, den_a, num_b, den_b):
        (x, ia), (y, ib) = infl(num_a, den_a), infl(num_b, den_b)
        m = len(ia)
        se = float(np.sqrt(m / (m - 1) * np.sum((ia - ib) ** 2))) if m > 1 else float('nan')
        return float(x - y), se

    tpr, tpr_se = diff(ra['positions'], ra['rounds'], rb['positions'], rb['rounds'])
    steps = [
        diff(ra['accepted'][:, k], ra['reached'][:, k], rb['accepted'][:, k], rb['reached'][:, k])
        for k in range(min(ra['reached'].shape[1], rb['reached'].shape[1]))
    ]
    return {
        'tokens_per_round': tpr,
        'tokens_per_round_se': tpr_se,
        'step_alpha': [d for d, _ in steps],
        'step_alpha_se': [e for _, e in steps],
    }


def _ratio_se(num, den) -> float:
    """Standard error over rows of Σ num / Σ den (the delta method; rows independent):
    how much the figures would move with other texts of the same law."""
    num, den = np.asarray(num, np.float64), np.asarray(den, np.float64)
    m = len(num)
    if m < 2 or den.sum() <= 0:
        return float('nan')
    r = num.sum() / den.sum()
    return float(np.sqrt(m / (m - 1) * np.sum((num - r * den) ** 2)) / den.sum())
