"""What the command-line entry points share: one-line errors and the flags parser.

Bad input ends a command with ``specjax: error: <message>`` on stderr (one line, no
traceback, exit status 2, argparse's convention); `parse_flags` gives absl's
``app.run`` the same behaviour for flag errors, including a `ConfigError` raised while a
config file's ``get_config`` parses its argument.
"""

from __future__ import annotations

import contextlib
import re
import sys
from typing import NoReturn, Sequence

from absl import flags

from specjax.errors import ENV_VARS, MAX_PROGRAMS_LIMIT, ConfigError, check_environment

__all__ = [
    "PROG",
    "EXIT_USAGE",
    "ENV_VARS",
    "MAX_PROGRAMS_LIMIT",
    "fail",
    "warn",
    "error_message",
    "parse_flags",
    "check_environment",
    "config_error_in",
    "hold_logs",
]

PROG = "specjax"
EXIT_USAGE = 2


def fail(error: BaseException | str, prog: str = PROG) -> NoReturn:
    """Prints ``<prog>: error: <one line>`` to stderr (``specjax``, or a script's name) and
    exits with status 2."""
    sys.stderr.write(f"{prog}: error: {error_message(error)}\n")
    sys.stderr.flush()
    sys.exit(EXIT_USAGE)


class HeldLogs:
    """Log records held back while inputs are validated (`hold_logs`)."""

    def __init__(self, handlers):
        self.handlers = handlers
        self.records = []

    def release(self) -> None:
        """Hands the held records to the handlers they were meant for."""
        for record in self.records:
            for h in self.handlers:
                if record.levelno >= h.level:
                    h.handle(record)
        self.records = []


@contextlib.contextmanager
def hold_logs():
    """Holds back every log record (absl's, JAX's, a torn journal line's warning) and
    Python warning emitted inside: after an error they are dropped, so the error is the
    only line printed; after success `HeldLogs.release` prints them."""
    import logging  # pylint: disable=import-outside-toplevel

    root = logging.getLogger()
    held = HeldLogs(root.handlers[:])

    class _Collect(logging.Handler):
        def emit(self, record):
            held.records.append(record)

    root.handlers = [_Collect()]
    logging.captureWarnings(True)  # Python warnings (numpy's overflow, ...) are held too
    try:
        yield held
    finally:
        logging.captureWarnings(False)
        root.handlers = held.handlers


def warn(message: str) -> None:
    """Prints ``specjax: warning: <one line>`` to stderr (the command goes on)."""
    sys.stderr.write(f"{PROG}: warning: {' '.join(message.split())}\n")
    sys.stderr.flush()


def error_message(error: BaseException | str) -> str:
    """One line describing `error`, looking through wrappers to the original cause.

    absl wraps a ValueError raised while parsing a flag in IllegalFlagValueError, and
    ml_collections re-raises errors from ``get_config`` with a traceback in the message;
    the innermost exception of the chain holds the message meant for the user. A
    ``raise ... from None`` ends the chain: its author chose the message (e.g. a zoo error
    re-raised naming ``SPECJAX_ZOO`` and the folder).
    """
    if isinstance(error, str):
        return " ".join(error.split())
    chain = _chain(error)
    config_errors = [e for e in chain if isinstance(e, ConfigError)]
    root = config_errors[-1] if config_errors else chain[-1]
    text = " ".join(str(root).split()) or type(root).__name__
    if not isinstance(root, (ValueError, flags.Error)):
        text = f"{type(root).__name__}: {text}"
    return text


def config_error_in(error: BaseException) -> ConfigError | None:
    """The innermost `ConfigError` in `error`'s chain of causes, if any."""
    found = [e for e in _chain(error) if isinstance(e, ConfigError)]
    return found[-1] if found else None


def parse_flags(argv: Sequence[str]) -> list[str]:
    """absl flags parser for `app.run`: bad flags -> `fail` instead of usage + traceback.

    ``--config.<field>=<value>`` overrides are applied here, after the config file is
    loaded, with `specjax.configs.common.apply_override` (the same coercion as the
    ``--config=file.py:field=value`` form), so that a bad override names its field
    (``plan_steps: got 'abc', allowed: an integer``) instead of the parser's message. A
    config file that cannot be loaded — missing, a syntax error, an exception while it
    runs, no ``get_config`` — is one line naming ``--config`` and the file.
    """
    argv = list(argv)
    try:
        check_environment()
    except ConfigError as e:
        fail(e)
    argv, overrides = _split_overrides(argv)
    rest = _parse_quietly(argv)
    if overrides:
        _apply_overrides(overrides)
    return rest


def _split_overrides(argv: list[str]) -> tuple[list[str], list[tuple[str, str]]]:
    """``argv`` without its ``--config.<field>=<value>`` overrides, and the overrides as
    (field, value) (none where the program has no ``--config``)."""
    overrides: list[tuple[str, str]] = []
    if "config" in flags.FLAGS:
        kept = argv[:1]
        for arg in argv[1:]:
            m = re.match(r"^--?config\.([^=]+)=(.*)$", arg, re.S)
            if m:
                overrides.append((m.group(1), m.group(2)))
            else:
                kept.append(arg)
        argv = kept
    return argv, overrides


