"""A drafter's law `q` held on its support: `SparseQ`, and what the rules ask of any `q`.

The rules compare the verifier's `p` with the law each draft was drawn from, in verifier
ids. A drafter whose mass can only fall on a few verifier ids — a head over the verifier's
K most frequent ids (`DrafterData.support`, FR-Spec), prompt lookup's point mass, a
drafter of its own K-id vocabulary mapped one-to-one into the verifier's — has that law
exactly as `SparseQ(ids i32[..., W], vals f32[..., W])`: `q(ids[i]) = vals[i]`, 0
elsewhere. Held so, a round moves `B·S·γ·W` numbers between drafting and verification
instead of `B·S·γ·V` (W 4,096 or 1 against SmolLM2's 49,152; 128 k for Llama 3), and the
token tree's residuals touch W entries per rejection instead of V.

Contract: within a row, the ids that carry mass are distinct; padding entries hold the
sentinel id `vocab` (out of range: gathers read 0 there, scatters drop it) with value 0.

Every rule reads `q` only through `q_at` (its value at a draft) and `q_dense` (one row
over the vocabulary, e.g. the primary's residual at the shared block's cut), and the tree
rule's residual steps through `residual_update`, so dense `f32[..., V]` and `SparseQ` give
the same law (`tests/test_qlaw.py`: equal verdicts, and χ² against the exact target).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from specjax.runtime import debug


@struct.dataclass
class SparseQ:
    """q over `vocab` verifier ids, held as its support (see the module docstring)."""

    ids: jax.Array
    vals: jax.Array
    vocab: int = struct.field(pytree_node=False)

    @property
    def shape(self) -> tuple:
        """The shape of the dense law it stands for, `[..., vocab]`."""
        return tuple(self.ids.shape[:-1]) + (self.vocab,)

    @property
    def width(self) -> int:
        return self.ids.shape[-1]

    def __getitem__(self, idx) -> 'SparseQ':
        """Indexes the leading (non-vocabulary) axes, like a dense `q[idx]`."""
        return SparseQ(ids=self.ids[idx], vals=self.vals[idx], vocab=self.vocab)


def is_sparse(q) -> bool:
    return isinstance(q, SparseQ)


def point_mass(x: jax.Array, vocab: int) -> SparseQ:
    """q = one-hot at `x` i32[...] (prompt lookup's law) — width 1."""
    return SparseQ(ids=x[..., None].astype(jnp.int32), vals=jnp.ones(x.shape + (1,)), vocab=vocab)


def on_ids(vals: jax.Array, ids: jax.Array, vocab: int) -> SparseQ:
    """A law `vals` f32[..., K] over the verifier ids `ids` i32[K] (distinct; −1 = none:
    its mass must be 0, e.g. a drafter token outside rule 3's intersection)."""
    ids = jnp.where(ids >= 0, ids, vocab).astype(jnp.int32)
    return SparseQ(ids=jnp.broadcast_to(ids, vals.shape), vals=vals, vocab=vocab)


def widen(q: SparseQ, width: int) -> SparseQ:
    """The same law with `width ≥ q.width` entries per row (sentinel padding)."""
    pad = width - q.width
    if pad == 0:
        return q
    cfg = [(0, 0)] * (q.ids.ndim - 1) + [(0, pad)]
    return SparseQ(
        ids=jnp.pad(q.ids, cfg, constant_values=q.vocab),
        vals=jnp.pad(q.vals, cfg),
        vocab=q.vocab,
    )


def q_dense(q) -> jax.Array:
    """f32[..., V]: `q` over the whole vocabulary (a dense `q` unchanged)."""
    if not is_sparse(q):
        return q
    lead = q.ids.shape[:-1]
    flat_ids = q.ids.reshape(-1, q.width)
    flat_vals = q.vals.reshape(-1, q.width)
    rows = jnp.arange(flat_ids.shape[0])[:, None]
    out = jnp.zeros((flat_ids.shape[0], q.vocab), q.vals.dtype)
    out = out.at[rows, flat_ids].add(flat_vals, mode='drop')
    return out.reshape(lead + (q.vocab,))


def q_at(q, x: jax.Array) -> jax.Array:
    """f32[...]: q's value at the ids `x` i32[...] (q's leading axes `[...]`)."""
    if not is_sparse(q):
        return jnp.take_along_axis(q, x[..., None], axis=-1)[..., 0]
    return jnp.sum(jnp.where(q.ids == x[..., None], q.vals, 0.0), axis=-1)


def residual_update(r: jax.Array, z: jax.Array, q, apply: jax.Array):
    """One rejection of the tree rule, on an unnormalised residual: `(r, z)` with
    `r` f32[V] ≥ 0 and `z = Σ r` stands for the law `r / z`; returns the pair for
    `norm(max(0, r/z − q))` where `apply`, else `(r, z)` unchanged (also where that residual
    has no mass: reachable only by a rejection of probability 0, as in `residual`).

    Dense `q` f32[V]: every id is touched (V). `SparseQ` (one row): only its W ids; `z` is
    still the exact sum of the new `r` (one reduction, no cancellation)."""
    if not is_sparse(q):
        new = jnp.maximum(r - z * q, 0.0)
        z_new = jnp.sum(new)
        ok = apply & (z_new > 0)
        return jnp.where(ok, new, r), jnp.where(ok, z_new, z)
    r_ids = r.at[q.ids].get(mode='fill', fill_value=0.0)
    new_ids = jnp.maximum(r_ids - z * q.vals, 0.0)
    cand = r.at[q.ids].set(new_ids, mode='drop')
    z_new = jnp.sum(cand)
    ok = apply & (z_new > 0)
    out = r.at[q.ids].set(jnp.where(ok, new_ids, r_ids), mode='drop')
    return out, jnp.where(ok, z_new, z)


def scaled_residual(p: jax.Array, w: jax.Array, q):
    """`(r, Σ r)` with `r = max(0, w·p − q)` f32[V] for one row (`w` a scalar in [0, 1]):
    block verification's residual after a weight `w` (`rules.block_verification`). A
    `SparseQ` row touches only its W ids (elsewhere q = 0 and r = w·p)."""
    if not is_sparse(q):
        r = jnp.maximum(w * p - q, 0.0)
        return r, jnp.sum(r)
    wp = w * p
    at = wp.at[q.ids].get(mode='fill', fill_value=0.0)
    r = wp.at[q.ids].set(jnp.maximum(at - q.vals, 0.0), mode='drop')
    return r, jnp.sum(r)


def check_q(q, what: str, allow_zero_rows: bool = True) -> None:
    """`specjax.runtime.debug`'s distribution check (rows summing to 1, or all-zero padding)."""
    if is_sparse(q):
        debug.check_distribution(q.vals, what, allow_zero_rows=allow_zero_rows)
        debug.check(jnp.all((q.ids >= 0) & (q.ids <= q.vocab)), f'{what}: an id outside [0, V]')
    else:
        debug.check_distribution(q, what, allow_zero_rows=allow_zero_rows)
