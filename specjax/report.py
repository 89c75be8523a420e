"""Rebuilds a run's report from its results, without rerunning anything.

  python -m specjax.report --workdir=runs/seed_reproduction

Writes ``report.md`` and ``plots/*.png`` in the workdir from ``results.jsonl`` (and
``config.json`` / ``version.json`` when present), and for the seed reproduction also
``summary.json``, ``seed_report.md`` and ``plots/seed_policies.png``; see
`specjax.runner.report` and `specjax.runner.seed_table`. Useful
after changing the plotting code, or to look at a sweep that is still running.

``--docs_page=docs/results/<name>.md`` also writes a results page headed by this command
and the run's: the seed table for the seed reproduction, else the report's tables with its
plots copied into ``docs/results/<name>/``:

  python -m specjax.report --workdir=runs/sweep_kl_ceiling --docs_page=docs/results/sweep_kl_ceiling.md
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from absl import app, flags

from specjax.errors import ConfigError, check, user_path
from specjax.runner.cli import config_error_in, fail, hold_logs, parse_flags, warn

if "workdir" not in flags.FLAGS:  # shared with specjax.main
    flags.DEFINE_string("workdir", None, "Directory of the run whose report to rebuild.")
flags.DEFINE_string(
    "docs_page",
    None,
    "Also write a results page at this path, headed by this command, the run's command, "
    "their commits and dates, and the machine: the seed table for the seed reproduction "
    "(e.g. docs/results/seed_report_real.md), else the report's tables and plots (e.g. "
    "docs/results/sweep_gamma_temperature.md; the plots copied into a folder of the "
    "page's name beside it).",
)
flags.DEFINE_bool(
    "docs_append",
    False,
    "With --docs_page: add this run's table to that existing page as a section of its own "
    "(headed by its workdir; a rerun replaces the section) instead of rewriting the page: "
    "one page per question, e.g. the routers on two workloads.",
)
flags.DEFINE_multi_string(
    "compare_with",
    None,
    "Other runs of the seed table, comma-separated or the flag repeated: one on the other kind "
    "of deployment (zoo vs a real verifier), or several of different deployments (at most one "
    "zoo-kind, and one per real deployment: smollm2, gemma3, hf). seed_report.md then opens "
    "with the seed's four claims judged on each, side by side, a column per deployment "
    "(specjax.runner.seed_compare). The other runs are only read.",
)


def main(argv: Sequence[str]) -> None:
    if len(argv) > 1:
        fail(f"unexpected arguments: {' '.join(argv[1:])}")
    from specjax.runner import report  # pylint: disable=import-outside-toplevel

    try:
        page = _docs_page_path(flags.FLAGS.docs_page) if flags.FLAGS.docs_page else None
        if flags.FLAGS.docs_append:  # before anything is built or written
            check(
                page is not None and page.is_file(),
                "--docs_page",
                flags.FLAGS.docs_page,
                "an existing page with --docs_append (write it first)",
            )
    except ConfigError as e:
        fail(e)
    # Every input is read and checked, and every output built in memory, before anything
    # is rewritten: a report is never rebuilt from unreadable inputs, nor half rebuilt.
    try:
        with hold_logs() as logs:  # a torn line's warning is printed only on success
            inputs = _inputs(flags.FLAGS.workdir)
            built = _build(inputs)
    except Exception as e:  # pylint: disable=broad-except
        # A ConfigError, else whatever the run's files trip: one line naming the workdir.
        fail(
            config_error_in(e)
            or ConfigError.invalid(
                "--workdir", flags.FLAGS.workdir, f"a run directory whose files read ({_where(e)})"
            )
        )
    logs.release()
    if flags.FLAGS.compare_with:  # built before anything is written
        built = _with_comparison(inputs, built, flags.FLAGS.compare_with)
    path, outside = inputs[0], inputs[4]
    if outside:
        from specjax.runner import results  # pylint: disable=import-outside-toplevel

        warn(
            f"{path / results.RESULTS_NAME}: {len(outside)} row(s) are no cell of the grid "
            f"in config.json (first: {outside[0][1]}); listed in report.md, left out of "
            f"every figure"
        )
    out = report.commit_report(path, *built["report"])
    print(out)
    if built["seed_table"] is not None:
        from specjax.runner import seed_table  # pylint: disable=import-outside-toplevel

        seed_table.commit(path, built["seed_table"])
        print(built["seed_table"]["markdown"])
    if page is not None:
        if built["seed_table"] is not None:
            md = built["seed_table"]["markdown"]
            if flags.FLAGS.docs_append:
                print(_append_docs_section(page, path, inputs[3], md))
            else:
                print(_write_docs_page(page, path, inputs[3], md))
        else:
            print(write_sweep_page(page, path, inputs[1], inputs[2], inputs[3], built["report"][0]))


def _compare_runs(value) -> list[str]:
    """--compare_with's run directories: the flag's values (one, or the flag repeated), each
    split at commas; an empty entry is an error."""
    values = [value] if isinstance(value, str) else list(value or [])
    runs = [part.strip() for v in values for part in str(v).split(",")]
    check(
        runs and all(runs),
        "--compare_with",
        ",".join(map(str, values)),
        "one or more run directories, comma-separated (or the flag repeated)",
    )
    return runs


def _with_comparison(inputs, built: dict, value) -> dict:
    """`built` with the seed table's markdown replaced by the side-by-side page (this run and
    the --compare_with runs, a column per deployment: `seed_compare.arrange`, `build_sides`)
    followed by this run's own table. One line on bad input."""
    from specjax.runner import seed_compare  # pylint: disable=import-outside-toplevel

    other = value if isinstance(value, str) else ",".join(map(str, value or []))
    try:
        check(
            built["seed_table"] is not None,
            "--compare_with",
            other,
            "only with a --workdir run of seed_table=True (the seed reproduction)",
        )
        theirs = []
        for other in _compare_runs(value):
            o_path, o_rows, o_config, o_version = _read_run(other, "--compare_with")
            side = seed_compare.side(o_rows, o_config, o_path, o_version)
            check(
                side is not None,
                "--compare_with",
                other,
                "a run of the plans experiment (its results.jsonl has no plans rows)",
            )
            theirs.append(side)
        path, rows, config, version, _ = inputs
        ours = seed_compare.side(rows, _run_config(config), path, version)
        sides = seed_compare.arrange([ours, *theirs])
        page = seed_compare.build_sides(sides, built["seed_table"]["markdown"])
    except Exception as e:  # pylint: disable=broad-except
        fail(
            config_error_in(e)
            or ConfigError.invalid(
                "--compare_with", other, f"a run directory whose files read ({_where(e)})"
            )
        )
    return dict(built, seed_table=dict(built["seed_table"], markdown=page))


