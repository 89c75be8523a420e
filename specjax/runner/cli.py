"""What the command-line entry points share: one-line errors and the flags parser.

Bad input ends a command with ``specjax: error: <message>`` on stderr (one line, no
traceback, exit status 2, argparse's convention); `parse_flags` gives absl's
``app.run`` the same behaviour for flag errors, including a `ConfigError` raised while a
config file's ``get_config`` parses its argument.
"""

from __future__ import annotations

import sys
from typing import NoReturn, Sequence

from absl import flags

from specjax.errors import ConfigError

__all__ = ["PROG", "EXIT_USAGE", "fail", "error_message", "parse_flags"]

PROG = "specjax"
EXIT_USAGE = 2


def fail(error: BaseException | str) -> NoReturn:
    """Prints ``specjax: error: <one line>`` to stderr and exits with status 2."""
    sys.stderr.write(f"{PROG}: error: {error_message(error)}\n")
    sys.stderr.flush()
    sys.exit(EXIT_USAGE)


def error_message(error: BaseException | str) -> str:
    """One line describing `error`, looking through wrappers to the original cause.

    absl wraps a ValueError raised while parsing a flag in IllegalFlagValueError, and
    ml_collections re-raises errors from ``get_config`` with a traceback in the message;
    the innermost exception of the chain holds the message meant for the user.
    """
    if isinstance(error, str):
        return " ".join(error.split())
    chain = [error]
    while (nxt := chain[-1].__cause__ or chain[-1].__context__) is not None and nxt not in chain:
        chain.append(nxt)
    config_errors = [e for e in chain if isinstance(e, ConfigError)]
    root = config_errors[-1] if config_errors else chain[-1]
    text = " ".join(str(root).split()) or type(root).__name__
    if not isinstance(root, (ValueError, flags.Error)):
        text = f"{type(root).__name__}: {text}"
    return text


def parse_flags(argv: Sequence[str]) -> list[str]:
    """absl flags parser for `app.run`: bad flags -> `fail` instead of usage + traceback."""
    try:
        return flags.FLAGS(argv)
    except (flags.Error, ValueError, TypeError, KeyError, AttributeError, OSError) as e:
        # ml_collections reports `--config.<unknown field>=...` as a bare KeyError
        # (wrapped in an AttributeError): name the override instead.
        overrides = [a.split("=", 1)[0] for a in argv[1:] if a.startswith("--config.")]
        root = _root(e)
        if overrides and isinstance(root, KeyError) and root.args:
            fail(ConfigError(f"no such config field {str(root.args[0]).strip(chr(39))!r} "
                             f"(overrides given: {', '.join(overrides)})"))
        fail(e)


def _root(error: BaseException) -> BaseException:
    seen = [error]
    while (nxt := seen[-1].__cause__ or seen[-1].__context__) is not None and nxt not in seen:
        seen.append(nxt)
    return seen[-1]
