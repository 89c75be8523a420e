"""Where a result came from, attached to everything the experiment scripts write.

Every script under ``experiments/`` records the same four things with its figures:

  command   the command line as it was run, copyable (``python experiments/x.py --a 1``)
  commit    the short git sha, ``-dirty`` when tracked files had uncommitted changes
  date      UTC, to the minute
  machine   CPU model, cores, caches, jax version, device kind, load average (at the start;
            the writers add the load at the end)

and writes through three functions: `write_json` (one result file), `append_row` (a JSON
line per row of a journal) and `write_page` (a results page ``docs/results/<name>.md``
whose first lines are the command, the commit and the date, and the machine and its load at
the start and the end). All three are atomic: the journal's primitives of
`specjax.runner.results` (one ``O_APPEND`` write + ``fsync``; temporary file + ``fsync`` +
rename), imported when a writer runs so that this module stays importable from any layer.

Flags: each script defines its flags in a ``define_flags()`` called from its
``if __name__ == "__main__"`` block (so any number of scripts can be imported together);
`define_common_flags` declares the shared ones (``--out``, ``--repeats``, ``--write_docs``,
``--docs_dir``) with the script's defaults.
"""

from __future__ import annotations

import datetime
import os
import platform
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable, Iterable

from specjax.runner.results import append_result, atomic_write_text

__all__ = [
    "DOCS_DIR",
    "REPO_ROOT",
    "cpu_info",
    "machine",
    "git_commit",
    "command_line",
    "utc_date",
    "provenance",
    "load_average",
    "write_json",
    "append_row",
    "page_header",
    "write_page",
    "write_outputs",
    "define_common_flags",
]

#: The specjax package directory (this module is specjax/runner/provenance.py).
PACKAGE_DIR = Path(__file__).resolve().parents[1]
REPO_ROOT = PACKAGE_DIR.parent
DOCS_DIR = REPO_ROOT / "docs" / "results"

# lscpu keys kept (and the /proc/cpuinfo fallback's equivalents).
_LSCPU_KEYS = ("Model name", "CPU(s)", "L1d cache", "L2 cache", "L3 cache")


def _simd(flags: str) -> str:
    words = set(flags.split())
    return "avx512" if "avx512f" in words else "avx2" if "avx2" in words else "other"


def cpu_info() -> dict[str, str]:
    """CPU model, logical cores, L1d/L2/L3 sizes and SIMD level (``Flags``: avx512, avx2 or
    other), from ``lscpu``, else ``/proc/cpuinfo`` (model, cores, one cache size)."""
    info: dict[str, str] = {}
    try:
        out = subprocess.run(
            ["lscpu"],
            capture_output=True,
            text=True,
            check=False,
            env={**os.environ, "LC_ALL": "C"},
        ).stdout
    except OSError:
        out = ""
    for line in out.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key in _LSCPU_KEYS:
            info[key] = value.strip()
        elif key == "Flags":
            info["Flags"] = _simd(value)
    if "Model name" in info:
        return info
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        text = ""
    cores = 0
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key, value = key.strip(), value.strip()
        if key == "processor":
            cores += 1
        elif key == "model name":
            info.setdefault("Model name", value)
        elif key == "cache size":
            info.setdefault("L2 cache", value)
        elif key == "flags":
            info.setdefault("Flags", _simd(value))
    info.setdefault("Model name", platform.processor() or platform.machine())
    info.setdefault("CPU(s)", str(cores or os.cpu_count() or 0))
    return info


def load_average() -> list[float] | None:
    """``os.getloadavg()`` as a list (None where the platform has none)."""
    try:
        return list(os.getloadavg())
    except (AttributeError, OSError):
        return None


def machine() -> dict[str, Any]:
    """The machine a result was measured on: platform, python, jax and jaxlib versions, the
    default device's kind and count, the CPU (`cpu_info`) and the load average now."""
    import jax  # pylint: disable=import-outside-toplevel  (versions and the device kind)
    import jaxlib  # pylint: disable=import-outside-toplevel

    devices = jax.devices()
    return {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "jax": jax.__version__,
        "jaxlib": jaxlib.__version__,
        "device_kind": devices[0].device_kind,
        "device_count": len(devices),
        **cpu_info(),
        "load_average": load_average(),
    }