def _read_run(workdir, flag: str) -> tuple[Path, list, dict, dict]:
    """(path, rows of its grid, config, version) of a run that is only read."""
    import json  # pylint: disable=import-outside-toplevel

    from specjax.runner import results  # pylint: disable=import-outside-toplevel

    check(workdir and str(workdir).strip(), flag, workdir, "the directory of a run")
    path = user_path(workdir, flag, "the directory of a run")
    check(path.is_dir(), flag, workdir, "an existing run directory")
    try:
        rows = results.read_all_results(path)
    except (OSError, ValueError) as e:
        raise ConfigError.invalid(
            flag, workdir, f"a run directory with readable results ({_reason(e)})"
        ) from None
    check(rows, flag, workdir, f"a run directory with results ({results.RESULTS_NAME})")
    docs = {}
    for name in ("config.json", "version.json"):
        try:
            doc = json.loads((path / name).read_text(encoding="utf-8"))
        except FileNotFoundError:
            doc = {}
        except (OSError, ValueError, RecursionError) as e:
            raise ConfigError.invalid(
                flag, str(path / name), f"a readable JSON object ({_reason(e)})"
            ) from None
        check(isinstance(doc, dict), flag, str(path / name), "a JSON object")
        docs[name] = doc
    config = _run_config(docs["config.json"])
    rows, _ = _split_by_grid(path, rows, config)
    return path, rows, config, docs["version.json"]


