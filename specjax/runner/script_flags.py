"""The ``experiments/`` scripts' command line, held to the sweep's standard (`specjax.main`).

Each script ends with::

    if __name__ == "__main__":
        define_flags()
        script_flags.run(main, validate, "benchmark_real")

and `run` does, in this order, before the script's ``main`` prints, loads or writes
anything:

  1. the ``SPECJAX_*`` environment (`specjax.errors.check_environment`);
  2. the flags: an unknown flag, a value absl cannot parse, a registered validator;
  3. no positional arguments;
  4. the script's ``validate()``: every flag checked as a config's field is (ranges,
     finite numbers, names from the registries, input files present and readable, output
     folders creatable and writable), with the checks below.

Any of them failing prints one line ``<script>: error: <field>: got <value>, allowed:
<what>`` on stderr (`specjax.runner.cli.fail`: no traceback, exit status 2) and nothing
else: log records are held while validating (`specjax.runner.cli.hold_logs`).

The checks (each returns the parsed value or raises `specjax.errors.ConfigError` naming
the flag, the value and what is allowed): `integer`, `integers`, `number`, `numbers`,
`names`, `dtype`, `out_dir`, `out_file`, `in_dir`, `in_file`, `npz_file`, `drafter_file`,
`zoo`, `rule`, `doc_name`, `packages`, `accelerator` (the last starts JAX's backends with
their C++ warnings held: `StderrHeld`).

A script whose ``--out`` names a file rather than a folder (`experiments/distributed_generate.py`:
one file per process) passes ``out="file"`` to `run`.
"""

from __future__ import annotations

import math
import os
import sys
import zipfile
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from specjax.errors import ConfigError, check, check_environment, dir_problem, user_path
from specjax.runner import cli

__all__ = [
    "run",
    "check",
    "parse_flags",
    "integer",
    "integers",
    "number",
    "numbers",
    "names",
    "dtype",
    "DTYPES",
    "out_dir",
    "in_dir",
    "in_file",
    "npz_file",
    "drafter_file",
    "zoo",
    "zoo_drafters",
    "rule",
    "doc_name",
    "packages",
    "accelerator",
    "StderrHeld",
    "out_file",
    "common",
    "fail",
]

#: The dtypes the configs allow for a real model (`specjax.runner.smollm2_deployment`).
DTYPES = ("float32", "bfloat16")


def run(main: Callable, validate: Callable[[], Any] | None, prog: str, *, out: str = "dir") -> None:
    """absl's ``app.run(main)`` with every input checked first (see the module); `out`:
    what ``--out`` names, ``"dir"`` (a folder) or ``"file"``."""
    from absl import app  # pylint: disable=import-outside-toplevel

    def checked_main(argv):
        if len(argv) > 1:
            cli.fail(
                ConfigError.invalid(
                    "arguments", " ".join(argv[1:]), "flags only (--name=value); none bare"
                ),
                prog,
            )
        with cli.hold_logs() as logs:
            try:
                common(out_is_file=out == "file")
                if validate is not None:
                    validate()
            except (Exception, SystemExit) as e:  # pylint: disable=broad-except
                cli.fail(cli.config_error_in(e) or _validation_error(e), prog)
        logs.release()
        return main(argv)

    app.run(checked_main, flags_parser=lambda argv: parse_flags(argv, prog))


def parse_flags(argv: Sequence[str], prog: str) -> list[str]:
    """The environment, then the flags: any error is one line ``<prog>: error: ...``."""
    from absl import flags  # pylint: disable=import-outside-toplevel

    try:
        check_environment()
    except ConfigError as e:
        cli.fail(e, prog)
    try:
        return flags.FLAGS(list(argv))
    except flags.Error as e:
        cli.fail(e, prog)


