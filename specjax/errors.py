"""Errors a user can act on.

Every config validation in specjax raises `ConfigError`: its message names the field,
the value it got and what is allowed, so that the CLI can print it on one line
(`specjax: error: grid.gamma: got 0, allowed: integers >= 1`) and exit without a
traceback.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["ConfigError", "check", "describe_allowed", "user_path"]


class ConfigError(ValueError):
    """A config value (or command-line input) that is not allowed.

    Constructible from a single message, like any ValueError (ml_collections re-raises
    errors from `get_config` as `type(e)(message)`); `ConfigError.invalid` builds the
    standard message from the field, the value and what is allowed, and keeps them as
    attributes for programs that want them.
    """

    def __init__(
        self, message: str, *, field: str | None = None, value: Any = None, allowed: Any = None
    ):
        super().__init__(message)
        self.field = field
        self.value = value
        self.allowed = allowed

    @classmethod
    def invalid(cls, field: str, value: Any, allowed: Any) -> "ConfigError":
        """`<field>: got <value!r>, allowed: <allowed>`."""
        return cls(
            f"{field}: got {_short_repr(value)}, allowed: {describe_allowed(allowed)}",
            field=field,
            value=value,
            allowed=allowed,
        )


def check(cond: Any, field: str, value: Any, allowed: Any) -> None:
    """Raises `ConfigError.invalid(field, value, allowed)` unless `cond` is true.

    Args:
        cond: the condition the value must satisfy.
        field: dotted config path, e.g. ``"grid.gamma"`` or ``"--workdir"``.
        value: the offending value (shown with ``repr``, shortened).
        allowed: a description (``"integers >= 1"``) or a collection of allowed values
            (shown as ``one of 'a', 'b'``).
    """
    if not cond:
        raise ConfigError.invalid(field, value, allowed)


def user_path(value: Any, field: str, allowed: str = "a path") -> Path:
    """`value` as a `Path` with ``~`` / ``~user`` expanded, or a `ConfigError` naming `field`.

    ``Path.expanduser`` raises RuntimeError for an unknown user (``~nosuchuser/x``) or when
    no home directory can be determined; a NUL byte or a non-string is refused too.
    """
    if not isinstance(value, (str, Path)) or not str(value).strip() or "\0" in str(value):
        raise ConfigError.invalid(field, value, allowed)
    try:
        return Path(value).expanduser()
    except (RuntimeError, KeyError, ValueError, OSError) as e:
        head = str(value).split("/", 1)[0]
        if head == "~":
            reason = "~ expands to the home directory, which cannot be determined"
        elif head.startswith("~"):
            reason = f"~{head[1:]} expands to the home of user {head[1:]!r}: no such user"
        else:
            reason = " ".join(str(e).split()) or type(e).__name__
        raise ConfigError.invalid(field, str(value), f"{allowed} ({reason})") from None


def describe_allowed(allowed: Any) -> str:
    if isinstance(allowed, str):
        return allowed
    if isinstance(allowed, (list, tuple, set, frozenset)) or hasattr(allowed, "keys"):
        items = sorted(allowed, key=str) if isinstance(allowed, (set, frozenset)) else list(allowed)
        if not items:
            return "(none available)"
        return "one of " + ", ".join(repr(x) for x in items)
    return str(allowed)


def _short_repr(value: Any, limit: int = 120) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