def _append_docs_section(page, workdir: Path, version: dict, markdown: str) -> Path:
    """--docs_append: the run's seed table as a section of the existing results ``page``,
    headed by its workdir (a section of the same workdir is replaced); the page is
    rewritten atomically (`main` has checked that it exists)."""
    from specjax.runner import results  # pylint: disable=import-outside-toplevel

    page = Path(page)
    head = f"## Also: the run in `{workdir}`"
    text = page.read_text(encoding="utf-8").split(f"\n{head}\n", 1)[0].rstrip()
    lines = markdown.splitlines()
    if lines and lines[0].startswith("# "):
        lines = lines[1:]
    lines = [f"#{ln}" if ln.startswith("## ") else ln for ln in lines]  # one level down
    body = [text, "", head, "", *_run_lines(workdir, version), *lines]
    results.atomic_write_text(page, "\n".join(body).rstrip() + "\n")
    return page


def _run_lines(workdir: Path, version: dict) -> list[str]:
    """Who ran the cells: the run's command, commit and start (its version.json)."""
    from specjax.runner import provenance  # pylint: disable=import-outside-toplevel

    argv = version.get("argv") or []
    run_cmd = provenance.command_line(argv) if argv else "(not recorded)"
    run_commit = str(version.get("git_commit") or "?")[:7] + (
        "-dirty" if version.get("git_dirty") else ""
    )
    return [
        f"The cells were run by `{run_cmd}` at commit `{run_commit}`, started "
        f"{version.get('started_at', '(not recorded)')}; the workdir was `{workdir}`.",
        "",
    ]


def _write_docs_page(page, workdir: Path, version: dict, markdown: str) -> Path:
    """The seed table as a results page: the report's markdown under a header naming the
    command that ran the cells (from the run's version.json) and this command."""
    import shutil  # pylint: disable=import-outside-toplevel

    from specjax.runner import provenance, seed_report  # pylint: disable=import-outside-toplevel

    page = Path(page)
    prov = provenance.provenance()
    body = _run_lines(workdir, version)
    plots = workdir / "plots"
    lines = markdown.splitlines()
    # Plots the report links to (plots/x.png) are copied beside the page, renamed after it.
    for i, line in enumerate(lines):
        if "](plots/" in line:
            name = line.split("](plots/", 1)[1].split(")", 1)[0]
            target = page.with_name(f"{page.stem}_{name}")
            if (plots / name).is_file():
                page.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(plots / name, target)
            lines[i] = line.replace(f"](plots/{name})", f"]({target.name})")
    title = "The field report's table, reproduced"
    if lines and lines[0].startswith("# "):
        if lines[0][2:] == seed_report.ROUTERS_TITLE:  # a routing run's page keeps its title
            title = seed_report.ROUTERS_TITLE
        lines = lines[1:]
    return provenance.write_page(page.stem, title, body + lines, prov, docs_dir=page.parent)


def _docs_page_path(value) -> Path:
    """--docs_page as a path: a Markdown file (``.md``) whose folder is not a file."""
    check(str(value).strip(), "--docs_page", value, "a path ending in .md")
    page = user_path(value, "--docs_page", "a path ending in .md")
    check(page.suffix == ".md", "--docs_page", value, "a path ending in .md")
    check(
        not page.is_dir() and not page.parent.is_file(),
        "--docs_page",
        value,
        "a path ending in .md, in a directory (not a file), that is not a directory",
    )
    return page


