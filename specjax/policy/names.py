"""The policy-name grammar: every name a grid, a result row, a table or a plot gives a policy.

A policy name is one of

    * a switch policy, as `Policy.name` writes it (`specjax.policy.switches`): ``naive``,
        ``all_on``, ``all_on_minus_<switch>``, ``naive_plus_<switch>``, a code
        ``p<0|1>t<0|1>a<0|1>k<0|1>`` (a letter per switch), any of them with the KL
        switch on ending in ``_kl<nats>``; a grid may also give the switches as a dict
        (``Policy(**d)``);
    * a router, which picks each plan's drafters instead of running switch-set branches:
        ``auto`` (`specjax.policy.auto.AutoRouter`, adaptive drafter sets, scored as the
        run's ``auto_score`` says), ``auto:own`` (scored by the drafters that ran, with
        exploration: its behaviour before teacher-forced scores), ``auto:teacher_forced``
        (every drafter scored on the committed text, no exploration) or ``oracle`` (each
        plan drafted by its own domain's drafter alone, the domain known);
    * a single-drafter baseline: ``single:<drafter>`` (that drafter alone, rule 1, one
        branch, no consensus);
    * a fixed drafter set: ``set:<a>+<b>[+…]`` (those drafters on every plan and step, one
        branch: several drafters make one token tree under the plan's tree rule).

`parse` reads any of them, `canonical_name` is the one spelling rows and reports use,
`label` is what a table or a plot shows (the canonical name; any other value as given), and
`order_key` sorts names as the field report's table lists them.

Example:
    >>> canonical_name({"prefix_partitioning": True, "truncate_and_attribute": True,
    ...                 "agreement_weighted_consensus": True, "kl_ceiling": 0.5})
    'all_on_kl0.5'
"""

from __future__ import annotations

from typing import Any

from specjax.errors import ConfigError
from specjax.policy.switches import CODE_MIN, SWITCHES, Policy

#: The scores an `auto` router can run with (`AutoRouter.SCORES`); ``auto:<score>`` pins one.
AUTO_SCORES = ("own", "teacher_forced")
#: Router names, in display order.
ROUTERS = ("auto", *(f"auto:{s}" for s in AUTO_SCORES), "oracle")
#: A single-drafter baseline's name is this prefix and the drafter's name.
SINGLE_PREFIX = "single:"
#: A fixed drafter set's name is this prefix and its drafters joined by ``+``.
SET_PREFIX = "set:"
#: The ablation of the four switches, in display order: none, all, each removed, each added.
ABLATION_NAMES = (
    ("naive", "all_on")
    + tuple(f"all_on_minus_{s}" for s in SWITCHES)
    + tuple(f"naive_plus_{s}" for s in SWITCHES)
)
#: Every policy of the field report's table, in display order (the ablation and the routers).
FIELD_REPORT_NAMES = ABLATION_NAMES + ("auto", "oracle")
#: The accepted forms, for error messages.
ALLOWED = (
    "a policy name (naive, all_on, all_on_minus_<switch>, naive_plus_<switch>, "
    "p1t0a1k0, any of them with the KL switch on ending in _kl<nats>; auto, auto:own, "
    "auto:teacher_forced, oracle; single:<drafter>; set:<drafter>+<drafter>) or a dict of "
    "the four switches"
)


def parse(value: Any) -> Policy | str:
    """The policy `value` names: a `Policy` for a switch policy (a name or a dict of the four
    switches), else the router's or the single-drafter baseline's canonical name.

    Raises:
        ConfigError (a ValueError): naming the value and the accepted forms.
    """
    if isinstance(value, Policy):
        return value
    if isinstance(value, str):
        name = value.strip()
        if name in ROUTERS:
            return name
        if name.startswith(SINGLE_PREFIX):
            if not name[len(SINGLE_PREFIX) :]:
                raise ConfigError.invalid("policy", value, ALLOWED)
            return name
        if name.startswith(SET_PREFIX):
            members = name[len(SET_PREFIX) :].split("+")
            if not all(m.strip() for m in members) or len(set(members)) != len(members):
                raise ConfigError.invalid("policy", value, ALLOWED)
            return SET_PREFIX + "+".join(m.strip() for m in members)
    try:
        if isinstance(value, str):
            return Policy.from_name(value)
        if isinstance(value, dict):
            return Policy(**dict(value))
    except (ConfigError, TypeError, ValueError):
        pass
    raise ConfigError.invalid("policy", value, ALLOWED)


