"""Experiments by name: what a config's ``experiment`` field selects.

An experiment computes the metrics of one grid cell::

    @register_experiment("seed_reproduction", validate=check_config, finalize=summarise)
    def seed_reproduction(config: ConfigDict, cell: dict, workdir: Path) -> dict:
        ...  # JSON-serialisable metrics (SPEC §7 names)

Hooks, all optional:
  * ``validate(config) -> None | dict`` raises `specjax.errors.ConfigError` for a bad
    config; the runner calls it before anything is written to the workdir. It may return
    a dict of *inputs*: what the cells read besides the config (e.g. the zoo's folder and
    the sha256 of its manifest). The runner records it in ``version.json`` and in every
    result row under ``inputs``, and refuses to resume a workdir whose results were
    computed from other inputs.
  * ``finalize(config, workdir, results) -> None`` runs once (on process 0) after every
    cell has a result, e.g. to write ``summary.json``.

This module only keeps the names: it imports no experiment. The project's experiments
(`specjax.runner.experiments`: ``plans``) register when that module is imported, which
`specjax.runner.sweep.prepare` does before it looks a name up. A config may also name its
own module in ``config.experiment_module`` (a dotted module name or a path to a ``.py``
file), so that research code outside the package can be swept without editing specjax.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import importlib.util
import sys
import types
from pathlib import Path
from typing import Any, Callable

from specjax.errors import ConfigError, user_path

__all__ = [
    "Experiment",
    "register_experiment",
    "get_experiment",
    "known_experiments",
    "import_experiment_module",
]

RunFn = Callable[[Any, dict, Path], dict]
ValidateFn = Callable[[Any], "dict | None"]
FinalizeFn = Callable[[Any, Path, list], None]


@dataclasses.dataclass(frozen=True)
class Experiment:
    """A registered experiment: its cell function and optional hooks."""

    name: str
    run: RunFn
    validate: ValidateFn | None = None
    finalize: FinalizeFn | None = None


_REGISTRY: dict[str, Experiment] = {}


def register_experiment(
    name: str, *, validate: ValidateFn | None = None, finalize: FinalizeFn | None = None
) -> Callable[[RunFn], RunFn]:
    """Decorator registering `fn(config, cell, workdir) -> dict` under `name`.

    Registering the same function twice (a module imported under two names, or
    reloaded) is harmless; registering a different function under a taken name is a
    programming error and raises ValueError.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"experiment name must be a non-empty string, got {name!r}")

    def decorator(fn: RunFn) -> RunFn:
        if not callable(fn):
            raise TypeError(f"experiment {name!r}: {fn!r} is not callable")
        old = _REGISTRY.get(name)
        if old is not None and _origin(old.run) != _origin(fn):
            raise ValueError(
                f"experiment {name!r} is already registered by {_origin(old.run)}; "
                f"cannot register {_origin(fn)} under the same name"
            )
        _REGISTRY[name] = Experiment(name=name, run=fn, validate=validate, finalize=finalize)
        return fn

    return decorator


def get_experiment(name: str) -> Experiment:
    """The experiment registered as `name`; ConfigError listing the known names if none."""
    if name not in _REGISTRY:
        raise ConfigError.invalid("experiment", name, known_experiments() or "(none registered)")
    return _REGISTRY[name]


def known_experiments() -> list[str]:
    return sorted(_REGISTRY)


def import_experiment_module(spec: str) -> types.ModuleType:
    """Imports (once) a module that registers experiments: a dotted name or a ``.py`` path.

    Returns:
      The module.

    Raises:
      ConfigError: the module cannot be found (field ``experiment_module``).
    """
    if spec.endswith(".py") or "/" in spec or "\\" in spec:
        path = user_path(
            spec, "experiment_module", "a dotted module name or the path of an existing .py file"
        ).resolve()
        if not path.is_file():
            raise ConfigError.invalid(
                "experiment_module",
                spec,
                "a dotted module name or the path of an existing .py file",
            )
        # One module per file, named after its path, so that importing it twice (e.g.
        # once per sweep in a notebook) does not run its registrations twice.
        digest = hashlib.sha1(str(path).encode()).hexdigest()[:8]
        mod_name = f"specjax_user_experiments.{path.stem}_{digest}"
        if mod_name in sys.modules:
            return sys.modules[mod_name]
        module_spec = importlib.util.spec_from_file_location(mod_name, path)
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[mod_name] = module
        try:
            module_spec.loader.exec_module(module)
        except ConfigError:
            del sys.modules[mod_name]
            raise
        except (Exception, SystemExit) as e:  # pylint: disable=broad-except
            # Importing runs arbitrary code: an exception, or a sys.exit(), is bad input.
            del sys.modules[mod_name]
            raise _import_error(spec, e, str(path)) from e
        return module
    try:
        return importlib.import_module(spec)
    except ModuleNotFoundError as e:
        if e.name is not None and (spec == e.name or spec.startswith(e.name + ".")):
            raise ConfigError.invalid(
                "experiment_module", spec, "an importable module name or the path of a .py file"
            ) from e
        raise _import_error(spec, e, None) from e
    except ConfigError:
        raise
    except (Exception, SystemExit) as e:  # pylint: disable=broad-except
        raise _import_error(spec, e, None) from e


def _import_error(spec: str, error: BaseException, filename: str | None) -> ConfigError:
    """A module that fails to import, as one line naming ``experiment_module``."""
    import traceback  # pylint: disable=import-outside-toplevel

    where = ""
    if isinstance(error, SyntaxError) and error.lineno:
        where = f" ({error.filename}, line {error.lineno})"
    else:
        frames = traceback.extract_tb(error.__traceback__)
        if filename is not None:
            frames = [f for f in frames if f.filename == filename] or frames
        if frames:
            where = f" ({frames[-1].filename}, line {frames[-1].lineno})"
    text = " ".join(str(error).split())
    return ConfigError(
        f"experiment_module: got {spec!r}, allowed: a module that imports; "
        f"importing it raised {type(error).__name__}: {text}{where}",
        field="experiment_module",
        value=spec,
        allowed="a module that imports",
    )


def _origin(fn: Callable) -> str:
    code = getattr(fn, "__code__", None)
    where = f"{code.co_filename}:{code.co_firstlineno}" if code else repr(fn)
    return f"{getattr(fn, '__qualname__', fn)} ({where})"
