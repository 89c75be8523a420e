"""The side-by-side page (`runner.seed_compare`, `specjax.report --compare_with`).

The fixture rows were written by the real code on deployment `synthetic` (regenerate with
the command in tests/fixtures/seed_compare/README); the "real" side is the same rows under a
config that names a real deployment, which only changes the labels and the primary
throughput figure (wall clock). No model runs here.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from absl import flags
from bad_inputs_harness import assert_one_line_error, report_mod

from specjax.errors import ConfigError
from specjax.runner import (
    results,
    seed_compare,
    seed_compare_claims,
    seed_compare_figures,
)

FIXTURE = Path(__file__).parent / "fixtures" / "seed_compare"


def _rows() -> list[dict]:
    return [json.loads(line) for line in (FIXTURE / "results.jsonl").read_text().splitlines()]


def _config(**over) -> dict:
    return dict(json.loads((FIXTURE / "config.json").read_text()), **over)


@pytest.fixture(autouse=True)
def _few_resamples(monkeypatch):
    """Intervals from 50 resamples: the tests check where figures come from, not widths."""
    from specjax.runner import seed_table  # pylint: disable=import-outside-toplevel

    monkeypatch.setattr(seed_table, "N_BOOT", 50)


REAL = {"deployment": "smollm2", "dtype": "bfloat16", "max_len": 96}


def _sides(zoo_rows=None, real_rows=None):
    z = seed_compare.side(zoo_rows or _rows(), _config(), "ZOO")
    r = seed_compare.side(real_rows or _rows(), _config(**REAL), "REAL")
    return seed_compare.pair(z, r)


def _page(zoo_rows=None, real_rows=None) -> str:
    s = _sides(zoo_rows, real_rows)
    return seed_compare.build(s["zoo"], s["real"])


def _line(page: str, start: str) -> str:
    hits = [ln for ln in page.splitlines() if ln.startswith(start)]
    assert hits, (start, page)
    return hits[0]


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip("|").split("|")]


def test_page_has_three_columns_settings_and_labels():
    page = _page()
    assert page.startswith("# The seed's four claims on both deployments")
    for claim in ("## Claim 1", "## Claim 2", "## Claim 3", "## Claim 4"):
        assert claim in page
    assert "| figure | zoo | real | seed | source |" in page
    dep = _cells(_line(page, "| deployment |"))
    assert dep[1:] == ["synthetic", "smollm2"]
    assert _cells(_line(page, "| dtype |"))[2] == "bfloat16"
    assert _cells(_line(page, "| max_len |"))[2] == "96"
    prim = _cells(_line(page, "| primary throughput figure |"))
    assert prim[1].startswith("cost model") and prim[2].startswith("wall clock")
    assert "not measured" in _cells(_line(page, "| regime of the rounds |"))[2]
    for key in ("plans", "steps per plan", "tokens per step (≤)", "seeds"):
        assert "not run" not in _line(page, f"| {key} |")


def test_figures_come_from_the_rows():
    rows = _rows()
    naive = [r for r in rows if r["policy"] == "naive"]
    fb = sum(sum(r["per_plan"]["fallbacks"]) for r in naive)
    st = sum(sum(r["per_plan"]["steps"]) for r in naive)
    cells = _cells(_line(_page(), "| consensus-fallback rate, naive |"))
    assert cells[1].startswith(f"{100 * fb / st:.0f}%")
    assert "rows policy=naive" in cells[4] and "per_plan.fallbacks" in cells[4]
    j = sum(sum(r["per_plan"]["multi_from_draft"]) for r in naive) / sum(
        sum(r["per_plan"]["multi_reached"]) for r in naive
    )
    cells = _cells(_line(_page(), "| naive joint acceptance on shared prefixes |"))
    assert cells[1].startswith(f"{j:.2f}") and cells[2].startswith(f"{j:.2f}")


@pytest.mark.parametrize(
    "figure,perturb",
    [
        ("| consensus-fallback rate, naive |", ("naive", "fallbacks")),
        ("| naive joint acceptance on shared prefixes |", ("naive", "multi_from_draft")),
        ("| primary throughput vs best single, all_on |", ("all_on", "seconds")),
        ("| auto: primary throughput vs best single |", ("auto", "seconds")),
    ],
)
def test_perturbing_a_row_moves_only_its_side(figure, perturb):
    policy, key = perturb
    before = _cells(_line(_page(), figure))
    rows = _rows()
    for r in rows:
        if r["policy"] == policy:
            x = r["per_plan"][key]
            r["per_plan"][key] = [v * 0.5 if key == "seconds" else 0 for v in x]
    after = _cells(_line(_page(real_rows=rows), figure))
    assert after[1] == before[1]  # the zoo column read other rows
    assert after[2] != before[2], (before, after)


def test_step_breakdown_comes_from_branch_records():
    rows = _rows()
    page = _page()
    section = page.split("### real", 1)[1]
    naive = _cells(_line(section, "| naive |"))
    n_steps = len(
        {
            (r.get("seed", 0), b["plan"], b["step"])
            for r in rows
            if r["policy"] == "naive"
            for b in r["branch_records"]
        }
    )
    assert naive[1] == str(n_steps)
    for r in rows:  # every naive branch now decides True: every step commits
        if r["policy"] == "naive":
            for b in r["branch_records"]:
                b["decision"] = True
    section = _page(real_rows=rows).split("### real", 1)[1]
    assert _cells(_line(section, "| naive |"))[2] == f"{n_steps} (100%)"
    assert _cells(_line(_page(real_rows=rows).split("### zoo", 1)[1], "| naive |")) == _cells(
        _line(page.split("### zoo", 1)[1], "| naive |")
    )


def test_prediction_parts_are_computed():
    rows = _rows()
    sides = _sides()
    checks = {c["part"]: c for c in seed_compare.prediction_checks(sides["real"])}
    assert set(checks) == {
        "naive falls back ~100%",
        "by construction: in a naive block s < i",
        "all-on falls back while the 0.35-nat ceiling isolates drafters",
        "only truncation commits",
    }
    fb = sides["real"]["summary"]["policies"]["naive"]["consensus_fallback_rate"]["value"]
    assert checks["naive falls back ~100%"]["agree"] == (fb >= seed_compare.NEAR_ALL)
    for r in rows:  # naive never falls back: the first part must now disagree
        if r["policy"] == "naive":
            r["per_plan"]["fallbacks"] = [0] * len(r["per_plan"]["fallbacks"])
    s = _sides(real_rows=rows)
    checks = {c["part"]: c for c in seed_compare.prediction_checks(s["real"])}
    assert checks["naive falls back ~100%"]["agree"] is False
    page = seed_compare.build(s["zoo"], s["real"])
    assert "**naive falls back ~100%**" in page and "prediction is wrong" in page
    assert "naive" in checks["only truncation commits"]["extra"]


def test_a_missing_deployment_or_policy_reads_not_run():
    real = seed_compare.side(_rows(), _config(**REAL), "REAL")
    page = seed_compare.build(None, real)
    assert _cells(_line(page, "| deployment |"))[1] == "not run"
    assert "### zoo\n\nnot run" in page
    page = seed_compare.build(seed_compare.side(_rows(), _config(), "Z"), None)
    assert "not run (no real deployment's rows)" in page
    assert seed_compare.build(None, None).count("not run") > 10
    assert seed_compare.side([], _config()) is None
    rows = [r for r in _rows() if r["policy"] != "auto"]
    page = _page(real_rows=rows)
    cells = _cells(_line(page, "| auto: primary throughput vs best single |"))
    assert cells[2] == "not run" and cells[1] != "not run"


def _report(capsys, **values) -> tuple[int, list[str], str]:
    """``python -m specjax.report --<flag>=<value> …`` in-process (the flags reset after):
    (exit code, stderr lines, stdout)."""
    flags.FLAGS.unparse_flags()
    for name, value in values.items():
        flags.FLAGS[name].value = value
    flags.FLAGS.mark_as_parsed()
    try:
        report_mod.main(["specjax"])
        code = 0
    except SystemExit as e:
        code = e.code
    finally:
        for name in values:
            flags.FLAGS[name].value = flags.FLAGS[name].default
        flags.FLAGS.unparse_flags()
    out = capsys.readouterr()
    return code, out.err.splitlines(), out.out


def run_report(capsys, workdir: str, compare_with: str) -> tuple[int, list[str], str]:
    """``python -m specjax.report --workdir=W --compare_with=C`` in-process."""
    return _report(capsys, workdir=workdir, compare_with=compare_with)


def _run(tmp_path: Path, name: str, **over) -> Path:
    run = tmp_path / name
    run.mkdir()
    (run / "config.json").write_text(json.dumps(_config(**over)))
    for r in _rows():
        results.append_result(run / results.RESULTS_NAME, r)
    return run


def test_report_compare_with_writes_one_seed_report(tmp_path, capsys):
    zoo = _run(tmp_path, "zoo")
    real = _run(tmp_path, "real", **REAL)
    zoo_before = sorted(p.name for p in zoo.iterdir())
    code, err, _ = run_report(capsys, str(real), str(zoo))
    assert code == 0, err
    text = (real / "seed_report.md").read_text()
    assert text.startswith("# The seed's four claims on both deployments")
    assert "## This run's own table: The seed's table, reproduced" in text
    assert sorted(p.name for p in zoo.iterdir()) == zoo_before  # the other run is only read


@pytest.mark.parametrize("which", ["missing", "same_kind", "not_plans"])
def test_report_compare_with_bad_input_is_one_line(tmp_path, capsys, which):
    real = _run(tmp_path, "real", **REAL)
    if which == "missing":
        other = tmp_path / "nope"
    elif which == "same_kind":
        other = _run(tmp_path, "real2", **REAL)
    else:
        other = tmp_path / "toy"
        other.mkdir()
        results.append_result(other / results.RESULTS_NAME, {"cell_id": "x", "value": 1})
    before = (real / "results.jsonl").read_text()
    code, err, out = run_report(capsys, str(real), str(other))
    assert_one_line_error(code, err, out, "--compare_with")
    assert not (real / "seed_report.md").exists()
    assert (real / "results.jsonl").read_text() == before


def test_page_is_deterministic():
    rows = _rows()
    assert _page(copy.deepcopy(rows)) == _page(copy.deepcopy(rows))


def _regime(ratio: float) -> dict:
    """A row's measured regime: T_score(γ+1) / T_step = ``ratio`` at 16 padded rows."""
    return {"rows": 16, "capacity": 96, "gamma": 3, "t_step": 0.02, "t_score": 0.02 * ratio}