def write_sweep_page(
    page, workdir: Path, rows: list, config: dict, version: dict, markdown: str
) -> Path:
    """A sweep's results page: the provenance header (this command, its commit and date,
    the machine and its load), a line naming the command that ran the cells (the run's
    version.json), their commit, start and the time they took (from the rows), then the
    report's tables and plots. The plots (``plots/x.png`` in the workdir) are copied into
    the folder ``<page's stem>/`` beside the page and linked from it; PNGs there that the
    report no longer draws are removed."""
    import shutil  # pylint: disable=import-outside-toplevel

    from specjax.runner import provenance  # pylint: disable=import-outside-toplevel

    page = Path(page)
    prov = provenance.provenance()
    argv = version.get("argv") or []
    run_cmd = provenance.command_line(argv) if argv else "(not recorded)"
    run_commit = str(version.get("git_commit") or "?")[:7] + (
        "-dirty" if version.get("git_dirty") else ""
    )
    seconds = [r.get("wall_time_s") for r in rows if isinstance(r.get("wall_time_s"), (int, float))]
    finished = sorted(str(r["finished_at"]) for r in rows if r.get("finished_at"))
    took = f"; the cells' own seconds sum to {sum(seconds):.0f} s" if seconds else ""
    span = _span_s(version.get("started_at"), finished[-1] if finished else None)
    if span is not None:
        took += f", {span / 60:.1f} min from the run's start to its last cell"
    body = [
        f"The {len(rows)} cells were run by `{run_cmd}` at commit `{run_commit}`, started "
        f"{version.get('started_at', '(not recorded)')}{took}; the workdir was `{workdir}`. "
        f"The tables and plots below are that run's report (`report.md`).",
        "",
    ]
    folder = page.with_suffix("")
    lines = markdown.splitlines()
    copied = set()
    for i, line in enumerate(lines):
        while "](plots/" in line:
            name = line.split("](plots/", 1)[1].split(")", 1)[0]
            source = workdir / "plots" / name
            check(source.is_file(), "--workdir", str(workdir), f"a run whose plots/{name} exists")
            folder.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, folder / name)
            copied.add(name)
            line = line.replace(f"](plots/{name})", f"]({folder.name}/{name})")
        lines[i] = line
    if folder.is_dir():
        for stale in folder.glob("*.png"):
            if stale.name not in copied:
                stale.unlink()
    title = lines[0][2:] if lines and lines[0].startswith("# ") else page.stem
    if lines and lines[0].startswith("# "):
        lines = lines[1:]
    while lines and not lines[0].strip():
        lines = lines[1:]
    name = Path(str(next((a for a in argv if a.startswith("--config=")), "")).split("=", 1)[-1])
    config_name = name.name.split(":", 1)[0] if name.name else page.stem
    return provenance.write_page(
        page.stem, f"{config_name}: {title}", body + lines, prov, docs_dir=page.parent
    )


def _span_s(start, end) -> float | None:
    """Seconds between two ISO dates (None when either is missing or unreadable)."""
    import datetime  # pylint: disable=import-outside-toplevel

    try:
        a = datetime.datetime.fromisoformat(str(start))
        b = datetime.datetime.fromisoformat(str(end))
    except ValueError:
        return None
    return (b - a).total_seconds() if start and end else None


def _build(inputs) -> dict:
    """report.md, its plots and the seed table's files, in memory. Rows that cannot be
    reported are a ConfigError naming the journal (never a traceback after a write)."""
    from specjax.runner import report, results  # pylint: disable=import-outside-toplevel

    path, rows, config, version, outside = inputs
    journal = path / results.RESULTS_NAME
    try:
        out = {
            "report": report.render_report(rows, config, version, outside),
            "seed_table": _seed_table(rows, config),
        }
    except ConfigError:
        raise
    except Exception as e:  # pylint: disable=broad-except
        raise ConfigError(
            f"{journal}: its rows cannot be reported ({_where(e)}); allowed: "
            f"rows as a specjax sweep writes them (restore the file, or move the "
            f"damaged rows away)",
            field=results.RESULTS_NAME,
            value=str(journal),
            allowed="rows as a specjax sweep writes them",
        ) from None
    return out


def _where(e: BaseException) -> str:
    import traceback  # pylint: disable=import-outside-toplevel

    frames = traceback.extract_tb(e.__traceback__)
    where = f" at {Path(frames[-1].filename).name}:{frames[-1].lineno}" if frames else ""
    return f"{type(e).__name__}: {_reason(e)}{where}"


