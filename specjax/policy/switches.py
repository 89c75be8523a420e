"""The four policy switches (SPEC §4): the seed's conditions 1–4, one switch each.

A `Policy` is a frozen, hashable dataclass, so it can be passed to `jax.jit` as a static
argument and used as a key in sweeps. Every one of the 16 combinations has a name that
round-trips through `Policy.from_name`:

    * ``naive`` — all off (the seed's naive deployment);
    * ``all_on`` — all on (``kl_ceiling`` = 0.35 nats);
    * ``all_on_minus_<switch>`` — all on but one (the ablation of one invariant);
    * ``naive_plus_<switch>`` — all off but one;
    * ``p<0|1>t<0|1>a<0|1>k<0|1>`` — the 4-bit code, in switch order (prefix partitioning,
        truncate and attribute, agreement-weighted consensus, KL ceiling), for any of the 16.

A KL ceiling other than the default is appended as ``_kl<value>`` (e.g. ``all_on_kl0.5``).

Example:
    >>> Policy.from_name('all_on_minus_kl_ceiling').code
    'p1t1a1k0'
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import numbers
import re

from specjax.errors import ConfigError
from specjax.field_report import KL_CEILING  # nats, the field report's

# Switch names in code order; the code letter is the first letter of each.
SWITCHES = (
    "prefix_partitioning",
    "truncate_and_attribute",
    "agreement_weighted_consensus",
    "kl_ceiling",
)
_CODE_LETTERS = ("p", "t", "a", "k")
_CODE_RE = re.compile(r"^p([01])t([01])a([01])k([01])$")
_KL_SUFFIX_RE = re.compile(r"^(?P<base>.+)_kl(?P<value>[0-9][0-9.eE+\-]*)$")


@dataclasses.dataclass(frozen=True)
class Policy:
    """Which of the seed's four invariants a run enforces.

    Attributes:
        prefix_partitioning: switch 1. On: a branch commits only tokens proposed by drafters
            of its own tokenizer group. Off: every drafter extends one shared prefix.
        truncate_and_attribute: switch 2. On: token-tree verification (recursive rejection
            sampling), each chain truncated at its own first rejection, which is attributed to
            its proposer. Off: the naive shared block, cut for every drafter at the first
            position where any chain was rejected.
        agreement_weighted_consensus: switch 3. On: a branch's vote weight is
            accepted / (accepted + rejected). Off: raw acceptance, accepted / proposed.
        kl_ceiling: switch 4, in nats; ``None`` means off. On: drafters whose pairwise KL on
            the shared prefix exceeds the ceiling do not share a prefix. Must be finite and > 0.
    """

    prefix_partitioning: bool = False
    truncate_and_attribute: bool = False
    agreement_weighted_consensus: bool = False
    kl_ceiling: float | None = None

    def __post_init__(self):
        for field in SWITCHES[:3]:
            value = getattr(self, field)
            if not isinstance(value, bool):
                raise ConfigError.invalid(f"policy.{field}", value, "True or False")
        ceiling = self.kl_ceiling
        if ceiling is None:
            return
        # bool is an int subclass: True as a ceiling is almost certainly a mistake.
        if (
            isinstance(ceiling, bool)
            or not isinstance(ceiling, numbers.Real)
            or not (math.isfinite(ceiling) and ceiling > 0)
        ):
            raise ConfigError.invalid("policy.kl_ceiling", ceiling, _ALLOWED_CEILING)
        # Normalise ints (and numpy floats) so that equal policies hash equal.
        object.__setattr__(self, "kl_ceiling", float(ceiling))

    # ---------------------------------------------------------------- presets

    @classmethod
    def naive(cls) -> Policy:
        """All four switches off: the seed's naive deployment."""
        return cls()

    @classmethod
    def all_on(cls, kl_ceiling: float = KL_CEILING) -> Policy:
        """All four invariants enforced."""
        return cls(True, True, True, kl_ceiling)

    @classmethod
    def from_bits(
        cls, bits: tuple[bool, bool, bool, bool], kl_ceiling: float = KL_CEILING
    ) -> Policy:
        """Builds a policy from four booleans in switch order (p, t, a, k)."""
        p, t, a, k = (bool(b) for b in bits)
        return cls(p, t, a, kl_ceiling if k else None)

    @classmethod
    def from_name(cls, name: str) -> Policy:
        """Parses any name that `Policy.name` produces (see the module docstring).

        Raises:
            ConfigError (a ValueError): naming the string and the accepted forms.
        """
        if not isinstance(name, str):
            raise ConfigError.invalid("policy", name, _ALLOWED_NAMES)
        ceiling = KL_CEILING
        base = name.strip()
        match = _KL_SUFFIX_RE.match(base)
        if match:
            try:
                ceiling = float(match.group("value"))
            except ValueError:
                raise ConfigError.invalid("policy", name, _ALLOWED_NAMES) from None
            base = match.group("base")
        bits = _bits_from_base(base)
        # A '_kl<nats>' suffix needs the KL switch on.
        if bits is None or (match and not bits[3]):
            raise ConfigError.invalid("policy", name, _ALLOWED_NAMES)
        return cls.from_bits(bits, kl_ceiling=ceiling)

    # ---------------------------------------------------------------- views

    @property
    def bits(self) -> tuple[bool, bool, bool, bool]:
        """The four switches as booleans, in switch order (p, t, a, k)."""
        return (
            self.prefix_partitioning,
            self.truncate_and_attribute,
            self.agreement_weighted_consensus,
            self.kl_ceiling is not None,
        )

    @property
    def code(self) -> str:
        """The 4-bit code, e.g. ``'p1t0a1k0'`` (ignores a non-default ceiling value)."""
        return "".join(f"{c}{int(b)}" for c, b in zip(_CODE_LETTERS, self.bits))

    @property
    def name(self) -> str:
        """A readable name that `from_name` maps back to this exact policy."""
        bits = self.bits
        on = [s for s, b in zip(SWITCHES, bits) if b]
        off = [s for s, b in zip(SWITCHES, bits) if not b]
        if not on:
            base = "naive"
        elif not off:
            base = "all_on"
        elif len(off) == 1:
            base = f"all_on_minus_{off[0]}"
        elif len(on) == 1:
            base = f"naive_plus_{on[0]}"
        else:
            base = self.code
        if self.kl_ceiling is not None and self.kl_ceiling != KL_CEILING:
            base += f"_kl{self.kl_ceiling!r}"
        return base

    @property
    def switches_on(self) -> tuple[str, ...]:
        """Names of the switches that are on, in switch order."""
        return tuple(s for s, b in zip(SWITCHES, self.bits) if b)

    def to_dict(self) -> dict:
        """The four switches as a plain dict (JSON rows); `Policy(**d)` rebuilds it."""
        return dataclasses.asdict(self)

    def replace(self, **changes) -> Policy:
        """A copy with some switches changed (validated like the constructor)."""
        return dataclasses.replace(self, **changes)