@pytest.mark.parametrize("ratio, primary", [(1.1, "wall"), (3.0, "cost")])
def test_real_primary_figure_follows_the_measured_regime(ratio, primary):
    """Wall clock is the real deployment's primary figure only where its rounds were
    measured memory-bound (T_score(γ+1) / T_step ≤ 1.5); compute-bound rounds make the
    cost model the result and the wall clock its check (SPEC §10)."""
    rows = copy.deepcopy(_rows())
    for r in rows:
        r["regime"] = _regime(ratio)
    s = _sides(real_rows=rows)["real"]
    assert s["primary"] == primary
    assert seed_compare.regime(s).startswith("memory-bound" if ratio < 1.5 else "compute-bound")
    assert "at 16 padded rows" in seed_compare.regime(s)
    # The run's own table (seed_report) names the same primary figure, for the same reason.
    own = s["markdown"]
    if primary == "wall":
        assert "Primary throughput figure: wall clock on this machine (the rounds were " in own
    else:
        assert "Primary throughput figure: the cost model (this deployment's c_i): the " in own
        assert f"compute-bound on this machine (T_score(γ+1) / T_step = {ratio:.2f}" in own


def _with_single_cell(rows, slowdown: float) -> list[dict]:
    """The fixture's rows plus a `single:d0` cell whose per-plan counts are d0's baseline,
    its wall clock ``slowdown`` times the baseline's: the same program measured again on a
    machine whose load changed by that factor."""
    rows = copy.deepcopy(rows)
    r = copy.deepcopy(rows[0])
    base = r["baselines"]["single"]["d0"]
    r["per_plan"]["tokens"] = list(base["tokens"])
    r["per_plan"]["seconds"] = [slowdown * x for x in base["seconds"]]
    r["policy"] = r["cell"]["policy"] = "single:d0"
    r["cell_id"] = f"{r['cell_id']}_single_d0"
    rows.append(r)
    return rows


