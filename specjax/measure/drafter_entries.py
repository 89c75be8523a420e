"""The drafter-entry grammar of the speed scripts: drafters joined by '+' (one chain each,
a token tree when several), ``NAME*COUNT`` naming a drafter COUNT times (twins: its chains
drafted in one pass, `specjax.engine.spec.share_drafting`). E.g. ``lookup+eagle*2``."""

from __future__ import annotations

import collections


def members(entry: str) -> list[str]:
    """The chains' drafters in slot order ('lookup+eagle*2' -> [lookup, eagle, eagle])."""
    out = []
    for part in entry.split("+"):
        name, _, times = part.partition("*")
        out += [name] * (int(times) if times else 1)
    return out


def entry_ok(entry: str) -> bool:
    """Whether an entry parses: NAME or NAME*COUNT (COUNT ≥ 1), joined by '+'."""
    for part in entry.split("+"):
        name, star, times = part.partition("*")
        if not name or (star and not (times.isdigit() and int(times) >= 1)):
            return False
    return True


def labels(names: list[str]) -> list[str]:
    """One label per chain: a twin's name with its place among its twins ('eagle#2')."""
    seen: collections.Counter = collections.Counter()
    out = []
    for n in names:
        seen[n] += 1
        out.append(n if seen[n] == 1 else f"{n}#{seen[n]}")
    return out


def twin_counts(entry: str) -> dict[str, int]:
    """How many chains an entry gives each drafter ('eagle*2+lookup' -> {eagle: 2,
    lookup: 1}): a drafter named m times drafts its m chains in one pass at batch m·B."""
    return dict(collections.Counter(members(entry)))
