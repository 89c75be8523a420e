"""Switch 4, bounded heterogeneity: pairwise KL between drafters and the groups it allows.

`pairwise_kl` measures `KL(q_i ‖ q_j)` for every ordered pair of drafters at every position
of the shared prefix; `kl_summary` reports its max and mean (SPEC §7); `kl_groups` splits
the drafters into groups that may share a prefix under a ceiling (SPEC §4, switch 4).

Distributions are in the verifier's vocabulary (after the token-level intersection of
rule 3), so a cross-vocabulary drafter has exactly zero mass outside the intersection and
`KL` against it would be infinite. Every row is therefore smoothed before the KL:

        q̃ = (q + ε·u) / (Σ q + ε),     u = 1/V (the uniform distribution),

i.e. mixed with ε times the uniform distribution and renormalised (which also absorbs
rows that sum to 1 only up to rounding). With the default ε = 1e-6 the change to a KL
between full-support rows is O(ε), and a token with mass `m` in `q_i` and none in `q_j`
contributes about `m·log(m·V/ε)` — large and finite, which is what the ceiling needs.
"""

from __future__ import annotations

from collections.abc import Sequence

import chex
import jax
import jax.numpy as jnp
import numpy as np


def _is_concrete(x) -> bool:
    return not isinstance(x, jax.core.Tracer)


def _smooth(q: jax.Array, eps) -> jax.Array:
    """f32[V] → f32[V]: mix with eps·uniform and renormalise (see the module docstring)."""
    vocab = q.shape[-1]
    return (q + eps / vocab) / (jnp.sum(q) + eps)


def _kl_one(q_i: jax.Array, q_j: jax.Array, eps) -> jax.Array:
    """KL(q_i ‖ q_j) in nats for one pair at one position: f32[V], f32[V] → f32[]."""
    a = _smooth(q_i, eps)
    b = _smooth(q_j, eps)
    kl = jnp.sum(a * (jnp.log(a) - jnp.log(b)))
    # KL ≥ 0; a rounding-level negative for (near-)identical rows is clipped to 0.
    return jnp.maximum(kl, 0.0)


# One pair over positions: f32[T, V], f32[T, V] → f32[T].
_kl_positions = jax.vmap(_kl_one, in_axes=(0, 0, None))
# Every ordered pair: over j (inner), then i (outer): f32[K, T, V] × 2 → f32[K, K, T].
_kl_pairs = jax.vmap(jax.vmap(_kl_positions, in_axes=(None, 0, None)), in_axes=(0, None, None))


@jax.jit
def _pairwise_kl(q: jax.Array, eps) -> jax.Array:
    q = q.astype(jnp.float32)
    return _kl_pairs(q, q, eps)


def pairwise_kl(q: jax.Array, eps: float = 1e-6) -> jax.Array:
    """`KL(q_i ‖ q_j)` at every position for every ordered pair of drafters.

    Each row is first mixed with `eps`·uniform and renormalised,
    `q̃ = (q + eps/V) / (Σq + eps)`, so that zero mass outside a cross-vocabulary drafter's
    intersection gives a large finite KL instead of infinity. The diagonal is 0.

    Args:
        q: f32[K, T, V], drafter `i`'s next-token distribution at shared-prefix position `t`,
            in the verifier's vocabulary. Non-negative, finite.
        eps: smoothing mass, > 0.

    Returns:
        f32[K, K, T], entry `[i, j, t]` = KL(q̃_i[t] ‖ q̃_j[t]) in nats.
    """
    chex.assert_rank(q, 3)
    if not (np.isfinite(eps) and eps > 0):
        raise ValueError(f"pairwise_kl: eps={eps!r} is not allowed; allowed: a finite float > 0.")
    if _is_concrete(q):
        chex.assert_tree_all_finite(q)
        if bool(jnp.any(jnp.asarray(q) < 0)):
            raise ValueError("pairwise_kl: q has negative entries; rows must be distributions.")
    kl = _pairwise_kl(q, jnp.float32(float(eps)))
    k, t = q.shape[0], q.shape[1]
    chex.assert_shape(kl, (k, k, t))
    return kl