def _inputs(workdir) -> tuple[Path, list, dict, dict, list]:
    """(workdir, rows of the grid, config, version, [(row, why)] of rows outside the grid)
    of a run, each checked; ConfigError otherwise."""
    import json  # pylint: disable=import-outside-toplevel
    import os  # pylint: disable=import-outside-toplevel
    import tempfile  # pylint: disable=import-outside-toplevel

    from specjax.runner import results  # pylint: disable=import-outside-toplevel

    check(workdir and str(workdir).strip(), "--workdir", workdir, "the directory of a run")
    path = user_path(workdir, "--workdir", "the directory of a run")
    try:
        check(path.is_dir(), "--workdir", workdir, "an existing run directory")
        journal = results.results_path(path)
        check(
            not journal.exists() or journal.is_file(),
            "--workdir",
            workdir,
            f"a run directory whose {results.RESULTS_NAME} is a file",
        )
        rows = results.read_all_results(path)
    except (OSError, ValueError) as e:
        if isinstance(e, ConfigError):
            raise
        raise ConfigError.invalid(
            "--workdir", workdir, f"a run directory with readable results ({_reason(e)})"
        ) from None
    check(
        rows,
        "--workdir",
        workdir,
        f"a run directory with results ({results.RESULTS_NAME} is missing or empty)",
    )
    docs = {}
    for name in ("config.json", "version.json"):
        file = path / name
        if not file.exists():
            continue
        try:
            doc = json.loads(file.read_text(encoding="utf-8"))
        except (OSError, ValueError, RecursionError) as e:  # unreadable, not UTF-8 / JSON
            raise ConfigError(
                f"{file}: unreadable ({_reason(e)}), allowed: a JSON object "
                f"(restore it, or remove it to build the report without it)",
                field=name,
                value=str(file),
                allowed="a JSON object",
            ) from None
        if not isinstance(doc, dict):
            raise ConfigError(
                f"{file}: got a JSON {type(doc).__name__}, allowed: a JSON "
                f"object (restore it, or remove it to build the report without "
                f"it)",
                field=name,
                value=str(file),
                allowed="a JSON object",
            )
        docs[name] = doc
    rows, outside = _split_by_grid(path, rows, docs.get("config.json"))
    for name, kind in (("report.md", "a file"), ("plots", "a directory")):
        target = path / name
        ok = not target.exists() or (target.is_file() if kind == "a file" else target.is_dir())
        check(ok, "--workdir", workdir, f"a run directory where {name} is {kind}")
    try:  # writable: a probe that leaves nothing behind
        os.rmdir(tempfile.mkdtemp(prefix=".specjax-probe-", dir=path))
    except OSError as e:
        raise ConfigError.invalid(
            "--workdir", workdir, f"a writable run directory ({_reason(e)})"
        ) from None
    return path, rows, docs.get("config.json", {}), docs.get("version.json", {}), outside


def _split_by_grid(path: Path, rows: list, config: dict | None) -> tuple[list, list]:
    """(rows of the cells of config.json's grid, [(row, why)] of the others). Without a
    grid in config.json every row counts."""
    from specjax.runner import grid as grid_lib  # pylint: disable=import-outside-toplevel

    config = _run_config(config)
    if not isinstance(config, dict) or config.get("grid") is None:
        return rows, []
    try:
        cells = grid_lib.expand_grid(config)
    except ConfigError as e:
        raise ConfigError(
            f"{path / 'config.json'}: {e} (restore it, or remove it to build the "
            f"report without it)",
            field="config.json",
            value=str(path),
            allowed=e.allowed,
        ) from None
    return grid_lib.split_rows(rows, cells)


def _run_config(config):
    """The run's config in config.json (older runs nested it under ``config``)."""
    if isinstance(config, dict) and isinstance(config.get("config"), dict):
        return config["config"]
    return config


def _reason(e: BaseException) -> str:
    if isinstance(e, OSError) and e.strerror:
        return e.strerror
    return " ".join(str(e).split())[:200] or type(e).__name__


def _seed_table(rows, config: dict) -> dict | None:
    """The seed reproduction's summary.json, seed_report.md and seed plot, built in memory
    (`seed_table.build`), when the run wrote them."""
    config = _run_config(config)
    if not isinstance(config, dict) or config.get("seed_table") is not True:
        return None
    import ml_collections  # pylint: disable=import-outside-toplevel

    from specjax.runner import seed_table  # pylint: disable=import-outside-toplevel

    return seed_table.build(ml_collections.ConfigDict(config), rows)


def entry() -> None:
    app.run(main, flags_parser=parse_flags)


if __name__ == "__main__":
    entry()
