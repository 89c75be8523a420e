"""γ, the draft window: one validation, one per-drafter resolution, one widest window.

Spelling, everywhere: ``gamma`` is a scalar γ (the config's: what a block of several drafters
drafts per chain); ``gammas`` is one γ_i per drafter, ``None`` meaning the config's γ
(`grid.drafter_gamma`, `DrafterSpec.gamma`). A drafter's own γ_i applies where it drafts one
chain per row; drafters sharing a block draft the config's γ.

It sits in the engine, whose draft window γ is, so the engine, the policy layer and the
runner above it all read γ the same way.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence

from specjax.errors import ConfigError


def is_gamma(value, hi: int | None = None) -> bool:
    """Whether `value` is a γ: an integer ≥ 1 (not a bool), and ≤ `hi` when given."""
    return (
        isinstance(value, numbers.Integral)
        and not isinstance(value, bool)
        and value >= 1
        and (hi is None or value <= hi)
    )


def check_gamma(value, field: str = "gamma", hi: int | None = None) -> int:
    """`value` as a γ (`is_gamma`), else a ConfigError naming `field`."""
    if not is_gamma(value, hi):
        allowed = "an integer >= 1" + (f" and <= {hi}" if hi is not None else "")
        raise ConfigError.invalid(field, value, allowed)
    return int(value)


def drafter_gammas(
    gamma: int,
    gammas: Sequence[int | None] | None,
    drafters: Sequence[str] | int | None = None,
    field: str = "gammas",
    hi: int | None = None,
) -> tuple[int, ...]:
    """Each drafter's own γ_i, `gamma` where it has none (``gammas`` None: every drafter's).

    Args:
      gamma: the config's γ.
      gammas: one γ_i (or None) per drafter, or None.
      drafters: the drafters' names, or their number (required when `gammas` is None;
        the length of `gammas` is checked against it when given).
      field: the name a ConfigError gives the per-drafter values.
      hi: the largest γ_i allowed, if any.
    """
    gamma = check_gamma(gamma, "gamma", hi)
    n = drafters if isinstance(drafters, int) or drafters is None else len(drafters)
    if gammas is None:
        if n is None:
            raise ValueError("drafter_gammas: give gammas or the drafters")
        return (gamma,) * n
    gammas = list(gammas)
    if n is not None and len(gammas) != n:
        whose = f"({n})" if isinstance(drafters, int) else f"of the pairing {list(drafters)}"
        raise ConfigError.invalid(field, gammas, f"one γ_i per drafter {whose}")
    return tuple(gamma if g is None else check_gamma(g, field, hi) for g in gammas)


def widest_gamma(gamma: int, gammas: Sequence[int | None] | None = None) -> int:
    """The widest window a run drafts: the config's γ or a drafter's own γ_i, whichever is
    larger (what carried state and context budgets are sized for)."""
    if gammas is None:
        return check_gamma(gamma)
    return max((check_gamma(gamma),) + drafter_gammas(gamma, gammas))