def git_commit(root: str | os.PathLike = REPO_ROOT) -> str | None:
    """The short sha of HEAD, with ``-dirty`` when tracked files have uncommitted changes
    (untracked files do not count, nor the results pages under docs/results/: `make docs`
    rewrites them one after another); None outside a git checkout."""

    def git(*args):
        return subprocess.run(
            ["git", "-C", str(root), *args], capture_output=True, text=True, check=True
        ).stdout.strip()

    try:
        sha = git("rev-parse", "--short", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no", "--", ".", ":!docs/results")
    except (OSError, subprocess.CalledProcessError):
        return None
    return sha + ("-dirty" if dirty else "") if sha else None


def command_line(argv: Iterable[str] | None = None) -> str:
    """The command as it was run, copyable: ``python experiments/benchmark.py --batches 1,8``
    (the script's path relative to the working directory when it lies below it; each
    argument shell-quoted)."""
    argv = list(sys.argv if argv is None else argv)
    if not argv:
        return "python"
    script = argv[0]
    module = _package_module(script)
    if module:  # `python -m specjax.x` records the module's file as argv[0]
        return shlex.join(["python", "-m", module, *argv[1:]])
    relative = os.path.relpath(script)
    if not relative.startswith(".."):
        script = relative
    if script.endswith(".py"):
        return shlex.join(["python", script, *argv[1:]])
    return shlex.join([script, *argv[1:]])


def _package_module(script: str) -> str | None:
    """``specjax.x.y`` when `script` is a module file of this package, else None."""
    try:
        path = Path(script).resolve()
        package = PACKAGE_DIR
        rel = path.relative_to(package.parent)
    except (OSError, ValueError):
        return None
    if rel.parts[0] != package.name or rel.suffix != ".py":
        return None
    parts = list(rel.with_suffix("").parts)
    if parts[-1] == "__main__":
        parts = parts[:-1]
    return ".".join(parts)


def utc_date(now: datetime.datetime | None = None) -> str:
    """``YYYY-MM-DD HH:MM UTC``."""
    now = now or datetime.datetime.now(datetime.timezone.utc)
    return now.strftime("%Y-%m-%d %H:%M UTC")


def provenance(argv: Iterable[str] | None = None) -> dict[str, Any]:
    """``{"command", "commit", "date", "machine"}`` of this run, taken now (at its start)."""
    return {
        "command": command_line(argv),
        "commit": git_commit(),
        "date": utc_date(),
        "machine": machine(),
    }


def _with_end(prov: dict[str, Any]) -> dict[str, Any]:
    return {**prov, "load_average_end": load_average()}


def write_json(
    path: str | os.PathLike, result: dict[str, Any], prov: dict[str, Any], *, indent: int | None = 1
) -> Path:
    """Writes ``result`` with ``"provenance": prov`` (plus the load average now, at its end)
    to ``path`` atomically; returns the path. Non-JSON values are written with ``str``."""
    import json  # pylint: disable=import-outside-toplevel

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {**result, "provenance": _with_end(prov)}
    atomic_write_text(path, json.dumps(record, indent=indent, default=str) + "\n")
    return path


def append_row(
    path: str | os.PathLike, row: dict[str, Any], prov: dict[str, Any]
) -> dict[str, Any]:
    """Appends ``row`` with ``"provenance": prov`` to the JSON-lines journal ``path`` as one
    atomic, fsynced line (`specjax.runner.results.append_result`); returns the record."""

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {**row, "provenance": prov}
    append_result(path, record)
    return record


def page_header(title: str, prov: dict[str, Any], load_end: list[float] | None = None) -> list[str]:
    """A results page's first lines: the title, then the exact command, the commit and the
    date, then the machine with its load average at the start and the end."""
    m = prov.get("machine", {})
    start = m.get("load_average") or [float("nan")]
    end = load_end or [float("nan")]
    caches = ", ".join(f"{k.split()[0]} {m[k]}" for k in ("L2 cache", "L3 cache") if m.get(k))
    return [
        f"# {title}",
        "",
        f"Written by `{prov['command']}` at commit `{prov.get('commit')}` on {prov['date']}.",
        f"Machine: {m.get('Model name')} ({m.get('CPU(s)')} cores, {m.get('Flags')})"
        + (f", {caches}" if caches else "")
        + f"; jax {m.get('jax')} on {m.get('device_count')} {m.get('device_kind')} "
        f"device(s); load average {start[0]:.2f} at the start, {end[0]:.2f} at the end.",
        "",
    ]


def write_page(
    name: str,
    title: str,
    body: list[str],
    prov: dict[str, Any],
    docs_dir: str | os.PathLike = DOCS_DIR,
) -> Path:
    """Writes ``<docs_dir>/<name>.md`` atomically: `page_header` (the load at its end taken
    now) followed by the ``body`` lines; returns the path."""

    path = Path(docs_dir) / f"{name}.md"
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = page_header(title, prov, load_average()) + list(body)
    atomic_write_text(path, "\n".join(lines).rstrip("\n") + "\n")
    return path


def write_outputs(
    json_path: str | os.PathLike,
    result: dict[str, Any],
    prov: dict[str, Any],
    *,
    page: str | None = None,
    title: str = "",
    body: Callable[[dict[str, Any]], list[str]] | None = None,
    docs_dir: str | os.PathLike = DOCS_DIR,
) -> None:
    """A script's writes: its JSON (`write_json`) and, when ``page`` names one, its results
    page ``<docs_dir>/<page>.md`` (`write_page`, its body ``body(result)``); prints each
    path."""
    print(f"wrote {write_json(json_path, result, prov)}")
    if page is not None:
        print(f"wrote {write_page(page, title, body(result), prov, docs_dir)}")


def define_common_flags(
    *,
    out: str | None,
    repeats: int | None = None,
    page: str | None = None,
    docs_dir: str | None = None,
) -> None:
    """Declares the flags every script shares, with this script's defaults: ``--out`` (its
    output directory), ``--repeats`` (timed runs per configuration, when ``repeats`` is
    given) and, when the script writes a results page ``page``, ``--write_docs`` and
    ``--docs_dir`` (default ``docs_dir``, else docs/results; a script whose question has no
    page there writes its page beside its JSON). Call it from the script's
    ``define_flags()``, never at import."""
    from absl import flags  # pylint: disable=import-outside-toplevel

    flags.DEFINE_string("out", out, "output directory")
    if repeats is not None:
        flags.DEFINE_integer("repeats", repeats, "timed runs per configuration (after one warm-up)")
    if page is not None:
        flags.DEFINE_bool(
            "write_docs", False, f"write the results page <docs_dir>/{page}.md from this run"
        )
        flags.DEFINE_string(
            "docs_dir",
            docs_dir or str(DOCS_DIR.relative_to(REPO_ROOT)),
            "directory of the results pages --write_docs writes",
        )