def canonical_name(value: Any) -> str:
    """The one spelling of the policy `value` names (``p1t1a1k1`` → ``all_on``)."""
    parsed = parse(value)
    return parsed.name if isinstance(parsed, Policy) else parsed


def is_router(value: Any) -> bool:
    """Whether `value` names a router (``auto``, ``auto:<score>`` or ``oracle``)."""
    return isinstance(value, str) and value.strip() in ROUTERS


def auto_score(value: Any, default: str) -> str | None:
    """The score an ``auto`` router runs with: ``auto:<score>``'s own, plain ``auto``'s the
    run's `default`; None for any other policy."""
    if not isinstance(value, str):
        return None
    name = value.strip()
    if name == "auto":
        return default
    if name.startswith("auto:") and name in ROUTERS:
        return name[len("auto:") :]
    return None


def is_switch_policy(value: Any) -> bool:
    """Whether `value` names a switch policy (parallel branches and a step decision), not a
    router, a single-drafter baseline or a fixed set (one routed branch per plan)."""
    try:
        return isinstance(parse(value), Policy)
    except ConfigError:
        return False


def set_drafters(value: Any) -> tuple[str, ...] | None:
    """The drafters a ``set:<a>+<b>`` name runs together; None for any other policy."""
    if isinstance(value, str) and value.strip().startswith(SET_PREFIX):
        return tuple(m.strip() for m in value.strip()[len(SET_PREFIX) :].split("+"))
    return None


def single_name(drafter: str) -> str:
    """The name of the single-drafter baseline of `drafter`: ``single:<drafter>``."""
    return f"{SINGLE_PREFIX}{drafter}"


def single_drafter(value: Any) -> str | None:
    """The drafter a ``single:<drafter>`` name runs alone; None for any other policy."""
    if isinstance(value, str) and value.strip().startswith(SINGLE_PREFIX):
        return value.strip()[len(SINGLE_PREFIX) :]
    return None


def kl_ceiling(value: Any) -> float | None:
    """The KL ceiling (nats) the policy `value` names; None when switch 4 is off, for a
    router or a baseline, or when `value` names no policy."""
    try:
        parsed = parse(value)
    except ConfigError:
        return None
    return parsed.kl_ceiling if isinstance(parsed, Policy) else None


def label(value: Any) -> str:
    """The policy's display label in tables and plots: its canonical name; a value that
    names no policy is shown as given (a row is displayed, never refused)."""
    if isinstance(value, dict) and "name" in value:
        return str(value["name"])
    try:
        return canonical_name(value)
    except ConfigError:
        return "–" if value is None else str(value)


def order_key(value: Any) -> tuple:
    """Sorts policies as the field report's table lists them (`FIELD_REPORT_NAMES`), then
    other switch policies, then baselines, each group by name."""
    name = label(value)
    if name in FIELD_REPORT_NAMES:
        return (FIELD_REPORT_NAMES.index(name), name)
    if name in ROUTERS:
        return (len(FIELD_REPORT_NAMES), name)
    rank = len(FIELD_REPORT_NAMES) + 1
    if set_drafters(name) is not None:
        rank += 1
    elif single_drafter(name) is not None:
        rank += 2
    return (rank, name)


def is_policy_dict(value: Any) -> bool:
    """Whether `value` is a dict of the switches (a grid's or a row's spelled-out policy:
    at least the first `CODE_MIN`, the four every stored row names; later ones may be
    missing, off)."""
    return isinstance(value, dict) and all(s in value for s in SWITCHES[:CODE_MIN])
