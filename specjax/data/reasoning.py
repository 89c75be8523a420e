"""A seeded generator of short worked arithmetic problems with explicit thinking spans.

Each problem is a short paragraph, one reasoning step per line, so that a plan step
(SPEC §5: a step ends at a newline) is one line of the solution::

    Q: Ann has 17 apples and buys 3 bags of 6. How many apples does Ann have now?
    <think>
    3 bags of 6 is 3 * 6 = 18.
    17 + 18 = 35.
    </think>
    A: 35

followed by a blank line. Every equation written in a thinking span is true and every
answer is correct (the tests re-derive them). Only `random.Random(seed)` is used, whose
integer seeding and ``randrange``/``choice`` are stable across Python 3 versions, so the
same ``(n_problems, seed)`` gives the same text everywhere.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
#: Special tokens every tokenizer trained on this domain should reserve.
REASONING_SPECIAL_TOKENS = (THINK_OPEN, THINK_CLOSE)

NAMES = (
    "Ann",
    "Ben",
    "Cara",
    "Dan",
    "Eve",
    "Finn",
    "Gia",
    "Hugo",
    "Ivy",
    "Jack",
    "Kim",
    "Leo",
    "Mia",
    "Noah",
    "Omar",
    "Pia",
    "Quinn",
    "Rosa",
    "Sam",
    "Tara",
)
ITEMS = (
    ("apple", "apples"),
    ("pen", "pens"),
    ("book", "books"),
    ("marble", "marbles"),
    ("card", "cards"),
    ("cookie", "cookies"),
    ("stamp", "stamps"),
    ("shell", "shells"),
    ("coin", "coins"),
    ("sticker", "stickers"),
    ("egg", "eggs"),
    ("cup", "cups"),
    ("candle", "candles"),
    ("pencil", "pencils"),
    ("ribbon", "ribbons"),
)
# (big unit, small unit, small units per big unit)
UNITS = (
    ("hours", "minutes", 60),
    ("minutes", "seconds", 60),
    ("days", "hours", 24),
    ("weeks", "days", 7),
    ("meters", "centimeters", 100),
    ("kilograms", "grams", 1000),
    ("liters", "milliliters", 1000),
    ("feet", "inches", 12),
    ("yards", "feet", 3),
)


@dataclasses.dataclass(frozen=True)
class Problem:
    """One worked problem.

    Attributes:
        template: Name of the template that produced it.
        question: The question text (without the ``Q: `` prefix).
        steps: Reasoning lines inside the thinking span.
        answer: The answer text (without the ``A: `` prefix).
    """

    template: str
    question: str
    steps: tuple[str, ...]
    answer: str

    def format(self) -> str:
        """The problem as a paragraph, ending in a blank line."""
        lines = [f"Q: {self.question}", THINK_OPEN, *self.steps, THINK_CLOSE, f"A: {self.answer}"]
        return "\n".join(lines) + "\n\n"


_Result = tuple[str, list[str], str]


def _article(noun: str) -> str:
    return "an" if noun[0] in "aeiou" else "a"


def _two_names(rng: random.Random) -> tuple[str, str]:
    a, b = rng.sample(NAMES, 2)
    return a, b


def _sum_chain(rng: random.Random) -> _Result:
    n = rng.randint(2, 4)
    xs = [rng.randint(2, 99) for _ in range(n)]
    steps, acc = [], xs[0]
    for x in xs[1:]:
        steps.append(f"{acc} + {x} = {acc + x}.")
        acc += x
    return f"What is {' + '.join(map(str, xs))}?", steps, str(acc)


def _add_sub(rng: random.Random) -> _Result:
    a, b = rng.randint(20, 199), rng.randint(2, 99)
    c = rng.randint(1, a + b)
    return (
        f"What is {a} + {b} - {c}?",
        [f"{a} + {b} = {a + b}.", f"{a + b} - {c} = {a + b - c}."],
        str(a + b - c),
    )


def _product(rng: random.Random) -> _Result:
    a, b = rng.randint(12, 99), rng.randint(3, 9)
    tens, units = a - a % 10, a % 10
    steps = [
        f"{a} * {b} = {tens} * {b} + {units} * {b}.",
        f"{tens} * {b} = {tens * b}.",
        f"{units} * {b} = {units * b}.",
        f"{tens * b} + {units * b} = {a * b}.",
    ]
    return f"What is {a} * {b}?", steps, str(a * b)


def _buy_bags(rng: random.Random) -> _Result:
    name = rng.choice(NAMES)
    _, items = rng.choice(ITEMS)
    a, bags, per = rng.randint(1, 60), rng.randint(2, 9), rng.randint(2, 12)
    q = (
        f"{name} has {a} {items} and buys {bags} bags of {per}. "
        f"How many {items} does {name} have now?"
    )
    steps = [
        f"{bags} bags of {per} is {bags} * {per} = {bags * per}.",
        f"{a} + {bags * per} = {a + bags * per}.",
    ]
    return q, steps, str(a + bags * per)


def _give_get(rng: random.Random) -> _Result:
    name, other = _two_names(rng)
    _, items = rng.choice(ITEMS)
    a = rng.randint(10, 90)
    b, c = rng.randint(1, a), rng.randint(1, 40)
    q = (
        f"{name} has {a} {items}, gives {b} to {other} and then finds {c} more. "
        f"How many {items} does {name} have now?"
    )
    return q, [f"{a} - {b} = {a - b}.", f"{a - b} + {c} = {a - b + c}."], str(a - b + c)


def _shop(rng: random.Random) -> _Result:
    name = rng.choice(NAMES)
    (s1, p1), (s2, p2) = rng.sample(ITEMS, 2)
    c1, c2 = rng.randint(1, 15), rng.randint(1, 15)
    n1, n2 = rng.randint(1, 9), rng.randint(1, 9)
    q = (
        f"{_article(s1).capitalize()} {s1} costs {c1} dollars and {_article(s2)} {s2} "
        f"costs {c2} dollars. {name} buys "
        f"{n1} {p1 if n1 > 1 else s1} and {n2} {p2 if n2 > 1 else s2}. "
        f"How many dollars does {name} pay?"
    )
    steps = [
        f"{n1} * {c1} = {n1 * c1}.",
        f"{n2} * {c2} = {n2 * c2}.",
        f"{n1 * c1} + {n2 * c2} = {n1 * c1 + n2 * c2}.",
    ]
    return q, steps, str(n1 * c1 + n2 * c2)


def _share(rng: random.Random) -> _Result:
    _, items = rng.choice(ITEMS)
    k = rng.randint(2, 9)
    each, left = rng.randint(2, 15), rng.randint(0, k - 1)
    n = k * each + left
    q = (
        f"{n} {items} are shared equally among {k} children. How many does each "
        f"child get, and how many are left over?"
    )
    steps = [
        f"{k} * {each} = {k * each}.",
        f"{n} - {k * each} = {left}.",
        f"{left} < {k}, so each child gets {each}.",
    ]
    return q, steps, f"{each} each, {left} left"


def _to_small_unit(rng: random.Random) -> _Result:
    big, small, f = rng.choice(UNITS)
    a, b = rng.randint(2, 12), rng.randint(1, f - 1)
    q = f"How many {small} are in {a} {big} and {b} {small}?"
    steps = [f"{a} {big} is {a} * {f} = {a * f} {small}.", f"{a * f} + {b} = {a * f + b}."]
    return q, steps, str(a * f + b)


def _to_big_unit(rng: random.Random) -> _Result:
    big, small, f = rng.choice(UNITS)
    a, r = rng.randint(1, 9), rng.randint(1, f - 1)
    m = a * f + r
    q = f"How many {big} and {small} is {m} {small}?"
    steps = [
        f"{a} * {f} = {a * f}.",
        f"{m} - {a * f} = {r}.",
        f"{r} < {f}, so it is {a} {big} and {r} {small}.",
    ]
    return q, steps, f"{a} {big} {r} {small}"


def _compare(rng: random.Random) -> _Result:
    name, other = _two_names(rng)
    _, items = rng.choice(ITEMS)
    bags, per = rng.randint(2, 9), rng.randint(2, 12)
    x = bags * per
    c = x
    while c == x:  # a tie has no "who has more" answer
        c = rng.randint(max(1, x - 20), x + 20)
    q = (
        f"{name} has {bags} bags of {per} {items} and {other} has {c} {items}. "
        f"Who has more {items}, and by how many?"
    )
    hi, lo = max(x, c), min(x, c)
    steps = [
        f"{bags} * {per} = {x}.",
        f"{x} {'>' if x > c else '<'} {c}.",
        f"{hi} - {lo} = {hi - lo}.",
    ]
    return q, steps, f"{name if x > c else other}, by {hi - lo}"


def _clock(rng: random.Random) -> _Result:
    h, mm, d = rng.randint(6, 18), rng.randint(0, 59), rng.randint(10, 240)
    total = mm + d
    hours, minutes = divmod(total, 60)
    q = (
        f"A train leaves at {h}:{mm:02d} and the trip takes {d} minutes. "
        f"At what time does it arrive?"
    )
    steps = [
        f"{mm} + {d} = {total}.",
        f"{total} minutes is {hours} hours and {minutes} minutes, as {hours} * 60 + "
        f"{minutes} = {total}.",
        f"{h} + {hours} = {h + hours}.",
    ]
    return q, steps, f"{h + hours}:{minutes:02d}"


def _percent(rng: random.Random) -> _Result:
    p = rng.choice((5, 10, 15, 20, 25, 30, 40, 50, 60, 75, 80))
    n = 20 * rng.randint(1, 30)
    while n * p % 100:
        n += 20
    q = f"What is {p}% of {n}?"
    steps = [
        f"{p}% of {n} is {n} * {p} / 100.",
        f"{n} * {p} = {n * p}.",
        f"{n * p} / 100 = {n * p // 100}.",
    ]
    return q, steps, str(n * p // 100)


def _average(rng: random.Random) -> _Result:
    k = rng.randint(3, 4)
    xs = [rng.randint(1, 60) for _ in range(k)]
    xs[-1] += (-sum(xs)) % k  # make the mean an integer
    s = sum(xs)
    q = f"What is the average of {', '.join(map(str, xs[:-1]))} and {xs[-1]}?"
    steps = [f"{' + '.join(map(str, xs))} = {s}.", f"{s} / {k} = {s // k}."]
    return q, steps, str(s // k)


#: Template name -> generator. Order matters for determinism (rng.choice over it).
TEMPLATES: dict[str, Callable[[random.Random], _Result]] = {
    "sum": _sum_chain,
    "add_sub": _add_sub,
    "product": _product,
    "buy_bags": _buy_bags,
    "give_get": _give_get,
    "shop": _shop,
    "share": _share,
    "to_small_unit": _to_small_unit,
    "to_big_unit": _to_big_unit,
    "compare": _compare,
    "clock": _clock,
    "percent": _percent,
    "average": _average,
}


def generate_problems(n_problems: int, seed: int) -> list[Problem]:
    """Generates ``n_problems`` worked problems, a deterministic function of ``seed``.

    Args:
        n_problems: How many problems (>= 0).
        seed: Integer seed.

    Returns:
        The problems, templates drawn uniformly.
    """
    if n_problems < 0:
        raise ValueError(f"n_problems must be >= 0, got {n_problems}")
    rng = random.Random(seed)
    names = list(TEMPLATES)
    out = []
    for _ in range(n_problems):
        name = rng.choice(names)
        q, steps, a = TEMPLATES[name](rng)
        out.append(Problem(name, q, tuple(steps), a))
    return out


def generate_reasoning(n_problems: int, seed: int) -> str:
    """The text of `generate_problems` (paragraphs separated by blank lines).

    Args:
        n_problems: How many problems.
        seed: Integer seed.

    Returns:
        The corpus text; identical for identical arguments.
    """
    return "".join(p.format() for p in generate_problems(n_problems, seed))