@pytest.mark.parametrize("slowdown, primary", [(1.0, "wall"), (1.1, "wall"), (1.5, "cost")])
def test_wall_clock_that_drifted_over_the_run_is_not_primary(slowdown, primary):
    """A drafter alone measured twice in one run (its baseline with the first cell, its own
    `single:` cell later) must run at the same rate; where the load moved it by more than
    WALL_DRIFT_TOLERANCE, wall clock is demoted to a check and the page says why."""
    rows = _with_single_cell(_rows(), slowdown)
    for r in rows:
        r["regime"] = {"rows": 16, "capacity": 96, "gamma": 3, "t_step": 0.02, "t_score": 0.02}
    s = _sides(real_rows=rows)["real"]
    drift = s["summary"]["settings"]["wall_drift"]
    assert drift == {"d0": pytest.approx(1 / slowdown, rel=1e-9)}
    assert s["primary"] == primary
    own = s["markdown"]
    if primary == "cost":
        assert "Wall clock did not hold steady over this run" in own
        assert f"`single:d0` {1 / slowdown:.2f}×" in own
    else:
        assert "Primary throughput figure: wall clock on this machine" in own
    # The wall-clock denominator is the single-drafter cell, timed like the others (not the
    # baseline timed with the first cell).
    assert s["summary"]["best_single_wall"] == {"drafter": "d0", "gamma": 2, "from": "cells"}
    cell = next(r for r in rows if r["policy"] == "single:d0")["per_plan"]
    naive = [r["per_plan"] for r in rows if r["policy"] == "naive"]
    rate = sum(sum(p["tokens"]) for p in naive) / sum(sum(p["seconds"]) for p in naive)
    want = rate / (sum(cell["tokens"]) / sum(cell["seconds"]))
    got = s["summary"]["policies"]["naive"]["wallclock_ratio_vs_single"]["value"]
    assert got == pytest.approx(want, rel=1e-9)
    line = _line(seed_compare.build(_sides()["zoo"], s), "| wall clock steady over the run")
    assert _cells(line)[2].startswith("yes" if primary == "wall" else "no: the cost model")


