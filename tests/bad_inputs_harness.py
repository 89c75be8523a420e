"""The bad-input tests' harness (tests/test_bad_inputs.py, test_bad_zoos.py,
test_bad_workdirs.py, and the tests that reuse it): run `specjax.main` / `specjax.report`
in-process, snapshot a folder, and check an error is one line ``specjax: error: ...``.
"""

from __future__ import annotations

import os
from pathlib import Path

from absl import flags

from specjax import main as main_mod  # defines --config, --workdir, --jax_distributed
from specjax import report as report_mod
from specjax.runner import cli

REPO = Path(__file__).resolve().parent.parent
SEED = "configs/seed_reproduction.py:runlocal"
TOY = "tests/configs/toy.py:runlocal"


# ----------------------------------------------------------------------------------------
# Harness
# ----------------------------------------------------------------------------------------


def _snapshot(root: Path) -> dict[str, bytes | None]:
    """Every path under `root` with its bytes (None for a directory)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for d in dirnames:
            out[os.path.relpath(os.path.join(dirpath, d), root)] = None
        for f in filenames:
            p = os.path.join(dirpath, f)
            out[os.path.relpath(p, root)] = (
                os.readlink(p).encode() if os.path.islink(p) else Path(p).read_bytes()
            )
    return out


def run_main(capsys, *args: str) -> tuple[int, list[str], str]:
    """``python -m specjax.main ARGS`` in-process: (exit status, stderr lines, stdout)."""
    flags.FLAGS.unparse_flags()
    try:
        argv = cli.parse_flags(["specjax", *args])
        main_mod.main(argv)
        code = 0
    except SystemExit as e:
        code = e.code
    finally:
        flags.FLAGS.unparse_flags()
    out = capsys.readouterr()
    return code, out.err.splitlines(), out.out


def run_report(capsys, workdir: str | None, *extra: str) -> tuple[int, list[str], str]:
    """``python -m specjax.report --workdir=W`` in-process."""
    flags.FLAGS.unparse_flags()
    flags.FLAGS["workdir"].value = workdir  # no parse: --config is required by main
    flags.FLAGS.mark_as_parsed()
    try:
        report_mod.main(["specjax", *extra])
        code = 0
    except SystemExit as e:
        code = e.code
    finally:
        flags.FLAGS.unparse_flags()
    out = capsys.readouterr()
    return code, out.err.splitlines(), out.out


def assert_one_line_error(code, lines, stdout, *needles):
    assert code == 2, (code, lines)
    assert len(lines) == 1, lines
    assert lines[0].startswith("specjax: error: "), lines
    assert "Traceback" not in lines[0] and stdout == "", (lines, stdout)
    for n in needles:
        assert n in lines[0], (n, lines[0])
