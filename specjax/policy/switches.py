"""The policy switches (SPEC §4): the seed's conditions 1–4, one switch each, as one table.

`TABLE` is the only place a switch is described: its name, its letter in a policy code,
what it means, its values off and on and, for a switch that carries a value (the KL
ceiling), how that value is checked and spelt. `Policy`, its names, codes and combinations
are built from the table, so adding a switch is one `Switch` entry (plus the code that acts
on it, where the layout or the step decision reads `policy.<name>`).

A `Policy` is a frozen, hashable dataclass with one field per switch, in table order, so it
can be passed to `jax.jit` as a static argument and used as a key in sweeps. Every
combination has a name that round-trips through `Policy.from_name`:

    * ``naive`` — all off (the seed's naive deployment);
    * ``all_on`` — all on (``kl_ceiling`` = 0.35 nats);
    * ``all_on_minus_<switch>`` — all on but one (the ablation of one invariant);
    * ``naive_plus_<switch>`` — all off but one;
    * the code, e.g. ``p1t0a1k0``: each switch's letter and 0 or 1, in table order, for any
        combination. A code names at least the first `CODE_MIN` switches (the field
        report's four, the codes stored in results before any later switch existed); the
        switches after its end are off, and the canonical code stops after the last one
        that is on (at least `CODE_MIN`), so a stored code keeps its meaning and spelling.

A value other than the default of a switch that carries one is appended as
``_<suffix><value>`` (e.g. ``all_on_kl0.5``).

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
from typing import Any, Callable

from specjax.errors import ConfigError
from specjax.field_report import KL_CEILING  # nats, the field report's


def _check_bool(field: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ConfigError.invalid(f"policy.{field}", value, "True or False")
    return value


_ALLOWED_CEILING = f"None (off) or a finite float > 0, in nats (default when on: {KL_CEILING})"


def _check_ceiling(field: str, value: Any) -> float | None:
    if value is None:
        return None
    # bool is an int subclass: True as a ceiling is almost certainly a mistake.
    if (
        isinstance(value, bool)
        or not isinstance(value, numbers.Real)
        or not (math.isfinite(value) and value > 0)
    ):
        raise ConfigError.invalid(f"policy.{field}", value, _ALLOWED_CEILING)
    # Normalise ints (and numpy floats) so that equal policies hash equal.
    return float(value)


@dataclasses.dataclass(frozen=True)
class Switch:
    """One switch: a row of `TABLE`.

    Attributes:
        name: the `Policy` field and the name in ``all_on_minus_<name>`` / ``naive_plus_<name>``.
        letter: its letter in a policy code (distinct across the table).
        doc: what it does on and off.
        off / on: its value when off and its default value when on (a bool switch: False /
            True; a switch with a value: None / the default value).
        check: `(field, value) -> value`, validates a value (ConfigError) and normalises it.
        suffix: for a switch with a value, the name suffix of a non-default value
            (``_<suffix><value>``); None for a bool switch.
    """

    name: str
    letter: str
    doc: str
    off: Any = False
    on: Any = True
    check: Callable[[str, Any], Any] = _check_bool
    suffix: str | None = None

    def is_on(self, value: Any) -> bool:
        return value is not None and value is not False


#: The switches, in code order.
TABLE: tuple[Switch, ...] = (
    Switch(
        "prefix_partitioning",
        "p",
        "switch 1. On: a branch commits only tokens proposed by drafters of its own "
        "tokenizer group. Off: every drafter extends one shared prefix.",
    ),
    Switch(
        "truncate_and_attribute",
        "t",
        "switch 2. On: token-tree verification (the plan's tree rule, recursive rejection "
        "sampling by default), each chain truncated at its own first rejection, which is "
        "attributed to its proposer. Off: the rule's naive twin, the shared block cut for "
        "every drafter at the first position where any chain was rejected.",
    ),
    Switch(
        "agreement_weighted_consensus",
        "a",
        "switch 3. On: a branch's vote weight is accepted / (accepted + rejected). Off: raw "
        "acceptance, accepted / proposed.",
    ),
    Switch(
        "kl_ceiling",
        "k",
        "switch 4, in nats; None means off. On: drafters whose pairwise KL on the shared "
        "prefix exceeds the ceiling do not share a prefix. Must be finite and > 0.",
        off=None,
        on=KL_CEILING,
        check=_check_ceiling,
        suffix="kl",
    ),
)
#: Switch names in code order.
SWITCHES = tuple(s.name for s in TABLE)
#: Every code (and every stored policy: a code, a dict) names at least the first CODE_MIN
#: switches; a later switch missing from a stored one is off.
CODE_MIN = 4
_BY_LETTER = {s.letter: s for s in TABLE}
_BY_SUFFIX = {s.suffix: s for s in TABLE if s.suffix}
_PAIR_RE = re.compile(r"([a-z])([01])")
_SUFFIX_RE = re.compile(r"^(?P<base>.+)_(?P<suffix>[a-z]+)(?P<value>[0-9][0-9.eE+\-]*)$")
assert len(_BY_LETTER) == len(TABLE), "switch letters must be distinct"


class _PolicyMethods:
    """`Policy`'s methods (its fields come from `TABLE`)."""

    def __post_init__(self):
        for s in TABLE:
            object.__setattr__(self, s.name, s.check(s.name, getattr(self, s.name)))

    # ---------------------------------------------------------------- presets

    @classmethod
    def naive(cls):
        """Every switch off: the seed's naive deployment."""
        return cls()

    @classmethod
    def all_on(cls, **values):
        """Every invariant enforced (`values`: a switch's value other than its default)."""
        return cls.from_bits((True,) * len(TABLE), **values)

    @classmethod
    def from_bits(cls, bits, **values):
        """Builds a policy from booleans in switch order (missing trailing ones: off);
        `values` gives an on switch's value other than its default (``kl_ceiling=0.5``)."""
        bits = tuple(bool(b) for b in bits) + (False,) * (len(TABLE) - len(bits))
        if len(bits) != len(TABLE):
            raise ValueError(f"from_bits: got {len(bits)} bits for {len(TABLE)} switches")
        unknown = set(values) - set(SWITCHES)
        if unknown:
            raise TypeError(f"from_bits: unknown switches {sorted(unknown)}")
        return cls(
            **{s.name: (values.get(s.name, s.on) if b else s.off) for s, b in zip(TABLE, bits)}
        )

    @classmethod
    def from_name(cls, name: str):
        """Parses any name that `Policy.name` produces (see the module docstring).

        Raises:
            ConfigError (a ValueError): naming the string and the accepted forms.
        """
        if not isinstance(name, str):
            raise ConfigError.invalid("policy", name, _ALLOWED_NAMES)
        base, values = name.strip(), {}
        match = _SUFFIX_RE.match(base)
        while match and match.group("suffix") in _BY_SUFFIX:
            switch = _BY_SUFFIX[match.group("suffix")]
            try:
                values[switch.name] = float(match.group("value"))
            except ValueError:
                raise ConfigError.invalid("policy", name, _ALLOWED_NAMES) from None
            base = match.group("base")
            match = _SUFFIX_RE.match(base)
        bits = _bits_from_base(base)
        # A value suffix needs its switch on.
        if bits is None or any(not bits[SWITCHES.index(n)] for n in values):
            raise ConfigError.invalid("policy", name, _ALLOWED_NAMES)
        return cls.from_bits(bits, **values)

    # ---------------------------------------------------------------- views

    @property
    def bits(self) -> tuple[bool, ...]:
        """The switches as booleans, in switch order."""
        return tuple(s.is_on(getattr(self, s.name)) for s in TABLE)

    @property
    def code(self) -> str:
        """The code, e.g. ``'p1t0a1k0'`` (ignores a non-default value): the first
        `CODE_MIN` switches and every later one up to the last that is on."""
        bits = self.bits
        n = max([CODE_MIN] + [i + 1 for i, b in enumerate(bits) if b])
        return "".join(f"{s.letter}{int(b)}" for s, b in zip(TABLE[:n], bits[:n]))

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
        for s in TABLE:
            value = getattr(self, s.name)
            if s.suffix and s.is_on(value) and value != s.on:
                base += f"_{s.suffix}{value!r}"
        return base

    @property
    def switches_on(self) -> tuple[str, ...]:
        """Names of the switches that are on, in switch order."""
        return tuple(s for s, b in zip(SWITCHES, self.bits) if b)

    def to_dict(self) -> dict:
        """The switches as a plain dict (JSON rows); `Policy(**d)` rebuilds it."""
        return dataclasses.asdict(self)

    def replace(self, **changes):
        """A copy with some switches changed (validated like the constructor)."""
        return dataclasses.replace(self, **changes)