def _validation_error(error: BaseException) -> ConfigError:
    """An error other than a ConfigError raised while the flags were validated, as one
    line naming where it was raised (a bug in a check, or a library tripping on input)."""
    import traceback  # pylint: disable=import-outside-toplevel

    frames = traceback.extract_tb(error.__traceback__)
    where = f" ({frames[-1].filename}, line {frames[-1].lineno})" if frames else ""
    if isinstance(error, SystemExit):
        if isinstance(error.code, str):
            return ConfigError(error.code.split("error: ", 1)[-1])
        return ConfigError(f"validating the flags called sys.exit({error.code!r}){where}")
    what = " ".join(str(error).split())[:300]
    return ConfigError(f"validating the flags raised {type(error).__name__}: {what}{where}")


def _flags():
    from absl import flags  # pylint: disable=import-outside-toplevel

    return flags.FLAGS


def common(out_is_file: bool = False) -> None:
    """The flags `specjax.runner.provenance.define_common_flags` declares, where the script has
    them: ``--out`` a folder that exists or can be created (`out_is_file`: a file that
    can be written), ``--repeats`` >= 1, and with ``--write_docs`` a ``--docs_dir`` that can
    be written."""
    flags = _flags()
    if "out" in flags and flags["out"].value is not None:
        (out_file if out_is_file else out_dir)("--out", flags.out)
    if "repeats" in flags:
        integer("--repeats", flags.repeats, 1)
    if "write_docs" in flags and flags.write_docs and "docs_dir" in flags:
        out_dir("--docs_dir", flags.docs_dir)


# ----------------------------------------------------------------------------------------
# Checks
# ----------------------------------------------------------------------------------------


def _bounds(lo, hi, kind: str) -> str:
    if lo is not None and hi is not None:
        return f"{kind} in [{lo}, {hi}]"
    if lo is not None:
        return f"{kind} >= {lo}"
    if hi is not None:
        return f"{kind} <= {hi}"
    return kind


def integer(field: str, value: Any, lo: int | None = None, hi: int | None = None) -> int:
    """`value` (an int or its text) as an int within [lo, hi]."""
    allowed = _bounds(lo, hi, "an integer")
    try:
        n = int(str(value).strip()) if not isinstance(value, bool) else None
    except ValueError:
        n = None
    check(n is not None, field, value, allowed)
    check((lo is None or n >= lo) and (hi is None or n <= hi), field, value, allowed)
    return n


def integers(
    field: str, values: Iterable, lo: int | None = 1, hi: int | None = None, *, empty: bool = False
) -> list[int]:
    """A comma-separated list flag of integers within [lo, hi] (non-empty unless `empty`),
    distinct."""
    values = list(values)
    allowed = f"a comma-separated list of {_bounds(lo, hi, 'integers')}"
    check(empty or values, field, ",".join(map(str, values)), allowed)
    out = []
    for v in values:
        try:
            out.append(integer(field, v, lo, hi))
        except ConfigError:
            raise ConfigError.invalid(field, ",".join(map(str, values)), allowed) from None
    check(
        len(set(out)) == len(out),
        field,
        ",".join(map(str, values)),
        f"{allowed}, each once",
    )
    return out


def number(
    field: str,
    value: Any,
    lo: float | None = None,
    hi: float | None = None,
    *,
    lo_open: bool = False,
) -> float:
    """`value` as a finite float within [lo, hi] (`lo_open`: > lo)."""
    allowed = _bounds(lo, hi, "a finite number")
    if lo_open:
        allowed = allowed.replace(f">= {lo}", f"> {lo}").replace(f"in [{lo},", f"in ({lo},")
    try:
        x = float(str(value).strip()) if not isinstance(value, bool) else math.nan
    except ValueError:
        x = math.nan
    check(math.isfinite(x), field, value, allowed)
    ok_lo = lo is None or (x > lo if lo_open else x >= lo)
    check(ok_lo and (hi is None or x <= hi), field, value, allowed)
    return x