# ----------------------------------------------------------------------------- three deployments

GEMMA = {"deployment": "gemma3", "dtype": "float32", "max_len": 512}


def _with_ceiling_rows(rows=None) -> list[dict]:
    """The fixture's rows plus all_on_minus_kl_ceiling (naive_plus_truncate_and_attribute's
    rows: one set of every drafter) and naive_plus_kl_ceiling (all_on's: each drafter alone),
    so both of the KL ceiling's comparisons have rows."""
    rows = copy.deepcopy(rows or _rows())
    by = {r["policy"]: r for r in rows}
    for name, like in (
        ("all_on_minus_kl_ceiling", "naive_plus_truncate_and_attribute"),
        ("naive_plus_kl_ceiling", "all_on"),
    ):
        r = copy.deepcopy(by[like])
        r["policy"] = r["cell"]["policy"] = name
        r["cell_id"] = f"{r['cell_id']}_{name}"
        rows.append(r)
    return rows


def _three(zoo_rows=None, real_rows=None, gemma_rows=None) -> dict:
    z = seed_compare.side(zoo_rows or _rows(), _config(), "ZOO")
    r = seed_compare.side(real_rows or _rows(), _config(**REAL), "REAL")
    g = seed_compare.side(gemma_rows or _with_ceiling_rows(), _config(**GEMMA), "GEMMA")
    return seed_compare.arrange([r, z, g])  # --workdir's run first, then --compare_with's


def _page3(**kw) -> str:
    return seed_compare.build_sides(_three(**kw))


VERDICTS = (
    "| verdict (naive joint's interval below every α) |",
    "| verdict |",
    "| verdict: joint rises |",
    "| verdict: fallback drops |",
    "| verdict: throughput > 1× and above naive |",
    "| verdict: auto beats the best single drafter |",
)


