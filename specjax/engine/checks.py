"""Host-side checks of a speculative call's inputs (one-line `ConfigError`s, before any
program runs): the slots, the drafters' γ, their vocabulary maps, and what each drafter's
kind needs from the verifier (`DrafterKind.check_verifier`) and what feature drafters
(`specjax.models.eagle`) need from a continued state."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from specjax.engine.features import reads_features
from specjax.engine.spec import DrafterData, DrafterSpec, EngineConfig, validate_drafter
from specjax.errors import ConfigError
from specjax.models.drafter_kinds import kind_of

__all__ = [
    "check_slots",
    "check_drafters",
    "check_vocab_maps",
    "check_features",
    "check_state_features",
]


def check_slots(cfg: EngineConfig, slots, rows: int, k: int) -> np.ndarray:
    """i32[rows, S] drafter slots (default every row uses drafters 0..S−1), checked."""
    if slots is None:
        if cfg.n_slots > k:
            raise ConfigError(f"n_slots: got {cfg.n_slots}; allowed: ≤ {k} drafters")
        slots = np.tile(np.arange(cfg.n_slots, dtype=np.int32), (rows, 1))
    slots = np.asarray(slots, np.int32)
    if slots.shape != (rows, cfg.n_slots) or (slots >= k).any() or (slots < -1).any():
        raise ConfigError(
            f"slots: got shape {slots.shape} with values in "
            f"[{slots.min()}, {slots.max()}]; allowed: shape ({rows}, "
            f"{cfg.n_slots}) with drafter indices in [-1, {k - 1}]"
        )
    if not (slots >= 0).any(axis=1).all():
        raise ConfigError("slots: a row has no drafter; allowed: ≥ 1 drafter per row")
    return slots


def check_drafters(cfg: EngineConfig, drafters: Sequence[DrafterSpec]) -> list[int]:
    """Each drafter's γ_i (checked: valid specs, equal γ where drafters share a row)."""
    for d in drafters:
        validate_drafter(d)
    windows = [d.gamma if d.gamma is not None else cfg.gamma for d in drafters]
    if cfg.n_slots > 1 and len(set(windows)) > 1:
        raise ConfigError(
            f"gamma: drafters {[d.name for d in drafters]} have γ {windows} "
            f"with rule {cfg.rule!r} over {cfg.n_slots} slots; allowed: equal "
            "γ for drafters that share a row (per-drafter γ needs one chain "
            "per row)"
        )
    return windows


def check_vocab_maps(drafters: Sequence[DrafterSpec], d_data: Sequence[DrafterData]) -> None:
    """ConfigError unless each drafter's vocabulary map covers its model's vocabulary."""
    for spec, data in zip(drafters, d_data):
        if int(data.to_verifier.shape[0]) != spec.lm.vocab_size:
            raise ConfigError(
                f"drafter {spec.name!r} vocabulary: map covers "
                f"{data.to_verifier.shape[0]} ids, model has "
                f"{spec.lm.vocab_size}; allowed: equal sizes"
            )


def check_features(verifier, drafters: Sequence[DrafterSpec]) -> None:
    """ConfigError unless the verifier can serve each drafter as its kind needs (a feature
    drafter: the verifier's hidden states, `forward_hidden`, at the width it reads; its
    kind's `check_verifier`)."""
    for d in drafters:
        kind_of(d.lm).check_verifier(d.lm, verifier, d.name)


def check_state_features(drafters, state) -> None:
    """ConfigError where a feature drafter lacks the verifier's features of committed
    tokens it has not read (tokens committed outside speculative rounds)."""
    need = np.asarray(state.length) - 1
    for k, d in enumerate(drafters):
        if reads_features(d) and np.any(np.asarray(state.dcaches[k].vlen) < need):
            raise ConfigError(
                f"state: drafter {k} ({type(d.lm).__name__}) reads the verifier's features "
                "and lacks those of tokens committed outside speculative rounds; allowed: "
                "continue a state made by speculative calls with it"
            )