def all_combinations(kl_ceiling: float = KL_CEILING) -> list[Policy]:
    """All 16 policies, in code order: ``p0t0a0k0`` (naive) first, ``p1t1a1k1`` last."""
    return [
        Policy.from_bits(bits, kl_ceiling=kl_ceiling)
        for bits in itertools.product((False, True), repeat=4)
    ]


_ALLOWED_CEILING = f"None (off) or a finite float > 0, in nats (default when on: {KL_CEILING})"
_ALLOWED_NAMES = (
    "'naive', 'all_on', 'all_on_minus_<switch>', 'naive_plus_<switch>' with "
    f"<switch> one of {', '.join(SWITCHES)}, or a code 'p<0|1>t<0|1>a<0|1>k<0|1>' "
    "(e.g. 'p1t1a0k1'); any of them with the KL switch on may end in '_kl<nats>' "
    "(e.g. 'all_on_kl0.5')."
)


def _bits_from_base(base: str) -> tuple[bool, bool, bool, bool] | None:
    if base == "naive":
        return (False,) * 4
    if base == "all_on":
        return (True,) * 4
    for prefix, default in (("all_on_minus_", True), ("naive_plus_", False)):
        if base.startswith(prefix):
            switch = base[len(prefix) :]
            if switch not in SWITCHES:
                return None
            return tuple(  # type: ignore[return-value]
                (not default) if s == switch else default for s in SWITCHES
            )
    match = _CODE_RE.match(base)
    if match:
        return tuple(g == "1" for g in match.groups())  # type: ignore[return-value]
    return None