def test_three_deployments_a_column_each_zoo_first_then_the_order_given():
    sides = _three()
    assert list(sides) == ["zoo", "smollm2", "gemma3"]
    page = seed_compare.build_sides(sides)
    assert page.startswith("# The seed's four claims on 3 deployments")
    assert "| figure | zoo | smollm2 | gemma3 | seed | source |" in page
    assert "| setting | zoo | smollm2 | gemma3 |" in page
    assert _cells(_line(page, "| deployment |"))[1:] == ["synthetic", "smollm2", "gemma3"]
    assert _cells(_line(page, "| max_len |"))[2:] == ["96", "512"]
    for claim in ("## Claim 1", "## Claim 2", "## Claim 3", "## Claim 4"):
        section = page.split(claim, 1)[1].split("\n## ", 1)[0]
        assert "| figure | zoo | smollm2 | gemma3 | seed | source |" in section
    for v in VERDICTS:  # every claim's verdict on every deployment, beside the seed's
        cells = _cells(_line(page, v))
        assert len(cells) == 6 and all(c and c != "not run" for c in cells[1:4]), cells
        assert cells[4].startswith("claimed") or cells[4].startswith("1.7×")
    assert _cells(_line(page, VERDICTS[0]))[1:4] == [
        seed_compare_figures._verdict_collapse(s) for s in sides.values()
    ]
    assert _cells(_line(page, VERDICTS[-1]))[1:4] == [
        seed_compare_claims._auto_verdict(s) for s in sides.values()
    ]
    for k in ("zoo", "smollm2", "gemma3"):  # provenance and step decisions per deployment
        assert f"- {k}: `" in page
        assert f"### {k} (" in page.split("## The step decisions", 1)[1]


def test_three_deployments_each_column_reads_its_own_rows():
    figure = "| auto: primary throughput vs best single |"
    before = _cells(_line(_page3(), figure))
    rows = _with_ceiling_rows()
    for r in rows:
        if r["policy"] == "auto":
            r["per_plan"]["seconds"] = [v * 0.5 for v in r["per_plan"]["seconds"]]
    after = _cells(_line(_page3(gemma_rows=rows), figure))
    assert after[1:3] == before[1:3] and after[3] != before[3], (before, after)
    # the gemma3 run without auto: its column reads "not run", the others do not
    rows = [r for r in _with_ceiling_rows() if r["policy"] != "auto"]
    cells = _cells(_line(_page3(gemma_rows=rows), figure))
    assert cells[3] == "not run" and "not run" not in cells[1:3]
    assert _cells(_line(_page3(gemma_rows=rows), VERDICTS[-1]))[3] == "not run (no auto rows)"


def test_three_deployments_prediction_on_every_real_deployment():
    page = _page3()
    assert "## The held-out prediction, checked on each real deployment" in page
    section = page.split("## The held-out prediction", 1)[1].split("\n## ", 1)[0]
    assert "### smollm2" in section and "### gemma3" in section and "### zoo" not in section
    for k in ("smollm2", "gemma3"):
        part = section.split(f"### {k}", 1)[1].split("\n### ", 1)[0]
        assert _line(part, "| naive falls back ~100% |")
        assert _line(part, "| only truncation commits |")
    # gemma3's run has all_on_minus_kl_ceiling: it is among the policies predicted to commit
    gem = section.split("### gemma3", 1)[1]
    assert "all_on_minus_kl_ceiling" in _cells(_line(gem, "| only truncation commits |"))[1]
    assert "all_on_minus_kl_ceiling" not in section.split("### gemma3", 1)[0]


def test_two_real_deployments_without_a_zoo_run():
    r = seed_compare.side(_rows(), _config(**REAL), "REAL")
    g = seed_compare.side(_rows(), _config(**GEMMA), "GEMMA")
    sides = seed_compare.arrange([g, r])
    assert list(sides) == ["zoo", "gemma3", "smollm2"] and sides["zoo"] is None
    page = seed_compare.build_sides(sides)
    assert _cells(_line(page, "| deployment |"))[1:] == ["not run", "gemma3", "smollm2"]
    assert _cells(_line(page, VERDICTS[0]))[1] == "not run"


def test_the_one_compare_path_is_the_two_column_page():
    z = seed_compare.side(_rows(), _config(), "ZOO")
    r = seed_compare.side(_rows(), _config(**REAL), "REAL")
    for given in ([r, z], [z, r]):
        sides = seed_compare.arrange(given)
        assert list(sides) == ["zoo", "real"]
        assert seed_compare.build_sides(sides) == seed_compare.build(z, r)
    assert "What real cross-family heterogeneity changes" not in seed_compare.build(z, r)