def _parse_quietly(argv: list[str]) -> list[str]:
    """absl's parse of ``argv`` (the config file loaded), absl's logging off; any error of
    the flags or of loading the config file is one line (`fail`)."""
    from absl import logging  # pylint: disable=import-outside-toplevel

    absl_logger = logging.get_absl_logger()
    was_disabled, absl_logger.disabled = absl_logger.disabled, True  # only our one line
    # ml_collections reads its overrides from sys.argv, not from the argv it is given.
    saved_argv, sys.argv = sys.argv, list(argv)
    # ml_collections loads the file as module "config_config" with the deprecated
    # load_module(), which re-executes into a module already in sys.modules: a file
    # without get_config would then inherit the previous file's (a second parse in one
    # process: a notebook, the tests).
    sys.modules.pop("config_config", None)
    try:
        rest = flags.FLAGS(argv)
    except flags.Error as e:
        root = _root(e)
        if isinstance(root, ConfigError):
            fail(root)
        given = config_flag_value(argv)
        if given is not None and "--config must have a value" in str(e):
            fail(
                ConfigError.invalid(
                    "--config",
                    given,
                    "a config file whose get_config() returns a ConfigDict (it returned None)",
                )
            )
        if not isinstance(root, flags.Error) and "config" in flags.FLAGS:
            fail(_config_load_error(root, argv))
        fail(e)
    except Exception as e:  # pylint: disable=broad-except
        # Loading a config file runs arbitrary code: any exception is bad input.
        root = _root(e)
        if isinstance(root, ConfigError):
            fail(root)
        fail(_config_load_error(root, argv))
    except BaseException as e:  # pylint: disable=broad-except
        # A config file that calls sys.exit() while it loads (exit status 0 and no output
        # would read as success), or raises KeyboardInterrupt; absl's own exits (--help)
        # and anything raised outside the config file's loading pass.
        if not _raised_loading_config(e):
            raise
        fail(_config_load_error(e, argv))
    finally:
        absl_logger.disabled = was_disabled
        sys.argv = saved_argv
    return rest


def _apply_overrides(overrides: list[tuple[str, str]]) -> None:
    """The ``--config.<field>=<value>`` overrides applied to the loaded config (a bad one:
    one line naming its field)."""
    from specjax.configs.common import apply_override  # pylint: disable=import-outside-toplevel

    config = flags.FLAGS["config"].value
    if _is_config_dict(config):
        try:
            for key, raw in overrides:
                apply_override(config, key, raw)
        except ConfigError as e:
            fail(e)


def _is_config_dict(value) -> bool:
    import ml_collections  # pylint: disable=import-outside-toplevel

    return isinstance(value, ml_collections.ConfigDict)


def config_flag_value(argv: Sequence[str]) -> str | None:
    """The ``--config`` value in `argv` (``file.py[:arg]``), or None."""
    value = None
    for i, arg in enumerate(argv):
        if arg.startswith(("--config=", "-config=")):
            value = arg.split("=", 1)[1]
        elif arg in ("--config", "-config") and i + 1 < len(argv):
            value = argv[i + 1]
    return value


def _config_load_error(error: BaseException, argv: Sequence[str]) -> ConfigError:
    """`error`, raised while absl parsed the flags, as a one-line `ConfigError`."""
    given = config_flag_value(argv)
    if given is None:
        return ConfigError(error_message(error))
    filename = given.split(":", 1)[0]
    where = _where_in(error, filename)
    if isinstance(error, SystemExit):
        what = f"it called sys.exit({error.code!r}) while loading{where}"
        allowed = "a config file whose get_config(arg) returns a ConfigDict"
    elif isinstance(error, AttributeError) and "get_config" in str(error):
        what = "it defines no get_config()"
        allowed = "a config file (.py) defining get_config(arg=None) that returns a ConfigDict"
    elif isinstance(error, SyntaxError):
        what = f"SyntaxError: {error.msg} (line {error.lineno})"
        allowed = "a Python config file that compiles"
    else:
        what = f"loading it raised {type(error).__name__}: {' '.join(str(error).split())}{where}"
        allowed = "a config file whose get_config(arg) returns a ConfigDict"
    return ConfigError(
        f"--config: got {given!r}, allowed: {allowed}; {what}",
        field="--config",
        value=given,
        allowed=allowed,
    )


def _raised_loading_config(error: BaseException) -> bool:
    """Whether `error` passed through ml_collections' config-file loading."""
    import traceback  # pylint: disable=import-outside-toplevel

    return any(
        "config_flags" in f.filename and "ml_collections" in f.filename
        for f in traceback.extract_tb(error.__traceback__)
    )


def _where_in(error: BaseException, filename: str) -> str:
    """`` (file.py, line N)`` for the innermost traceback frame in `filename`, if any."""
    import os  # pylint: disable=import-outside-toplevel
    import traceback  # pylint: disable=import-outside-toplevel

    try:
        target = os.path.realpath(filename)
        frames = [
            f
            for f in traceback.extract_tb(error.__traceback__)
            if os.path.realpath(f.filename) == target
        ]
    except (OSError, ValueError):
        return ""
    return f" ({filename}, line {frames[-1].lineno})" if frames else ""


def _chain(error: BaseException) -> list[BaseException]:
    """`error` and its causes, outermost first; ``raise ... from None`` ends the chain
    (whoever wrote it chose the message the user sees)."""
    chain = [error]
    while True:
        e = chain[-1]
        nxt = (
            e.__cause__
            if e.__cause__ is not None
            else (None if e.__suppress_context__ else e.__context__)
        )
        if nxt is None or nxt in chain:
            return chain
        chain.append(nxt)


def _root(error: BaseException) -> BaseException:
    return _chain(error)[-1]
