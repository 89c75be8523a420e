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

from specjax.errors import check
from specjax.runner.cli import fail, parse_flags

if "workdir" not in flags.FLAGS:  # shared with specjax.main
    flags.DEFINE_string("workdir", None, "Directory of the run whose report to rebuild.")


def main(argv: Sequence[str]) -> None:
    if len(argv) > 1:
        fail(f"unexpected arguments: {' '.join(argv[1:])}")
    from specjax.runner import report  # pylint: disable=import-outside-toplevel
    from specjax.runner import results  # pylint: disable=import-outside-toplevel

    try:
        workdir = flags.FLAGS.workdir
        check(workdir, "--workdir", workdir, "the directory of a run")
        path = Path(workdir)
        check(path.is_dir(), "--workdir", workdir, "an existing run directory")
        rows = results.read_all_results(path)
        check(rows, "--workdir", workdir, f"a run directory with results "
              f"({results.RESULTS_NAME} is missing or empty)")
    except ValueError as e:  # ConfigError, or a damaged journal
        fail(e)
    out = report.write_report(path, rows)
    print(out)
    _seed_table(path, rows)


def _seed_table(path: Path, rows) -> None:
    """The seed reproduction's summary.json, seed_report.md and seed plot, rebuilt too."""
    import json  # pylint: disable=import-outside-toplevel
    cfg_path = path / "config.json"
    if not cfg_path.is_file():
        return
    config = json.loads(cfg_path.read_text())
    config = config.get("config", config)
    if not config.get("seed_table"):
        return
    import ml_collections  # pylint: disable=import-outside-toplevel
    from specjax.runner import seed_table  # pylint: disable=import-outside-toplevel
    seed_table.write(ml_collections.ConfigDict(config), path, rows)


def entry() -> None:
    app.run(main, flags_parser=parse_flags)


if __name__ == "__main__":
    entry()