def _kl_common_one(q_i, q_j, m_i, m_j, eps):
    """KL on the common support of one pair at one position, and q_i's mass outside it."""
    common = (m_i & m_j).astype(q_i.dtype)
    n = jnp.maximum(jnp.sum(common), 1.0)
    a_in, b_in = q_i * common, q_j * common
    outside = jnp.maximum(1.0 - jnp.sum(a_in) / jnp.maximum(jnp.sum(q_i), 1e-30), 0.0)
    a = (a_in + common * eps / n) / (jnp.sum(a_in) + eps)
    b = (b_in + common * eps / n) / (jnp.sum(b_in) + eps)
    safe_a, safe_b = jnp.where(common > 0, a, 1.0), jnp.where(common > 0, b, 1.0)
    kl = jnp.sum(jnp.where(common > 0, a * (jnp.log(safe_a) - jnp.log(safe_b)), 0.0))
    return jnp.maximum(kl, 0.0), outside


# Over positions, then every ordered pair: f32[K, T, V], bool[K, V] → f32[K, K, T] twice.
_kl_common_pos = jax.vmap(_kl_common_one, in_axes=(0, 0, None, None, None))
_kl_common_pairs = jax.vmap(
    jax.vmap(_kl_common_pos, in_axes=(None, 0, None, 0, None)), in_axes=(0, None, 0, None, None)
)


@jax.jit
def _pairwise_kl_common(q, support, eps):
    return _kl_common_pairs(q.astype(jnp.float32), q.astype(jnp.float32), support, support, eps)


def pairwise_kl_common(q: jax.Array, support: jax.Array, eps: float = 1e-6):
    """`KL(q_i ‖ q_j)` on the pair's common support, and the mass left outside it (SPEC §7).

    Each drafter's distribution lives on its vocabulary in verifier space (`support[i]`: the
    verifier ids its tokenizer can spell, the token-level intersection of rule 3). For a
    pair, both rows are restricted to the intersection of the two supports and renormalised
    there (with `eps` of uniform mass on that intersection, so that a token one drafter
    filtered out gives a large finite KL), so the figure measures how differently the two
    drafters rank what both can say, and is never dominated by the smoothing of mass one of
    them cannot place. That mass is reported separately.

    Args:
      q: f32[K, T, V] next-token distributions in verifier space at T prefix positions.
      support: bool[K, V] each drafter's vocabulary in verifier space.
      eps: smoothing mass on the common support, > 0.

    Returns:
      (kl f32[K, K, T], outside f32[K, K, T]): `outside[i, j, t]` is the mass of q_i outside
      the common support of (i, j).
    """
    chex.assert_rank(q, 3)
    chex.assert_rank(support, 2)
    chex.assert_equal(support.shape, (q.shape[0], q.shape[2]))
    if not (np.isfinite(eps) and eps > 0):
        raise ValueError(
            f"pairwise_kl_common: eps={eps!r} is not allowed; allowed: a finite float > 0."
        )
    kl, outside = _pairwise_kl_common(q, jnp.asarray(support, bool), jnp.float32(float(eps)))
    chex.assert_shape(kl, (q.shape[0], q.shape[0], q.shape[1]))
    return kl, outside


def _pair_mask(kl: jax.Array, active) -> jax.Array:
    """bool[K, K, T]: off-diagonal pairs at active positions."""
    k, _, t = kl.shape
    mask = ~jnp.eye(k, dtype=bool)[:, :, None]
    mask = jnp.broadcast_to(mask, (k, k, t))
    if active is not None:
        active = jnp.asarray(active, dtype=bool)
        if active.shape == (t,):
            active = active[None, None, :]
        elif active.shape != (k, k, t):
            raise ValueError(
                f"active has shape {active.shape}; allowed: ({t},) (positions) or "
                f"({k}, {k}, {t}) (pairs × positions)."
            )
        mask = mask & active
    return mask