def numbers(
    field: str, values: Iterable, lo: float | None = None, hi: float | None = None
) -> list[float]:
    """A non-empty comma-separated list flag of finite numbers within [lo, hi], distinct."""
    values = list(values)
    allowed = f"a comma-separated list of {_bounds(lo, hi, 'finite numbers')}"
    check(values, field, "", allowed)
    out = []
    for v in values:
        try:
            out.append(number(field, v, lo, hi))
        except ConfigError:
            raise ConfigError.invalid(field, ",".join(map(str, values)), allowed) from None
    check(len(set(out)) == len(out), field, ",".join(map(str, values)), f"{allowed}, each once")
    return out


def names(field: str, values: Iterable, allowed: Sequence[str], *, empty: bool = False) -> list:
    """A comma-separated list flag of names from `allowed` (non-empty unless `empty`),
    each once."""
    values = list(values)
    text = ",".join(map(str, values))
    what = f"a comma-separated list of {', '.join(allowed)}"
    check(empty or values, field, text, what)
    for v in values:
        check(v in allowed, field, text, f"{what} ({v!r} is none of them)")
    check(len(set(values)) == len(values), field, text, f"{what}, each once")
    return values


def dtype(field: str, value: Any) -> str:
    """A real model's dtype: one of `DTYPES` (what the configs allow)."""
    check(value in DTYPES, field, value, list(DTYPES))
    return value


def out_dir(field: str, value: Any) -> Path:
    """An output folder: a directory that exists and is writable, or can be created (no
    part of it a file). Nothing is created; a probe directory is made and removed at once
    in the nearest existing ancestor."""
    path = user_path(value, field, "a folder that exists or can be created")
    problem = dir_problem(str(path))
    check(
        problem is None,
        field,
        str(value),
        f"a folder that exists and is writable or can be created ({problem})",
    )
    return path


def out_file(field: str, value: Any) -> Path:
    """An output file: not a folder, in a folder that exists and is writable or can be
    created (nothing is created)."""
    allowed = "a file path in a folder that exists and is writable or can be created"
    path = user_path(value, field, allowed)
    check(not path.is_dir(), field, str(value), f"{allowed} ({path} is a folder)")
    check(path.name not in ("", ".", ".."), field, str(value), allowed)
    problem = dir_problem(str(path.parent))
    check(problem is None, field, str(value), f"{allowed} ({problem})")
    check(
        not path.exists() or os.access(path, os.W_OK),
        field,
        str(value),
        f"{allowed} ({path} exists and is not writable)",
    )
    return path


def in_dir(field: str, value: Any, allowed: str = "an existing folder") -> Path:
    """An input folder that exists."""
    path = user_path(value, field, allowed)
    check(path.is_dir(), field, str(value), allowed)
    return path


def in_file(field: str, value: Any, allowed: str = "an existing readable file") -> Path:
    """An input file that exists and can be opened."""
    path = user_path(value, field, allowed)
    check(path.is_file(), field, str(value), allowed)
    try:
        with open(path, "rb"):
            pass
    except OSError as e:
        raise ConfigError.invalid(field, str(value), f"{allowed} ({e.strerror})") from None
    return path


def npz_file(
    field: str,
    value: Any,
    allowed: str = "an existing .npz file",
    keys: Iterable[str] = (),
    shown: str | None = None,
) -> Path:
    """An ``.npz`` input whose zip directory reads (a truncated or foreign file does not)
    and that holds `keys`. The members' bytes are checked when they are read (the loaders
    name the file then); `shown` is the value named in the error (default: `value`)."""
    if shown is None:
        path = in_file(field, value, allowed)
        shown = str(value)
    else:
        try:
            path = in_file(field, value, allowed)
        except ConfigError:
            raise ConfigError.invalid(
                field, shown, f"{allowed} ({value}: not an existing readable file)"
            ) from None
    try:
        with zipfile.ZipFile(path) as z:
            members = {n[:-4] if n.endswith(".npy") else n for n in z.namelist()}
    except (zipfile.BadZipFile, OSError, ValueError, EOFError) as e:
        what = " ".join(str(e).split())[:120] or type(e).__name__
        raise ConfigError.invalid(
            field, shown, f"{allowed} ({path}: not a readable .npz: {what})"
        ) from None
    missing = [k for k in keys if k not in members]
    check(not missing, field, shown, f"{allowed} ({path} lacks {', '.join(missing)})")
    return path


