r"""Runs a sweep: ``python -m specjax.main --config=configs/NAME.py[:variant,key=value] --workdir=DIR``.

  python -m specjax.main --config=configs/seed_reproduction.py:runlocal --workdir=runs/seed
  python -m specjax.main --config=configs/seed_reproduction.py:grid.gamma=[2,4] \
      --config.plans_per_domain=8 --workdir=runs/seed_gamma   # ml_collections overrides work too
  specjax --config=... --workdir=...                      # the installed console script

Rerunning with the same workdir resumes the sweep. Bad input (an unknown field, a value
out of range, a workdir that is a file, ...) prints one line ``specjax: error: ...`` and
exits with status 2 before anything is written. ``--jax_distributed`` initialises
`jax.distributed` first (multi-host TPU / GPU); the cells are then split over processes.

The work happens in `specjax.runner.sweep.run(config, workdir)`, importable from a
notebook; this file only parses flags.
"""

from __future__ import annotations

import contextlib
from typing import Sequence

from absl import app, flags
from ml_collections import config_flags

from specjax.errors import ConfigError
from specjax.runner.cli import config_error_in, fail, hold_logs, parse_flags

_CONFIG = config_flags.DEFINE_config_file(
    "config",
    None,
    "Config file, optionally followed by ':variant,key=value,...'.",
    lock_config=True,
)
if "workdir" not in flags.FLAGS:  # shared with specjax.report
    flags.DEFINE_string("workdir", None, "Directory of the run (created; reused to resume).")
flags.DEFINE_bool(
    "jax_distributed", False, "Call jax.distributed.initialize() first (multi-host TPU / GPU)."
)
flags.mark_flags_as_required(["config", "workdir"])


def main(argv: Sequence[str]) -> None:
    if len(argv) > 1:
        fail(f"unexpected arguments: {' '.join(argv[1:])}")
    if flags.FLAGS.jax_distributed:
        import jax  # pylint: disable=import-outside-toplevel

        jax.distributed.initialize()

    from specjax.runner import sweep  # pylint: disable=import-outside-toplevel

    # Validation, before anything is written (the compilation cache included), and
    # before any INFO line: an error is the only line printed. Validation reads only
    # inputs (the config, the workdir, the zoo, an experiment module), so whatever it
    # raises is reported in one line naming what it was validating, never a traceback.
    try:
        with _quiet(), hold_logs() as logs:  # a warning would precede the error line
            _check_backend()
            plan = sweep.prepare(_config(), flags.FLAGS.workdir)
    except (Exception, SystemExit) as e:  # pylint: disable=broad-except
        fail(config_error_in(e) or _validation_error(e))
    logs.release()

    from specjax.runtime import compile_cache  # pylint: disable=import-outside-toplevel

    compile_cache.enable()
    # The sweep itself: only a ConfigError is bad input here; anything else is a bug
    # whose traceback the user needs.
    try:
        sweep.execute(plan)
    except ConfigError as e:
        fail(e)


def _check_backend() -> None:
    """JAX's backend, initialised: a platform this machine lacks is named as such."""
    import os  # pylint: disable=import-outside-toplevel

    import jax  # pylint: disable=import-outside-toplevel

    try:
        jax.devices()
    except Exception as e:  # pylint: disable=broad-except
        what = " ".join(str(e).split())[:200] or type(e).__name__
        raise ConfigError.invalid(
            "JAX_PLATFORMS",
            os.environ.get("JAX_PLATFORMS"),
            f"platforms JAX can initialise on this machine (unset or '' picks one); "
            f"initialising them raised {type(e).__name__}: {what}",
        ) from None


def _validation_error(error: BaseException) -> ConfigError:
    """An exception other than a ConfigError raised while the run was validated (an
    experiment module or its validate hook calling sys.exit, a zoo or a path that trips a
    library), as one line naming ``--config`` and where it was raised."""
    import traceback  # pylint: disable=import-outside-toplevel

    given = config_flags.get_config_filename(flags.FLAGS["config"])
    frames = traceback.extract_tb(error.__traceback__)
    where = f" ({frames[-1].filename}, line {frames[-1].lineno})" if frames else ""
    if isinstance(error, SystemExit):
        what = f"validating it called sys.exit({error.code!r}){where}"
    else:
        what = (
            f"validating it raised {type(error).__name__}: "
            f"{' '.join(str(error).split())[:300]}{where}"
        )
    allowed = "a config (and experiment module) that validates"
    return ConfigError(
        f"--config: got {given!r}, allowed: {allowed}; {what}",
        field="--config",
        value=given,
        allowed=allowed,
    )


def _config():
    """The loaded config, or a `ConfigError` naming ``--config`` and what is wrong."""
    import os  # pylint: disable=import-outside-toplevel

    import ml_collections  # pylint: disable=import-outside-toplevel

    given = config_flags.get_config_filename(flags.FLAGS["config"])
    filename = given if os.path.isfile(given) else given.split(":", 1)[0]
    if not os.path.isfile(filename) or not os.access(filename, os.R_OK):
        raise ConfigError.invalid("--config", given, "the path of a readable config file (.py)")
    config = _CONFIG.value
    if not isinstance(config, ml_collections.ConfigDict):
        raise ConfigError.invalid(
            "--config",
            filename,
            f"a config file whose get_config() returns a ConfigDict "
            f"(it returned {type(config).__name__})",
        )
    return config


@contextlib.contextmanager
def _quiet():
    """absl logs WARNING and above only (JAX's INFO lines would precede an error)."""
    from absl import logging  # pylint: disable=import-outside-toplevel

    before = logging.get_verbosity()
    logging.set_verbosity(min(before, logging.WARNING))  # absl: higher is more verbose
    try:
        yield
    finally:
        logging.set_verbosity(before)


def entry() -> None:
    """The ``specjax`` console script."""
    app.run(main, flags_parser=parse_flags)


if __name__ == "__main__":
    entry()