def _policy_doc() -> str:
    rows = "\n".join(f"        {s.name}: {s.doc}" for s in TABLE)
    head = "Which of the seed's invariants a run enforces (one field per switch)."
    return f"{head}\n\n    Attributes:\n{rows}\n"


#: Which invariants a run enforces: one field per `TABLE` row, in table order, each
#: defaulting to off (`Policy(True, True, True, 0.35)`, `Policy(kl_ceiling=0.5)`).
Policy = dataclasses.make_dataclass(
    "Policy",
    [(s.name, Any, dataclasses.field(default=s.off)) for s in TABLE],
    bases=(_PolicyMethods,),
    frozen=True,
    namespace={"__doc__": _policy_doc()},
)
Policy.__module__ = __name__


def all_combinations(**values) -> list:
    """Every policy, in code order: ``p0t0a0k0`` (naive) first, all on last (`values`: an
    on switch's value other than its default)."""
    return [
        Policy.from_bits(bits, **values)
        for bits in itertools.product((False, True), repeat=len(TABLE))
    ]


_ALLOWED_NAMES = (
    "'naive', 'all_on', 'all_on_minus_<switch>', 'naive_plus_<switch>' with "
    f"<switch> one of {', '.join(SWITCHES)}, or a code "
    f"'{''.join(f'{s.letter}<0|1>' for s in TABLE)}' (e.g. 'p1t1a0k1'"
    + (
        f"; switches after the first {CODE_MIN} may be left out: off"
        if len(TABLE) > CODE_MIN
        else ""
    )
    + "); "
    + "; ".join(
        f"any of them with {s.name} on may end in '_{s.suffix}<value>' "
        f"(e.g. 'all_on_{s.suffix}0.5')"
        for s in TABLE
        if s.suffix
    )
    + "."
)


def _bits_from_base(base: str) -> tuple[bool, ...] | None:
    if base == "naive":
        return (False,) * len(TABLE)
    if base == "all_on":
        return (True,) * len(TABLE)
    for prefix, default in (("all_on_minus_", True), ("naive_plus_", False)):
        if base.startswith(prefix):
            switch = base[len(prefix) :]
            if switch not in SWITCHES:
                return None
            return tuple((not default) if s == switch else default for s in SWITCHES)
    pairs = _PAIR_RE.findall(base)
    letters = "".join(letter for letter, _ in pairs)
    if (
        "".join(f"{a}{b}" for a, b in pairs) != base
        or not CODE_MIN <= len(pairs) <= len(TABLE)
        or letters != "".join(s.letter for s in TABLE[: len(pairs)])
    ):
        return None
    bits = tuple(b == "1" for _, b in pairs)
    return bits + (False,) * (len(TABLE) - len(bits))
