"""The engine's state: the loop state of a speculative call (`DecodeState`), what a later
call continues from (`EngineState`: caches carried across plan steps and continuous-batching
refills), the per-row, per-drafter counters every round updates (`Counters`) and the
autoregressive loop's state (`ARState`). `specjax.engine.decode` runs the rounds over them.

Every struct is built by keyword (``kw_only``) and its arrays are typed with their shapes
(jaxtyping): the dimension names are B rows, K drafters, G the call's widest window γ, L the
token buffer, S slots per row, V the verifier's vocabulary. `check_shapes` (a struct's
``check()``) checks them against one binding of the names; it reads shapes and dtypes only,
so the loops call it while tracing (it adds nothing to a program) and tests call it on
results. Caches stay ``Any``: each model's cache is its own pytree.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from typing import Any

import jax
import jax.numpy as jnp
import jaxtyping
from flax import struct
from jaxtyping import Array, Bool, Float32, Int32, UInt32

from specjax.models.cache import half_set

__all__ = [
    "ARState",
    "Chains",
    "Counters",
    "DecodeState",
    "EngineState",
    "check_shapes",
    "count_round",
]


# The typed arrays of the engine's structs (jaxtyping), spelt as the docstrings spell shapes:
# i32_BK is i32[B, K]. Dimension names: B rows, K drafters, G the call's widest window γ, L
# the token buffer, S slots per row, V the verifier's vocabulary ("_": any size).
i32_B = Int32[Array, "B"]
i32_BK = Int32[Array, "B K"]
i32_BKG = Int32[Array, "B K G"]
i32_KB = Int32[Array, "K B"]
i32_BL = Int32[Array, "B L"]
i32_BS = Int32[Array, "B S"]
i32_BSG = Int32[Array, "B S G"]
f32_B = Float32[Array, "B"]
f32_ = Float32[Array, ""]
bool_B = Bool[Array, "B"]
bool_BS = Bool[Array, "B S"]
bool_V = Bool[Array, "V"]
keys_B = UInt32[Array, "B _"]
#: A budget: one for every row, or one per row.
i32_or_B = Int32[Array, ""] | Int32[Array, "B"]


@functools.cache
def _typed_fields(cls) -> dict:
    """{field: its annotation} of a struct class's fields typed with a jaxtyping array type
    (or a union of them, None allowed) or with another such struct."""
    hints = typing.get_type_hints(cls)
    out = {}
    for f in dataclasses.fields(cls):
        ann = hints[f.name]
        if _arms(ann) and all(issubclass(a, jaxtyping.AbstractArray) for a in _arms(ann)):
            out[f.name] = ann
        elif isinstance(ann, type) and dataclasses.is_dataclass(ann) and _typed_fields(ann):
            out[f.name] = ann
    return out


def _arms(ann) -> tuple:
    """The classes an annotation allows, None aside."""
    arms = typing.get_args(ann) if isinstance(ann, types.UnionType) else (ann,)
    return tuple(a for a in arms if isinstance(a, type) and a is not type(None))


def check_shapes(*structs) -> None:
    """Every typed array of `structs` (and of the structs they hold) against its annotation,
    each dimension name bound once across all of them (B is every struct's rows). Reads
    shapes and dtypes only: at trace time it adds nothing to the program.

    Raises:
      TypeError: naming the struct, the field, its annotation and what it holds.
    """
    with jaxtyping.jaxtyped("context"):
        for s in structs:
            _check(s)


def _check(s) -> None:
    for name, ann in _typed_fields(type(s)).items():
        value = getattr(s, name)
        if dataclasses.is_dataclass(ann):
            _check(value)
        elif value is None and isinstance(None, ann):
            continue
        elif not isinstance(value, ann):
            got = getattr(value, "dtype", type(value).__name__)
            raise TypeError(
                f"{type(s).__name__}.{name}: got {got}{list(getattr(value, 'shape', ()))}; "
                f"allowed: {' or '.join(f'{a.dtypes[0]}[{a.dim_str}]' for a in _arms(ann))} "
                "(each dimension name one size across the checked structs)"
            )


def by_position(cls, values):
    """A struct of `cls` from its fields' values in field order: where a jitted program's
    positional arguments (its boundary, which `specjax.tpu` shards by position) become a
    struct."""
    return cls(**dict(zip((f.name for f in dataclasses.fields(cls)), values, strict=True)))


def zeros_of(cls, **sizes: int) -> dict:
    """Zeros for every typed array field of `cls`, each of its annotation's dtype and of
    the shape its dimension names take in `sizes` (e.g. B=2, K=3, G=4), by field name."""
    out = {}
    for name, ann in _typed_fields(cls).items():
        shape = tuple(sizes[d] for d in ann.dim_str.split())
        out[name] = jnp.zeros(shape, ann.dtypes[0])
    return out


@struct.dataclass(kw_only=True)
class Counters:
    """Per-row counters of SPEC §7, accumulated inside the graph (K = drafters).

    Attributes:
      rounds: i32[B] verifier calls (rounds) while the row was live.
      committed: i32[B] tokens committed.
      from_draft: i32[B] committed tokens that were drafts.
      reached: i32[B] shared-block positions verification reached.
      multi_rounds / multi_from_draft / multi_reached: the same over rounds in which ≥ 2
        drafters extended the row's committed prefix (joint acceptance).
      truncations: i32[B] chains cut at a rejection (their own, or in the naive shared block
        the block's cut), summed over the row's chains and rounds.
      discarded: i32[B] draft tokens those cuts discarded, the rejected one included
        (mean truncation depth = discarded / truncations, SPEC §7).
      pruned / pruned_discarded: i32[B] token-tree chains that left the path because a
        sibling's token was accepted, and the draft tokens they dropped (`pruned_depth`).
      proposed: i32[B, K] drafts proposed by each drafter (γ per round it took part in).
      accepted / rejected: i32[B, K] drafts accepted / rejections, attributed per drafter.
      own_accepted_at / own_reached_at: i32[B, K, γ] each drafter's chain tested alone
        against p with Leviathan's rule, per position (per-drafter α and independent-branch
        acceptance), under every rule.
      match_at / match_reached_at: i32[B, K, γ] coupled rules: each drafter's chain against
        the verifier's Gumbel-max tokens (`coupled_match_rate`); zero under other rules.
      catchups: i32[B, K] forwards each drafter ran for the row before the first round of
        a call that continues a state, to consume committed tokens it had not seen (a
        fallback step, a step it sat out): the catch-up passes the cost model charges.
      kept_expected / kept_rule1: f32[B] one-chain rules: the sum over the row's rounds of
        the drafts the round's block was expected to keep under the call's rule and under
        rule 1 (`rules.Verdict`); their difference is the rule's gain over rule 1 on the
        same blocks. 0 under multi-chain rules.
    """

    rounds: i32_B
    committed: i32_B
    from_draft: i32_B
    reached: i32_B
    multi_rounds: i32_B
    multi_from_draft: i32_B
    multi_reached: i32_B
    truncations: i32_B
    discarded: i32_B
    proposed: i32_BK
    accepted: i32_BK
    rejected: i32_BK
    own_accepted_at: i32_BKG
    own_reached_at: i32_BKG
    pruned: i32_B
    pruned_discarded: i32_B
    match_at: i32_BKG
    match_reached_at: i32_BKG
    catchups: i32_BK
    kept_expected: f32_B
    kept_rule1: f32_B

    @classmethod
    def zeros(cls, batch: int, n_drafters: int, gamma: int) -> "Counters":
        """Every counter 0, at B = `batch`, K = `n_drafters`, G = `gamma`."""
        return cls(**zeros_of(cls, B=batch, K=n_drafters, G=gamma))

    def check(self) -> None:
        """`check_shapes` of these counters."""
        check_shapes(self)


@struct.dataclass(kw_only=True)
class DecodeState:
    """The loop state of `generate` (B rows, K drafters, buffer length L).

    Attributes:
      tokens: i32[B, L] prompt then committed verifier tokens.
      length: i32[B] tokens in `tokens` (prompt included).
      start: i32[B] the prompt length of each row.
      done: bool[B].
      row_keys: u32[B, 2]-like key data, one stream per row.
      vcache: the verifier's cache; it holds tokens[:length-1] (the last is the next root).
      dcaches: tuple of K drafter caches, each in its own token ids.
      dsynced: i32[K, B] committed verifier tokens already in each drafter's cache.
      dlogits: tuple of K f32[B, Vd] the drafter's logits after its cached tokens.
      counters: Counters.
    """

    tokens: i32_BL
    length: i32_B
    start: i32_B
    done: bool_B
    row_keys: keys_B
    vcache: Any
    dcaches: tuple
    dsynced: i32_KB
    dlogits: tuple
    counters: Counters

    def check(self) -> None:
        """`check_shapes` of this state (its counters' K and B are its own)."""
        check_shapes(self)

    def carry(self) -> "EngineState":
        return EngineState(
            tokens=self.tokens,
            length=self.length,
            vcache=self.vcache,
            dcaches=self.dcaches,
            dsynced=self.dsynced,
            dlogits=self.dlogits,
        )


@struct.dataclass(kw_only=True)
class EngineState:
    """What a later call needs to continue its rows (caches carried across plan steps).

    Attributes:
      tokens: i32[B, L] prompt then committed verifier tokens (L fixed by the first call).
      length: i32[B] tokens in `tokens`.
      vcache: the verifier's cache, holding tokens[:length-1].
      dcaches / dlogits: per drafter (of the call that made it), its cache and its
        logits after its cached tokens; empty for a verifier-only state.
      dsynced: i32[K, B] committed verifier tokens already in each drafter's cache (a
        drafter behind `length` catches up at the start of the next call).
    """

    tokens: i32_BL
    length: i32_B
    vcache: Any
    dcaches: tuple
    dsynced: i32_KB
    dlogits: tuple

    def check(self) -> None:
        """`check_shapes` of this state."""
        check_shapes(self)

    def rows(self, idx) -> "EngineState":
        """The state of rows `idx` (i32[B']), e.g. a plan's committed branch copied into
        every branch row of the plan for its next step."""
        idx = jnp.asarray(idx, jnp.int32)
        take = lambda x: jnp.take(x, idx, axis=0)
        return EngineState(
            tokens=take(self.tokens),
            length=take(self.length),
            vcache=jax.tree.map(take, self.vcache),
            dcaches=jax.tree.map(take, self.dcaches),
            dsynced=jnp.take(self.dsynced, idx, axis=1),
            dlogits=jax.tree.map(take, self.dlogits),
        )

    def set_rows(self, idx, other: "EngineState") -> "EngineState":
        """This state with rows `idx` (i32[B']) replaced by the B' rows of `other`, e.g.
        new prompts prefilled into the rows a continuous batch freed
        (`specjax.engine.batching`); the inverse of `rows`.

        `other` must have this state's shapes but its row count (token buffer length,
        cache capacities, drafters). Indices ≥ B are dropped, so a refill padded to a
        fixed row count writes only its real rows (a negative index counts from the end,
        as in numpy). Jitted: one program per shape, in place when the caller donates the
        state."""
        return _set_rows(self, jnp.asarray(idx, jnp.int32), other)


@jax.jit
def _set_rows(state: EngineState, idx, other: EngineState) -> EngineState:
    put = lambda x, y: half_set(x, idx, y, mode='drop')
    return EngineState(
        tokens=put(state.tokens, other.tokens),
        length=put(state.length, other.length),
        vcache=jax.tree.map(put, state.vcache, other.vcache),
        dcaches=jax.tree.map(put, state.dcaches, other.dcaches),
        dsynced=state.dsynced.at[:, idx].set(other.dsynced, mode='drop'),
        dlogits=jax.tree.map(put, state.dlogits, other.dlogits),
    )


@struct.dataclass(kw_only=True)
class ARState:
    """The loop state of the autoregressive baseline (`specjax.engine.autoregressive`).

    Attributes:
      tokens: i32[B, L] prompt then generated tokens.
      length: i32[B] tokens in `tokens`.
      done: bool[B].
      vcache: the verifier's cache, holding tokens[:length-1].
    """

    tokens: i32_BL
    length: i32_B
    done: bool_B
    vcache: Any

    def check(self) -> None:
        """`check_shapes` of this state."""
        check_shapes(self)


@struct.dataclass(kw_only=True)
class Chains:
    """The chains a round's verifier scores, picked by each row's slots (G: the block's γ).

    Attributes:
      slots: i32[B, S] drafter indices per row in priority order, -1 = empty.
      chain: i32[B, S, G] each slot's drafts (0 in an empty slot).
      q: f32[B, S, G, V] or a `SparseQ` of that shape, the laws they were drawn from.
      active: bool[B, S] slots holding a drafter.
      slot_gamma: i32[B, S] each chain's γ_k.
    """

    slots: i32_BS
    chain: i32_BSG
    q: Any
    active: bool_BS
    slot_gamma: i32_BS


def count_round(
    c: Counters, v, chains: Chains, live, n_commit, *, n_drafters: int, coupled_rule: bool
) -> Counters:
    """The counters after one round's verdict `v` on `chains` (`specjax.engine.decode`):
    `live` bool[B] the rows the round ran, `n_commit` i32[B] the tokens each committed."""
    slots, active, slot_gamma = chains.slots, chains.active, chains.slot_gamma
    gamma = chains.chain.shape[2]
    li = live.astype(jnp.int32)
    n = v.n
    from_draft = jnp.minimum(n, n_commit)
    multi = (jnp.sum(active, 1) >= 2) & live
    cut = (v.cut_at < slot_gamma) & active & live[:, None]  # bool[B, S]
    pruned = (v.pruned_at < gamma) & active & live[:, None]

    def per_drafter(x):  # i32[B, S, ...] by slot → i32[B, K, ...] by drafter
        onehot = (slots[:, :, None] == jnp.arange(n_drafters)[None, None, :]) & active[:, :, None]
        onehot = (onehot & live[:, None, None]).astype(jnp.int32)
        onehot = onehot.reshape(onehot.shape + (1,) * (x.ndim - 2))
        # A masked sum, not an einsum: elementwise work XLA fuses (an einsum is a dot).
        return jnp.sum(onehot * x[:, :, None], axis=1)

    j = jnp.arange(gamma)
    f = v.own_first_rejection[:, :, None]
    exists = j[None, None, :] < slot_gamma[:, :, None]  # positions a chain has
    own_acc = (j[None, None, :] < f).astype(jnp.int32)
    own_reach = ((j[None, None, :] <= f) & exists).astype(jnp.int32)
    m = v.match_lead[:, :, None]
    match_acc = (j[None, None, :] < m).astype(jnp.int32) * coupled_rule
    match_reach = ((j[None, None, :] <= m) & exists).astype(jnp.int32) * coupled_rule
    return Counters(
        rounds=c.rounds + li,
        committed=c.committed + n_commit,
        from_draft=c.from_draft + from_draft * li,
        reached=c.reached + v.reached * li,
        multi_rounds=c.multi_rounds + multi,
        multi_from_draft=c.multi_from_draft + from_draft * multi,
        multi_reached=c.multi_reached + v.reached * multi,
        truncations=c.truncations + jnp.sum(cut, 1),
        discarded=c.discarded + jnp.sum((slot_gamma - v.cut_at) * cut, 1),
        proposed=c.proposed + per_drafter(slot_gamma),
        accepted=c.accepted + per_drafter(v.accepted),
        rejected=c.rejected + per_drafter(v.rejected),
        own_accepted_at=c.own_accepted_at + per_drafter(own_acc),
        own_reached_at=c.own_reached_at + per_drafter(own_reach),
        pruned=c.pruned + jnp.sum(pruned, 1),
        pruned_discarded=c.pruned_discarded + jnp.sum((gamma - v.pruned_at) * pruned, 1),
        match_at=c.match_at + per_drafter(match_acc),
        match_reached_at=c.match_reached_at + per_drafter(match_reach),
        catchups=c.catchups,
        kept_expected=c.kept_expected + v.kept_expected * live,
        kept_rule1=c.kept_rule1 + v.kept_rule1 * live,
    )
