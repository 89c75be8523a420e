"""Rebuilds a run's report from its results, without rerunning anything.

  python -m specjax.report --workdir=runs/seed_reproduction

Writes ``report.md`` and ``plots/*.png`` in the workdir from ``results.jsonl`` (and
``config.json`` / ``version.json`` when present), and for the seed reproduction also
``summary.json``, ``seed_report.md`` and ``plots/seed_policies.png``; see
`specjax.runner.report` and `specjax.runner.seed_table`. Useful
after changing the plotting code, or to look at a sweep that is still running.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from absl import app
from absl import flags

from specjax.errors import ConfigError, check
from specjax.runner.cli import fail, parse_flags

if "workdir" not in flags.FLAGS:  # shared with specjax.main
    flags.DEFINE_string("workdir", None, "Directory of the run whose report to rebuild.")


def main(argv: Sequence[str]) -> None:
    if len(argv) > 1:
        fail(f"unexpected arguments: {' '.join(argv[1:])}")
    from specjax.runner import report  # pylint: disable=import-outside-toplevel

    # Every input is read and checked before anything is rewritten: a report is never
    # rebuilt from unreadable inputs.
    try:
        path, rows, config = _inputs(flags.FLAGS.workdir)
    except ValueError as e:  # ConfigError, or a damaged journal
        fail(e)
    out = report.write_report(path, rows, config)
    print(out)
    _seed_table(path, rows, config)


def _inputs(workdir) -> tuple[Path, list, dict]:
    """(workdir, result rows, config) of a run, each checked; ConfigError otherwise."""
    import json  # pylint: disable=import-outside-toplevel
    import os  # pylint: disable=import-outside-toplevel
    import tempfile  # pylint: disable=import-outside-toplevel

    from specjax.runner import results  # pylint: disable=import-outside-toplevel

    check(workdir and str(workdir).strip(), "--workdir", workdir, "the directory of a run")
    path = Path(workdir).expanduser()
    try:
        check(path.is_dir(), "--workdir", workdir, "an existing run directory")
        journal = results.results_path(path)
        check(not journal.exists() or journal.is_file(), "--workdir", workdir,
              f"a run directory whose {results.RESULTS_NAME} is a file")
        rows = results.read_all_results(path)
    except (OSError, ValueError) as e:
        if isinstance(e, ConfigError):
            raise
        raise ConfigError.invalid("--workdir", workdir, f"a run directory with readable "
                                  f"results ({_reason(e)})") from None
    check(rows, "--workdir", workdir, f"a run directory with results "
          f"({results.RESULTS_NAME} is missing or empty)")
    docs = {}
    for name in ("config.json", "version.json"):
        file = path / name
        if not file.exists():
            continue
        try:
            doc = json.loads(file.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ConfigError(f"{file}: unreadable ({_reason(e)}), allowed: a JSON object "
                              f"(restore it, or remove it to build the report without it)",
                              field=name, value=str(file), allowed="a JSON object") from None
        if not isinstance(doc, dict):
            raise ConfigError(f"{file}: got a JSON {type(doc).__name__}, allowed: a JSON "
                              f"object (restore it, or remove it to build the report without "
                              f"it)", field=name, value=str(file), allowed="a JSON object")
        docs[name] = doc
    for name, kind in (("report.md", "a file"), ("plots", "a directory")):
        target = path / name
        ok = not target.exists() or (target.is_file() if kind == "a file" else target.is_dir())
        check(ok, "--workdir", workdir, f"a run directory where {name} is {kind}")
    try:  # writable: a probe that leaves nothing behind
        os.rmdir(tempfile.mkdtemp(prefix=".specjax-probe-", dir=path))
    except OSError as e:
        raise ConfigError.invalid("--workdir", workdir,
                                  f"a writable run directory ({_reason(e)})") from None
    return path, rows, docs.get("config.json", {})


def _reason(e: BaseException) -> str:
    if isinstance(e, OSError) and e.strerror:
        return e.strerror
    return " ".join(str(e).split())[:200] or type(e).__name__


def _seed_table(path: Path, rows, config: dict) -> None:
    """The seed reproduction's summary.json, seed_report.md and seed plot, rebuilt too."""
    config = config.get("config", config)
    if not isinstance(config, dict) or not config.get("seed_table"):
        return
    import ml_collections  # pylint: disable=import-outside-toplevel
    from specjax.runner import seed_table  # pylint: disable=import-outside-toplevel
    seed_table.write(ml_collections.ConfigDict(config), path, rows)


def entry() -> None:
    app.run(main, flags_parser=parse_flags)


if __name__ == "__main__":
    entry()