def fail(error: BaseException | str, prog: str) -> None:
    """`specjax.runner.cli.fail` under a script's name (for errors found after `run`'s
    checks, e.g. in a stage's input)."""
    sys.stdout.flush()
    cli.fail(error, prog)


def drafter_file(
    field: str, value: Any, *, feature: bool = False, shown: str | None = None
) -> Path:
    """A SmolLM2 drafter ``.npz`` (a shipped name or a file, `real_zoo.drafter_path`) with
    its ``.json`` beside it, both readable; `feature`: a feature drafter (train_eagle.py's
    ``eagle*.npz``), else a distilled one (train_drafters.py's ``drafter_*.npz``)."""
    import json  # pylint: disable=import-outside-toplevel

    from specjax.models.drafter_kinds import find  # pylint: disable=import-outside-toplevel
    from specjax.models.real_zoo import drafter_path  # pylint: disable=import-outside-toplevel

    kind = (
        "feature drafter (train_eagle.py's eagle*.npz)"
        if feature
        else ("distilled drafter (train_drafters.py's drafter_*.npz)")
    )
    allowed = f"a {kind} with its .json beside it"
    shown = str(value) if shown is None else shown
    try:
        path = drafter_path(value)
    except (TypeError, ValueError):
        raise ConfigError.invalid(field, shown, allowed) from None
    npz_file(field, path, allowed, shown=shown)
    jpath = path.with_suffix(".json")
    check(jpath.is_file(), field, shown, f"{allowed} ({jpath} is missing)")
    try:
        info = json.loads(jpath.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        what = " ".join(str(e).split())[:120]
        raise ConfigError.invalid(field, shown, f"{allowed} ({jpath}: not JSON: {what})") from None
    check(
        isinstance(info, dict) and isinstance(info.get("config"), dict),
        field,
        shown,
        f"{allowed} ({jpath}: no 'config' object)",
    )
    saved = find(info.get("kind"))  # the drafter kind the file names (a feature drafter's)
    check(
        (saved is not None and saved.reads_features) == feature,
        field,
        shown,
        f"{allowed} ({path} is {'not ' if feature else ''}a feature drafter)",
    )
    return path


def zoo(field: str, value: Any) -> tuple[Path, dict]:
    """A model zoo folder (None or empty: ``$SPECJAX_ZOO``, else the shipped zoo) whose
    manifest reads and checks (`specjax.models.zoo.read_manifest`: no weights are read);
    returns (folder, manifest). A bad ``$SPECJAX_ZOO`` is named as the variable."""
    from specjax.models import zoo as zoo_lib  # pylint: disable=import-outside-toplevel

    if value in (None, ""):
        try:
            return zoo_lib.read_manifest(None)
        except ConfigError as e:
            if e.field == "SPECJAX_ZOO":
                raise
            env = os.environ.get("SPECJAX_ZOO")
            if env:  # --zoo unset: the variable names the zoo
                raise ConfigError.invalid("SPECJAX_ZOO", env, f"a model zoo folder: {e}") from None
            raise ConfigError.invalid(
                field, value, f"a model zoo folder (unset: the shipped zoo, which fails: {e})"
            ) from None
    path = user_path(value, field, "a model zoo folder (experiments/train_zoo.py's --out)")
    try:
        return zoo_lib.read_manifest(path)
    except ConfigError as e:
        raise ConfigError.invalid(
            field, str(value), f"a model zoo folder (experiments/train_zoo.py's --out): {e}"
        ) from None


def zoo_drafters(manifest: dict) -> list[str]:
    """A zoo manifest's drafters: its ``drafter_order``, then its ``extra_drafters``."""
    return [*manifest["drafter_order"], *manifest.get("extra_drafters", [])]


def rule(field: str, value: Any, chains: int = 1) -> str:
    """A verification rule's name (`specjax.verify.registry`) that verifies rows of
    `chains` chains."""
    from specjax.verify import registry  # pylint: disable=import-outside-toplevel

    fits = [r.name for r in registry.all_rules() if r.allows_slots(chains)]
    what = "one chain" if chains == 1 else f"{chains} chains"
    check(value in fits, field, value, f"a rule for rows of {what}: one of {', '.join(fits)}")
    return value


def doc_name(field: str, value: Any) -> str:
    """The name of a results page (``<docs_dir>/<name>.md``): a file name, no '/'."""
    check(
        isinstance(value, str) and value and "/" not in value and value not in (".", ".."),
        field,
        value,
        "a file name (no '/')",
    )
    return value


def accelerator(flag: str) -> str:
    """JAX's default backend (``"gpu"``, ``"tpu"``), or a `ConfigError` naming `flag` when
    JAX sees only the CPU or cannot start the backend ``JAX_PLATFORMS`` asks for.

    The backends start with the process's stderr (file descriptor 2) held (`StderrHeld`):
    a plugin that finds no chip writes its warnings there from C++ (libtpu without a TPU:
    "could not determine TPU accelerator type", worker hostnames), which neither absl's
    logging nor `cli.hold_logs` can hold. They are dropped when the check fails, so the
    error is the only line, and written out when it passes.
    """
    import jax  # pylint: disable=import-outside-toplevel

    asked = os.environ.get("JAX_PLATFORMS") or "unset: every installed backend"
    held = StderrHeld()
    try:
        with held:
            backend, devices = jax.default_backend(), jax.devices()
    except (RuntimeError, AssertionError) as e:  # JAX_PLATFORMS: none starts, none installed
        first = " ".join(str(e).split())[:200] or "no backend it names is installed"
        raise ConfigError.invalid(
            flag, True, f"false where JAX starts no accelerator (JAX_PLATFORMS={asked}: {first})"
        ) from None
    check(
        backend != "cpu",
        flag,
        True,
        f"false where JAX sees only the CPU (JAX_PLATFORMS={asked}; {len(devices)} "
        f"{devices[0].platform} device(s); install jax[cuda] or jax[tpu])",
    )
    held.release()
    return backend


class StderrHeld:
    """Within it, whatever is written to file descriptor 2 (C++ libraries' warnings, and
    Python's `sys.stderr`) is kept aside; `release` writes it out (call it once what was
    done inside is known to be fine), else it is dropped."""

    def __init__(self) -> None:
        self.held = b""

    def __enter__(self) -> "StderrHeld":
        import tempfile  # pylint: disable=import-outside-toplevel

        sys.stderr.flush()
        self._sink = tempfile.TemporaryFile()
        self._saved = os.dup(2)
        os.dup2(self._sink.fileno(), 2)
        return self

    def __exit__(self, *exc) -> bool:
        try:
            sys.stderr.flush()
        finally:
            os.dup2(self._saved, 2)
            os.close(self._saved)
        with self._sink:
            self._sink.seek(0)
            self.held = self._sink.read()
        return False

    def release(self) -> None:
        if self.held:
            sys.stderr.flush()
            os.write(2, self.held)
        self.held = b""


def packages(names: Sequence[str], why: str) -> None:
    """The Python packages `names` are installed (found, not imported)."""
    import importlib.util  # pylint: disable=import-outside-toplevel

    missing = []
    for n in names:
        try:
            found = importlib.util.find_spec(n) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            missing.append(n)
    check(
        not missing,
        "packages",
        ", ".join(missing),
        f"{', '.join(names)} installed ({why})",
    )
