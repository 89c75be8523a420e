"""The independent reference of the losslessness suites: exact target laws in float64 NumPy.

It shares no code with `specjax.verify.distributions` (the code under test), so that a bug
in `sampling_probs` cannot cancel out of a χ² test whose target it would compute.
"""

from __future__ import annotations

import numpy as np

# A top-p cut whose cumulative mass is this close to top_p could fall either way in f32:
# the reference refuses such a table instead of guessing.
TOP_P_MARGIN = 1e-4


def reference_probs(
    logits: np.ndarray, temperature: float, top_k: int = 0, top_p: float = 1.0
) -> np.ndarray:
    """The law a sampler with these settings draws from, rows of `logits` f[..., V].

    τ = 0 is the argmax (lowest id on ties); top-k keeps the tokens whose scaled logit is
    at least the k-th largest; top-p keeps, in order of decreasing probability, every token
    whose preceding cumulative mass is below top_p (the token crossing it included).
    """
    x = np.asarray(logits, np.float64)
    v = x.shape[-1]
    if temperature == 0:
        return np.eye(v)[np.argmax(x, axis=-1)]
    z = x / temperature
    if top_k and top_k < v:
        kth = np.sort(z, axis=-1)[..., v - top_k][..., None]
        z = np.where(z >= kth, z, -np.inf)
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    p = e / e.sum(axis=-1, keepdims=True)
    if top_p < 1.0:
        order = np.argsort(-p, axis=-1, kind="stable")
        sorted_p = np.take_along_axis(p, order, axis=-1)
        before = np.cumsum(sorted_p, axis=-1) - sorted_p
        live = sorted_p > 0
        assert np.all(np.abs(before - top_p)[live] > TOP_P_MARGIN), "top_p on a knife edge"
        keep = np.zeros_like(p, bool)
        np.put_along_axis(keep, order, before < top_p, axis=-1)
        p = np.where(keep, p, 0.0)
        p = p / p.sum(axis=-1, keepdims=True)
    return p


def reference_law(
    table: np.ndarray,
    temperature: float,
    start: int,
    length: int,
    top_k: int = 0,
    top_p: float = 1.0,
) -> np.ndarray:
    """Exact law f64[V]*length of the `length` tokens after `start` (a bigram table)."""
    probs = reference_probs(table, temperature, top_k, top_p)
    law = probs[start]
    for _ in range(length - 1):
        law = law[..., None] * probs  # [..., a, b] = law[..., a] · P(b | a)
    return law
