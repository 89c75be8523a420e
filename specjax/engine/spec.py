"""Static and dynamic descriptions of a speculative run: who drafts, who verifies, how.

Static parts are frozen, hashable dataclasses passed to `jax.jit` as static arguments
(changing them retraces, by design); array parts are pytrees (changing them does not).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from specjax.engine.gammas import check_gamma
from specjax.errors import ConfigError
from specjax.models.drafter_kinds import kind_of
from specjax.verify import registry


@dataclasses.dataclass(frozen=True)
class DrafterSpec:
    """One drafter, as configured (host side).

    Only its `static` part is compiled into a program; the temperature travels as an
    array (`DrafterData.temperature`) and the cost never enters the engine (it is the
    cost model's), so a new temperature or cost reuses the compiled program.

    Attributes:
        name: the drafter's name in metrics and configs.
        lm: its functional LM (ARCHITECTURE.md), in its own token ids.
        temperature: its sampling temperature τ_i ≥ 0 (0 = greedy).
        top_k / top_p: optional filtering; `q` is always the filtered distribution.
        cost: c_i, its per-token cost relative to one verifier call (cost model).
        gamma: γ_i, its draft tokens per round (SPEC §2); None = the engine config's γ.
    """

    name: str
    lm: Any
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    cost: float = 0.0
    gamma: int | None = None

    @property
    def static(self) -> "DrafterStatic":
        """What a compiled program depends on (hashable; passed to `jax.jit` as static)."""
        return DrafterStatic(lm=self.lm, top_k=self.top_k, top_p=self.top_p, gamma=self.gamma)


@dataclasses.dataclass(frozen=True)
class DrafterStatic:
    """The compiled part of a drafter: its model, its filtering and its γ_i (None = the
    engine config's). Name, temperature and cost are not in it (see `DrafterSpec`)."""

    lm: Any
    top_k: int = 0
    top_p: float = 1.0
    gamma: int | None = None
    #: the index of an earlier drafter of the same call with this model, filters, γ and
    #: the very same arrays (`share_drafting`): the two draft in one batched pass, their
    #: draws independent (a tree of several samples from one drafter, SpecInfer-style).
    shares: int | None = None

    def own_gamma(self, default: int) -> int:
        """γ_i: this drafter's draft tokens per round (`default`, the config's γ, if None)."""
        return default if self.gamma is None else self.gamma


def share_drafting(statics: Sequence[DrafterStatic], d_data: Sequence[Any]) -> tuple:
    """The statics with `DrafterStatic.shares` set: drafter k shares the first earlier
    drafter whose static part is equal and whose arrays (all but the temperature) are the
    same objects — the same drafter named twice, e.g. ``subset(['eagle', 'eagle'])``.

    The engine then consumes and drafts the group in one batched pass (`vmap` over its
    members: each weight read once for all of them), each member with its own uniforms,
    cache and temperature, so the draws and every rule are as if they drafted apart.
    """

    def arrays(data):
        return jax.tree_util.tree_flatten(data.replace(temperature=None))

    out, seen = [], []
    for k, (st, data) in enumerate(zip(statics, d_data)):
        st = dataclasses.replace(st, shares=None)
        leaves, tree = arrays(data)
        lead = next(
            (
                j
                for j, (st_j, leaves_j, tree_j) in seen
                if st_j == st
                and tree_j == tree
                and len(leaves_j) == len(leaves)
                and all(a is b for a, b in zip(leaves_j, leaves))
            ),
            None,
        )
        if lead is None:
            seen.append((k, (st, leaves, tree)))
        out.append(dataclasses.replace(st, shares=lead))
    return tuple(out)


def widest_chain(gamma: int, drafters) -> int:
    """The longest chain a call drafts: the largest γ_i of its drafters (the config's γ
    for those without one). `specjax.engine.gammas.widest_gamma` also counts the config's γ."""
    return max(d.own_gamma(gamma) for d in drafters)


@struct.dataclass
class DrafterData:
    """One drafter's arrays (dynamic).

    Attributes:
        params: the drafter's parameters.
        to_verifier: i32[Vd] verifier id with identical bytes, or -1 (rule 3's intersection).
        from_verifier: i32[Vv] the inverse on the intersection, or -1.
        retok: i32[Vv, M] the drafter's tokenisation of each verifier token's bytes.
        retok_len: i32[Vv] its length (1..M).
        temperature: f32[] the sampling temperature as an array (`speculative_generate`
            sets it from the spec, so a temperature sweep reuses one compiled program).
        identity: static; True when the maps are the identity (the drafter shares the
            verifier's tokenizer), so drafting skips the moves between vocabularies.
        support: optional i32[K], with identity maps: the only ids the drafter's logits
            can give mass to (a head over the verifier's K most frequent ids, FR-Spec:
            `feature_maps`); each draft is then drawn from its K probabilities and only
            ``q`` is scattered into the verifier's ids.
        injective: static; True when ``to_verifier`` sends distinct drafter ids to distinct
            verifier ids (a vocabulary mapped one-to-one, −1 aside), so its law in verifier
            ids is its own probabilities on those ids (`specjax.verify.qlaw.SparseQ`).
    """

    params: Any
    to_verifier: jax.Array
    from_verifier: jax.Array
    retok: jax.Array
    retok_len: jax.Array
    temperature: Any = None
    identity: bool = struct.field(pytree_node=False, default=False)
    support: Any = None
    injective: bool = struct.field(pytree_node=False, default=False)


def identity_maps(params, vocab: int) -> DrafterData:
    """DrafterData for a drafter that shares the verifier's tokenizer."""
    ids = jnp.arange(vocab, dtype=jnp.int32)
    return DrafterData(
        params=params,
        to_verifier=ids,
        from_verifier=ids,
        retok=ids[:, None],
        retok_len=jnp.ones((vocab,), jnp.int32),
        identity=True,
    )


def feature_maps(params, vocab: int) -> DrafterData:
    """DrafterData for a feature drafter (`specjax.models.eagle.EagleLM`): identity maps,
    and its head's ids ``params['keep']`` as the support its drafts are drawn over
    (`drafting_maps` of its kind's `Drafting`)."""
    return _support_maps(params, params['keep'], vocab, "feature drafter params['keep']")


def _support_maps(params, support, vocab: int, what: str) -> DrafterData:
    """Identity maps, drafts drawn over the distinct verifier ids ``support``."""
    return identity_maps(params, vocab).replace(support=_distinct_ids(support, what, vocab))


def drafting_maps(lm, params, vocab: int) -> tuple[Any, DrafterData]:
    """``(lm', DrafterData)`` for a drafter of the verifier's tokenizer, as its kind drafts
    (`specjax.models.drafter_kinds.kind_of(lm).drafting`): the model the engine runs and
    its maps — identity maps, drawn over a head's ids where it has a support (a feature
    drafter), or its own ids mapped one-to-one into the verifier's (a subset-vocabulary
    drafter: `own_id_maps`)."""
    kind = kind_of(lm)
    form = kind.drafting(lm, params)
    what = f"drafter kind {kind.name!r}: its ids"
    if form.to_verifier is not None:
        return form.lm, own_id_maps(form.params, form.to_verifier, form.from_verifier, what)
    if form.support is not None:
        return form.lm, _support_maps(form.params, form.support, vocab, what)
    return form.lm, identity_maps(form.params, vocab)


def _distinct_ids(ids, what: str, vocab: int | None = None) -> jax.Array:
    """i32 ids, checked on the host to be distinct (and in [0, vocab)): a drafter's law is
    then its probabilities on them (`SparseQ`'s contract)."""
    ids_np = np.asarray(ids)
    if ids_np.ndim != 1 or np.unique(ids_np).size != ids_np.size:
        raise ConfigError(f"{what}: got {ids_np.size} ids with repeats; allowed: distinct ids")
    if vocab is not None and ids_np.size and not (0 <= ids_np.min() and ids_np.max() < vocab):
        raise ConfigError(
            f"{what}: got ids in [{ids_np.min()}, {ids_np.max()}]; allowed: [0, {vocab})"
        )
    return jnp.asarray(ids_np, jnp.int32)


def cross_vocab_maps(
    params, to_verifier: np.ndarray, retok: np.ndarray, retok_len: np.ndarray, verifier_vocab: int
) -> DrafterData:
    """DrafterData for a drafter with another tokenizer (token-level intersection, TLI)."""
    to_verifier = np.asarray(to_verifier, np.int32)
    if not (to_verifier >= 0).any():
        raise ConfigError(
            "drafter vocabulary: it shares no token with the verifier's "
            "(token-level intersection is empty); cross-vocabulary drafting "
            "needs at least one token with identical bytes"
        )
    from_verifier = np.full((verifier_vocab,), -1, np.int32)
    ok = to_verifier >= 0
    from_verifier[to_verifier[ok]] = np.nonzero(ok)[0]
    return DrafterData(
        params=params,
        to_verifier=jnp.asarray(to_verifier),
        from_verifier=jnp.asarray(from_verifier),
        retok=jnp.asarray(retok, jnp.int32),
        retok_len=jnp.asarray(retok_len, jnp.int32),
        injective=bool(np.unique(to_verifier[ok]).size == ok.sum()),
    )


def own_id_maps(params, to_verifier, from_verifier, what: str = 'own ids') -> DrafterData:
    """DrafterData for a drafter of the verifier's tokenizer drafting in ids of its own
    (a `SubsetVocabLM`, FR-Spec: its inner transformer over ``K + 1`` ids): ``to_verifier``
    i32[Vd] maps its id i to a distinct verifier id (-1: never proposed, its "other" row),
    ``from_verifier`` i32[V] is the id each verifier token is read as; every verifier
    token is one piece (``retok`` = ``from_verifier``, so each verifier id stays spellable,
    as with identity maps). The engine then draws each draft from the drafter's own
    probabilities and scatters only ``q`` into the verifier's ids; the law of every draft
    and ``q`` are those of the drafter over the verifier's ids.
    """
    to_v = np.asarray(to_verifier)
    _distinct_ids(to_v[to_v >= 0], what)
    from_v = jnp.asarray(from_verifier, jnp.int32)
    return DrafterData(
        params=params,
        to_verifier=jnp.asarray(to_verifier, jnp.int32),
        from_verifier=from_v,
        retok=from_v[:, None],
        retok_len=jnp.ones(from_v.shape, jnp.int32),
        injective=True,  # distinct verifier ids, checked above
    )


Q_LAYOUTS = ("dense", "sparse")


@dataclasses.dataclass(frozen=True)
class EngineConfig:
    """How a batch is decoded (static).

    Attributes:
        gamma: γ, draft tokens per chain per round (≥ 1).
        rule: a registered rule's name (`specjax.verify.registry.names()`: 'rejection',
            'token_tree', 'shared_block', 'coupled', 'coupled_block', 'block_verification',
            'traversal'); a one-chain rule needs `n_slots` 1.
        verifier_temperature: τ of the verifier (0 = greedy).
        n_slots: S, chains per row in the verifier's block (the row's drafters, in priority
            order; a row may leave slots empty).
        max_new_tokens: tokens generated per row before it stops.
        verifier_top_k / verifier_top_p: optional filtering of the verifier's distribution.
        q_layout: how each draft's law `q` travels to the rule: 'dense' (f32 over the
            verifier's V ids) or 'sparse' (`specjax.verify.qlaw.SparseQ`, on the ids a
            drafter can propose, where every drafter of the call has such a set: a head
            over K ids, prompt lookup, a one-to-one vocabulary map; dense otherwise). The
            same law either way; on XLA:CPU dense is as fast at batch 1 and faster at
            batch 8 (its scatters), sparse moves B·S·γ·K numbers instead of B·S·γ·V.
    """

    gamma: int = 4
    rule: str = "rejection"
    verifier_temperature: float = 1.0
    n_slots: int = 1
    max_new_tokens: int = 32
    verifier_top_k: int = 0
    verifier_top_p: float = 1.0
    q_layout: str = "dense"

    def __post_init__(self):
        validate_engine_config(self)


def validate_engine_config(c: EngineConfig) -> None:
    """Raises ConfigError naming the field, the value and what is allowed."""
    check_gamma(c.gamma, "gamma")
    rule = registry.get(c.rule)  # ConfigError naming the registered rules
    if not (math.isfinite(c.verifier_temperature) and c.verifier_temperature >= 0):
        raise ConfigError(
            f"verifier_temperature: got {c.verifier_temperature!r}; allowed: a finite number ≥ 0"
        )
    if not isinstance(c.n_slots, int) or c.n_slots < 1:
        raise ConfigError(f"n_slots: got {c.n_slots!r}; allowed: an integer ≥ 1")
    if not rule.allows_slots(c.n_slots):
        several = [r.name for r in registry.all_rules() if r.allows_slots(2)]
        raise ConfigError(
            f"n_slots: got {c.n_slots} with rule {c.rule!r}; allowed: {rule.chains} "
            f"(rules of several drafters per row: {', '.join(several)})"
        )
    if not isinstance(c.max_new_tokens, int) or c.max_new_tokens < 1:
        raise ConfigError(f"max_new_tokens: got {c.max_new_tokens!r}; allowed: an integer ≥ 1")
    if not (0 < c.verifier_top_p <= 1):
        raise ConfigError(f"verifier_top_p: got {c.verifier_top_p!r}; allowed: (0, 1]")
    if c.q_layout not in Q_LAYOUTS:
        raise ConfigError(f"q_layout: got {c.q_layout!r}; allowed: one of {', '.join(Q_LAYOUTS)}")


def validate_drafter(d: DrafterSpec) -> None:
    if not (math.isfinite(d.temperature) and d.temperature >= 0):
        raise ConfigError(
            f"drafter {d.name!r} temperature: got {d.temperature!r}; allowed: a finite number ≥ 0"
        )
    if not (0 < d.top_p <= 1):
        raise ConfigError(f"drafter {d.name!r} top_p: got {d.top_p!r}; allowed: (0, 1]")
    if d.top_k < 0:
        raise ConfigError(f"drafter {d.name!r} top_k: got {d.top_k!r}; allowed: ≥ 0")
    if not (math.isfinite(d.cost) and d.cost >= 0):
        raise ConfigError(f"drafter {d.name!r} cost: got {d.cost!r}; allowed: ≥ 0")
    if d.gamma is not None:
        check_gamma(d.gamma, f"drafter {d.name!r} gamma")
