"""A sweep's results page (`python -m specjax.report --docs_page`), the sharing-sets table
and the KL-ceiling and γ plots, from tiny runs and hand-made rows (no model is run)."""

from __future__ import annotations

import json

import pytest
from test_cli import REPO, TOY, specjax

from specjax.runner import plots, report


@pytest.mark.slow  # CI time (make test ≤ 15 min on a cold clone); `make test-all` runs it
def test_sweep_page_is_written_from_the_runs_rows_and_names_its_commands(tmp_path):
    workdir, docs = tmp_path / "run", tmp_path / "docs"
    run = specjax(f"--config={TOY}:runlocal", f"--workdir={workdir}")
    assert run.returncode == 0, run.stderr
    stale = docs / "sweep_toy" / "gone.png"
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b"stale")
    page = docs / "sweep_toy.md"
    out = specjax(f"--workdir={workdir}", f"--docs_page={page}", module="specjax.report")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == str(page)
    text = page.read_text()
    lines = text.splitlines()
    assert lines[0] == "# toy.py: toy: 8 cells"
    assert lines[2].startswith(
        f"Written by `python -m specjax.report --workdir={workdir} --docs_page={page}` at commit"
    )
    assert lines[3].startswith("Machine: ") and "load average" in lines[3]
    assert f"run by `python -m specjax.main --config={TOY}:runlocal --workdir={workdir}`" in text
    # The report's tables, every cell once, from the run's rows.
    rows = [json.loads(x) for x in (workdir / "results.jsonl").read_text().splitlines()]
    for r in rows:
        assert f"| `{r['cell_id']}` |" in text
    assert text.count("\n| `") == len(rows) == 8
    # Every plot of the report, copied beside the page and linked; nothing else there.
    drawn = sorted(p.name for p in (workdir / "plots").iterdir())
    assert drawn and sorted(p.name for p in (docs / "sweep_toy").iterdir()) == drawn
    for name in drawn:
        assert f"](sweep_toy/{name})" in text
        assert (docs / "sweep_toy" / name).read_bytes() == (workdir / "plots" / name).read_bytes()
    assert "](plots/" not in text


def test_bad_docs_page_is_one_line_and_writes_nothing(tmp_path):
    workdir = tmp_path / "run"
    assert specjax(f"--config={TOY}:runlocal", f"--workdir={workdir}").returncode == 0
    before = (workdir / "report.md").read_text()
    page = tmp_path / "docs" / "page.txt"
    out = specjax(f"--workdir={workdir}", f"--docs_page={page}", module="specjax.report")
    assert out.returncode == 2
    assert out.stderr.splitlines() == [
        f"specjax: error: --docs_page: got '{page}', allowed: a path ending in .md"
    ]
    assert not page.parent.exists() and (workdir / "report.md").read_text() == before


def _branches(*sets):
    """branch_records of one plan step per set list: each branch's drafters."""
    out = []
    for step, branches in enumerate(sets):
        for b, drafters in enumerate(branches):
            out.append({"step": step, "plan": 0, "branch": b, "drafters": list(drafters)})
    return out


def _kl_rows():
    def row(policy, ceiling, sets, joint, fallback):
        return {
            "cell_id": policy,
            "cell": {"policy": policy},
            "policy": policy,
            "pairing": ["code", "prose", "reasoning"],
            "kl_ceiling": ceiling,
            "kl_max": 1.2,
            "joint_acceptance": joint,
            "consensus_fallback_rate": fallback,
            "throughput_ratio_vs_single": 1.0 + joint,
            "branch_records": _branches(*sets),
        }

    triple, split = [("code", "prose", "reasoning")], [("code", "prose"), ("reasoning",)]
    singles = [("code",), ("prose",), ("reasoning",)]
    return [
        row("naive_plus_kl_ceiling_kl0.1", 0.1, [singles, singles], 0.0, 0.9),
        row("naive_plus_kl_ceiling_kl1.0", 1.0, [split, singles], 0.4, 0.5),
        row("naive_plus_kl_ceiling_kl3.0", 3.0, [triple, triple], 0.2, 0.8),
        row("naive", None, [triple, triple], 0.2, 0.8),
    ]


def test_sharing_sets_read_from_branch_records():
    rows = _kl_rows()
    assert plots.sharing_sets(rows[1]) == {
        "code+prose": 0.5,
        "code": 0.5,
        "prose": 0.5,
        "reasoning": 1.0,
    }
    assert plots.sharing_sets(rows[2]) == {"code+prose+reasoning": 1.0}
    assert plots.sharing_sets({"policy": "auto"}) == {}
    assert [plots.kl_family(r) for r in rows] == ["naive"] * 4
    assert plots.kl_family({"policy": "all_on_kl0.5"}) == "all_on_minus_kl_ceiling"


def test_kl_ceiling_table_and_plot(tmp_path):
    rows = _kl_rows()
    text, pngs = report.render_report(rows, {}, {})
    section = text.split("## Sharing sets, per policy", 1)[1].split("## Every cell", 1)[0]
    assert "| naive_plus_kl_ceiling_kl1.0 | 1 | 1 | 1.200 | code+prose 50%, " in section
    assert "| naive_plus_kl_ceiling_kl3.0 | 3 | 1 | 1.200 | code+prose+reasoning 100% | 3 |" in (
        section
    )
    assert "| naive | off | 1 |" in section
    assert "kl_ceiling" in pngs and "(plots/kl_ceiling.png)" in text
    fig = plots.figure_kl_ceiling(rows)
    largest = fig.axes[0]
    assert largest.get_ylabel() == "drafters in the largest sharing set"
    xs, ys = largest.get_lines()[0].get_data()
    assert list(xs) == [0.1, 1.0, 3.0] and list(ys) == [1, 2, 3]
    # One ceiling only (and the ceiling off): no KL-ceiling plot, no sharing-sets table.
    one = [r for r in rows if r["kl_ceiling"] in (None, 1.0)]
    assert plots.figure_kl_ceiling(one[:1]) is None
    assert "Sharing sets" not in report.render_report(one[:1], {}, {})[0]


def test_zoo_pairings_may_name_prompt_lookup():
    """The pairing sweep's zoo grid (prompt lookup beside each drafter) validates; an
    unknown name is still refused, naming the field and what is allowed."""
    import importlib.util

    import pytest

    from specjax.errors import ConfigError
    from specjax.runner import plans_validation

    spec = importlib.util.spec_from_file_location(
        "pairings", REPO / "configs" / "sweep_tokenizer_pairings.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = module.get_config("runlocal")
    assert ("code", "lookup") in [tuple(p) for p in config.grid.pairing]
    plans_validation.validate(config)
    with pytest.raises(ConfigError, match=r"grid.pairing: got 'nope', allowed: .*'lookup'"):
        plans_validation.validate(module.get_config("runlocal,grid.pairing=[[code,nope]]"))