def kl_summary(kl: jax.Array, active=None) -> tuple[jax.Array, jax.Array]:
    """Max and mean of `kl` over ordered pairs `i ≠ j` and (active) positions.

    Args:
        kl: f32[K, K, T] from `pairwise_kl`.
        active: optional bool[T] (positions that belong to the shared prefix, e.g. to drop
            padding) or bool[K, K, T].

    Returns:
        (max, mean), f32 scalars. Both are 0.0 when nothing is counted (one drafter, or no
        active position): no pair means no heterogeneity to bound.
    """
    chex.assert_rank(kl, 3)
    chex.assert_axis_dimension(kl, 1, kl.shape[0])
    mask = _pair_mask(kl, active)
    count = jnp.sum(mask)
    kl_max = jnp.max(jnp.where(mask, kl, -jnp.inf), initial=-jnp.inf)
    kl_max = jnp.where(count > 0, kl_max, 0.0)
    kl_mean = jnp.sum(jnp.where(mask, kl, 0.0)) / jnp.maximum(count, 1)
    return kl_max, kl_mean


def kl_max_matrix(kl: jax.Array, active=None) -> jax.Array:
    """f32[K, K, T] → f32[K, K]: max over (active) positions of KL(q_i ‖ q_j); diagonal 0."""
    chex.assert_rank(kl, 3)
    k = kl.shape[0]
    mask = _pair_mask(kl, active)
    out = jnp.max(jnp.where(mask, kl, -jnp.inf), axis=-1, initial=-jnp.inf)
    return jnp.where(jnp.isfinite(out), out, 0.0) * ~jnp.eye(k, dtype=bool)


def kl_groups(
    kl_max: jax.Array | np.ndarray,
    ceiling: float | None,
    priority: Sequence[int] | None = None,
) -> list[list[int]]:
    """Greedy grouping of drafters that may share a prefix under the KL ceiling.

    Drafters are taken in `priority` order; each joins the first existing group in which
    every member `j` has `max(KL(i‖j), KL(j‖i)) ≤ ceiling` with it, else it opens a new
    group. Drafters in different groups do not share a prefix (their branches run
    independently). Groups are listed in order of creation, members in priority order.

    Args:
        kl_max: f32[K, K], entry `[i, j]` = max over shared-prefix positions of KL(q_i ‖ q_j)
            (see `kl_max_matrix`). Finite.
        ceiling: nats; `None` (switch off) puts every drafter in one group.
        priority: a permutation of `range(K)` (default: `range(K)`).

    Returns:
        list of groups, each a list of drafter indices.
    """
    matrix = np.asarray(kl_max, dtype=np.float64)
    chex.assert_rank(matrix, 2)
    k = matrix.shape[0]
    chex.assert_shape(matrix, (k, k))
    chex.assert_tree_all_finite(matrix)
    order = list(range(k)) if priority is None else [int(i) for i in priority]
    if sorted(order) != list(range(k)):
        raise ValueError(
            f"kl_groups: priority={list(priority)!r} is not allowed; allowed: a permutation "
            f"of range({k})."
        )
    if ceiling is None:
        return [order] if order else []
    if not (np.isfinite(ceiling) and ceiling > 0):
        raise ValueError(
            f"kl_groups: ceiling={ceiling!r} is not allowed; allowed: None or a finite "
            "float > 0 (nats)."
        )
    symmetric = np.maximum(matrix, matrix.T)
    groups: list[list[int]] = []
    for i in order:
        for group in groups:
            if all(symmetric[i, j] <= ceiling for j in group):
                group.append(i)
                break
        else:
            groups.append([i])
    return groups