@pytest.mark.parametrize("dup", ["gemma3", "zoo"])
def test_two_runs_of_one_deployment_kind_are_an_error(dup):
    z = seed_compare.side(_rows(), _config(), "ZOO")
    r = seed_compare.side(_rows(), _config(**REAL), "REAL")
    g = seed_compare.side(_rows(), _config(**GEMMA), "GEMMA")
    again = seed_compare.side(_rows(), _config(**(GEMMA if dup == "gemma3" else {})), "AGAIN")
    with pytest.raises(ConfigError) as e:
        seed_compare.arrange([r, z, g, again])
    msg = str(e.value)
    assert msg.startswith("--compare_with: got 'AGAIN'") and "\n" not in msg
    assert ("gemma3" if dup == "gemma3" else "zoo-kind") in msg


# ----------------------------------------------------------------------------- CLI, three runs


def test_report_compare_with_three_runs(tmp_path, capsys):
    zoo = _run(tmp_path, "zoo")
    real = _run(tmp_path, "real", **REAL)
    gemma = _run(tmp_path, "gemma", **GEMMA)
    before = {p: sorted(x.name for x in p.iterdir()) for p in (zoo, real)}
    code, err, _ = run_report(capsys, str(gemma), f"{zoo},{real}")
    assert code == 0, err
    text = (gemma / "seed_report.md").read_text()
    assert text.startswith("# The seed's four claims on 3 deployments")
    # zoo first, then the real ones in the order given: --workdir's, then --compare_with's
    assert "| figure | zoo | gemma3 | smollm2 | seed | source |" in text
    assert "## What real cross-family heterogeneity changes" in text
    assert "## This run's own table: The seed's table, reproduced" in text
    assert {p: sorted(x.name for x in p.iterdir()) for p in (zoo, real)} == before
    (gemma / "seed_report.md").unlink()
    code, err, _ = run_report(capsys, str(gemma), [str(real), str(zoo)])  # the flag repeated
    assert code == 0, err
    text2 = (gemma / "seed_report.md").read_text()
    assert "| figure | zoo | gemma3 | smollm2 | seed | source |" in text2


@pytest.mark.parametrize("which", ["same_kind", "empty_entry", "missing_one"])
def test_report_compare_with_three_runs_bad_input_is_one_line(tmp_path, capsys, which):
    zoo = _run(tmp_path, "zoo")
    real = _run(tmp_path, "real", **REAL)
    gemma = _run(tmp_path, "gemma", **GEMMA)
    other = {
        "same_kind": f"{zoo},{_run(tmp_path, 'gemma2', **GEMMA)}",
        "empty_entry": f"{zoo},,{real}",
        "missing_one": f"{zoo},{tmp_path / 'nope'}",
    }[which]
    code, err, out = run_report(capsys, str(gemma), other)
    assert_one_line_error(code, err, out, "--compare_with")
    assert not (gemma / "seed_report.md").exists()


def _report_page(capsys, workdir, page, append: bool) -> tuple[int, list[str], str]:
    """``python -m specjax.report --workdir=W --docs_page=P [--docs_append]`` in-process."""
    return _report(capsys, workdir=str(workdir), docs_page=str(page), docs_append=append)


def test_docs_append_adds_one_section_per_run_and_replaces_it_on_a_rerun(tmp_path, capsys):
    """One page for two runs of one question (the routers on two workloads): the second
    run's table is a section of its own, headed by its workdir; appending again replaces
    that section; appending to a page that does not exist is one line and writes nothing."""
    first, second = _run(tmp_path, "pure", **REAL), _run(tmp_path, "mixed", **REAL)
    page = tmp_path / "docs" / "routing.md"
    page.parent.mkdir()
    code, err, _ = _report_page(capsys, tmp_path / "nope", page, True)
    assert_one_line_error(code, err, "", "--docs_page")
    assert not page.exists()
    assert _report_page(capsys, first, page, False)[0] == 0
    own = page.read_text()
    assert _report_page(capsys, second, page, True)[0] == 0
    once = page.read_text()
    head = f"## Also: the run in `{second}`"
    assert once.startswith(own.rstrip()) and once.count(head) == 1
    assert "### Every policy" in once.split(head, 1)[1]  # its sections one level down
    assert _report_page(capsys, second, page, True)[0] == 0
    assert page.read_text() == once
