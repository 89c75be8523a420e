"""The Colab notebook `colab/reproduce_seed.ipynb`: stored clean, and runs headless end to end.

The run test executes every cell with `nbclient` in a kernel of this interpreter (a
kernelspec installed into a temporary prefix, so no other Python on the machine can be
picked up), as CI would: ``SPECJAX_NOTEBOOK_SMOKE=1`` (two policies, one plan per domain,
one step of ≤ 8 tokens), ``JAX_PLATFORMS=cpu``, the run's workdir in ``tmp_path``. Any cell
error fails the test. It needs the shipped zoo (``zoo/manifest.json``). To check the
mechanics without it, pass extra config overrides through to the notebook, e.g.::

    SPECJAX_NOTEBOOK_OVERRIDES="deployment=synthetic,grid.pairing=[(d0,d1,d2,d3)],bucket=16" \
        pytest tests/test_notebook.py
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
kernelspec = pytest.importorskip("ipykernel.kernelspec")

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "colab" / "reproduce_seed.ipynb"
TABLE_TITLE = "The seed's table, reproduced"  # seed_report.md's heading
CELL_TIMEOUT_S = 1800


def _read():
    return nbformat.read(NOTEBOOK, as_version=4)


def test_notebook_is_stored_clean():
    nb = _read()
    nbformat.validate(nb)
    assert nb.nbformat == 4
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code, "no code cells"
    for i, cell in enumerate(code):
        assert cell.outputs == [] and cell.execution_count is None, (
            f"code cell {i} has stored outputs; clear them before committing"
        )
    assert "SPECJAX_NOTEBOOK_SMOKE" in code[0].source, "the parameter cell must come first"
    # No hard-coded repository address (there is no public one): the address is the
    # parameter REPO_URL, and an uploaded wheel or checkout archive works without it.
    text = "\n".join(c.source for c in nb.cells)
    assert "github.com/specjax/specjax" not in text
    assert "REPO_URL" in code[0].source and "SOURCE" in code[0].source


def _outputs(nb, output_type=None):
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if output_type is None or out.output_type == output_type:
                yield out


@pytest.mark.slow  # ~90 s: the whole notebook on the zoo; `make test-all`
def test_notebook_runs_headless(tmp_path, monkeypatch):
    overrides = os.environ.get("SPECJAX_NOTEBOOK_OVERRIDES", "")
    if (
        not (ROOT / "specjax" / "zoo" / "manifest.json").is_file()
        and "deployment=synthetic" not in overrides
    ):
        pytest.fail(
            "zoo/manifest.json is missing: the notebook reproduces the seed on the "
            "shipped zoo (build it with `make train-zoo`)"
        )

    # A kernelspec for this interpreter, found first through JUPYTER_PATH.
    prefix = tmp_path / "jupyter"
    kernelspec.install(kernel_name="python3", prefix=str(prefix))
    monkeypatch.setenv("JUPYTER_PATH", str(prefix / "share" / "jupyter"))
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "runtime"))
    monkeypatch.setenv("IPYTHONDIR", str(tmp_path / "ipython"))  # no user startup files
    # What the kernel inherits: the notebook's own switches, CPU, and one device as a
    # user's kernel would have (conftest's 8 fake devices are for the sharding tests).
    workdir = tmp_path / "run"
    monkeypatch.setenv("SPECJAX_NOTEBOOK_SMOKE", "1")
    monkeypatch.setenv("SPECJAX_NOTEBOOK_WORKDIR", str(workdir))
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    xla = " ".join(
        f
        for f in os.environ.get("XLA_FLAGS", "").split()
        if not f.startswith("--xla_force_host_platform_device_count")
    )
    monkeypatch.setenv("XLA_FLAGS", xla)

    nb = _read()
    client = nbclient.NotebookClient(
        nb,
        kernel_name="python3",
        timeout=CELL_TIMEOUT_S,
        allow_errors=False,
        # The kernel starts beside the notebook, as in Jupyter; the notebook finds the root.
        resources={"metadata": {"path": str(NOTEBOOK.parent)}},
    )
    client.execute()  # raises CellExecutionError on the first failing cell

    assert not list(_outputs(nb, "error"))
    markdown = [
        o.data["text/markdown"]
        for o in _outputs(nb, "display_data")
        if "text/markdown" in o.get("data", {})
    ]
    assert any(TABLE_TITLE in m for m in markdown), "the seed table was not displayed"
    images = [o for o in _outputs(nb, "display_data") if "image/png" in o.get("data", {})]
    assert images, "no plot was displayed"

    # The run itself, in the workdir the test gave it.
    assert TABLE_TITLE in (workdir / "seed_report.md").read_text()
    summary = json.loads((workdir / "summary.json").read_text())
    assert {"naive", "all_on"} <= set(summary["policies"])
    rows = [
        json.loads(line)
        for line in (workdir / "results.jsonl").read_text().splitlines()
        if line.strip()
    ]
    assert sorted(r["policy"] for r in rows) == ["all_on", "naive"]
    assert (workdir / "plots" / "seed_policies.png").is_file()
    assert len(images) == len(list((workdir / "plots").glob("*.png")))
