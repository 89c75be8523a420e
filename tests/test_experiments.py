"""The shipped configs and the `plans` experiment, as a user runs them."""

from __future__ import annotations

import json

import pytest
from test_cli import specjax

from specjax.runner import seed_reprice

CONFIGS = [
    "configs/seed_reproduction.py",
    "configs/ablation_invariants.py",
    "configs/sweep_gamma_temperature.py",
    "configs/sweep_tokenizer_pairings.py",
    "configs/sweep_kl_ceiling.py",
    "configs/seed_reproduction_real.py",
]


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize(
    "override,field",
    [
        ("grid.gamma=[0]", "grid.gamma"),
        ("grid.verifier_temperature=[-1.0]", "grid.verifier_temperature"),
        ("grid.pairing=[[code,nope]]", "grid.pairing"),
        ("grid.drafter_gamma=[[0,2,2]]", "grid.drafter_gamma"),
        ("grid.policy=[wholesale]", "policy"),
        ("no_such_field=3", "no_such_field"),
        ("plans_per_domain=0", "plans_per_domain"),
        ("auto_gammas=[0]", "auto_gammas"),
        ("auto_score=oracle", "auto_score"),
        ("grid.policy=[set:code+nope]", "grid.policy"),
        ("machine_prices=3", "machine_prices"),
    ],
)
def test_bad_override_is_one_line_and_writes_nothing(tmp_path, config, override, field):
    if config != CONFIGS[0] and override.startswith(("grid.policy", "plans", "auto", "machine")):
        pytest.skip("one config suffices for this field")
    workdir = tmp_path / "run"
    proc = specjax(f"--config={config}:runlocal,{override}", f"--workdir={workdir}")
    assert proc.returncode != 0
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("specjax: error:"), proc.stderr
    assert field in err[0]
    assert "Traceback" not in proc.stderr
    assert not workdir.exists()


def test_empty_grid_and_file_workdir(tmp_path):
    afile = tmp_path / "file"
    afile.write_text("x")
    for args in (
        [f"--config={CONFIGS[0]}:runlocal,grid={{}}", f"--workdir={tmp_path / 'w'}"],
        [f"--config={CONFIGS[0]}:runlocal", f"--workdir={afile}"],
    ):
        proc = specjax(*args)
        assert proc.returncode != 0
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not (tmp_path / "w").exists() and afile.read_text() == "x"


@pytest.mark.slow  # ~70 s: the whole experiment through the CLI; `make test-all`
def test_plans_experiment_end_to_end_on_synthetic(tmp_path):
    """The experiment, the seed table and the report on the exact synthetic deployment."""
    workdir = tmp_path / "seed"
    arg = (
        "runlocal,deployment=synthetic,plans_per_domain=1,plan_steps=2,max_step_tokens=4,"
        "bucket=16,grid.policy=[naive,all_on,auto],grid.pairing=[[d0,d1,d2,d3]],"
        "grid.gamma=[2],grid.seed=[0,1],grid.verifier_temperature=[0.0],grid.rule=[default]"
    )
    proc = specjax(f"--config={CONFIGS[0]}:{arg}", f"--workdir={workdir}", timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads((workdir / "summary.json").read_text())
    for name in ("naive", "all_on", "auto"):
        m = summary["policies"][name]
        fb = m["consensus_fallback_rate"]
        assert 0 <= fb["value"] <= 1 and fb["ci"][0] <= fb["value"] <= fb["ci"][1]
        assert m["tv_distance"] == 0.0  # greedy: every policy commits the greedy plan
        assert m["gamma"] == 2
    naive = summary["policies"]["naive"]
    assert 0 <= naive["joint_acceptance"]["value"] <= 1  # ≥ 2 drafters share the prefix
    assert summary["policies"]["auto"]["consensus_fallback_rate"]["value"] == 0
    assert summary["settings"]["seeds"] == [0, 1]
    assert set(summary["claims"]) >= {"collapse", "fallback_drop", "throughput"}
    assert (workdir / "seed_report.md").read_text().startswith("# The seed's table")
    assert (workdir / "plots" / "seed_policies.png").stat().st_size > 10_000
    assert (workdir / "report.md").exists()
    rows = [json.loads(l) for l in (workdir / "results.jsonl").read_text().splitlines()]
    assert {r["policy"] for r in rows} == {"naive", "all_on", "auto"}
    assert all(r["branch_records"] for r in rows if r["policy"] != "auto")
    # Every row records the KL ceiling and the thresholds its cell ran with.
    assert {r["policy"]: r["kl_ceiling"] for r in rows} == {
        "naive": None,
        "all_on": 0.35,
        "auto": None,
    }
    assert all(
        r["thresholds"]
        == {"truncation_overhead_ratio": 0.15, "acceptance_floor": 0.45, "depth_ceiling": 2.5}
        for r in rows
    )
    # The run's own per-plan counts, priced afresh at its own c_i, give its own column.
    costs = rows[0]["drafter_costs"]
    cons = json.loads((workdir / "config.json").read_text())["consensus_cost"]
    again = seed_reprice.reprice(rows, costs, consensus_cost=cons)
    for name in ("naive", "all_on", "auto"):
        want = summary["policies"][name]["throughput_ratio_vs_single"]["value"]
        assert again[name]["value"] == pytest.approx(want, rel=1e-9), name


@pytest.mark.slow  # ~90 s: the routers through the CLI; `make test-all`
def test_every_router_side_by_side_on_synthetic(tmp_path):
    """`auto` scored teacher forced and by its own chains, a fixed drafter set and a drafter
    alone in one run (issue 52, item 4): each commits the verifier's greedy plan, the
    teacher-forced router never explores, and the seed table reports each by its name."""
    workdir = tmp_path / "routers"
    arg = (
        "runlocal,deployment=synthetic,plans_per_domain=1,plan_steps=2,max_step_tokens=4,"
        "bucket=16,grid.policy=[auto:teacher_forced,auto:own,set:d0+d3,single:d0],"
        "grid.pairing=[[d0,d1,d2,d3]],grid.gamma=[2],grid.seed=[0],"
        "grid.verifier_temperature=[0.0],grid.rule=[default],auto_explore=1.0"
    )
    proc = specjax(f"--config={CONFIGS[0]}:{arg}", f"--workdir={workdir}", timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = {
        r["policy"]: r
        for r in map(json.loads, (workdir / "results.jsonl").read_text().splitlines())
    }
    assert set(rows) == {"auto:teacher_forced", "auto:own", "set:d0+d3", "single:d0"}
    for name, r in rows.items():
        assert r["tv_distance"] == 0.0, name  # greedy: every router commits the greedy plan
    # The fixed set drafted with d0 and d3 on every plan, and with nothing else.
    reached = [sum(col) for col in zip(*rows["set:d0+d3"]["per_plan"]["own_reached"])]
    assert reached[0] > 0 and reached[3] > 0 and reached[1] == reached[2] == 0, reached
    summary = json.loads((workdir / "summary.json").read_text())
    assert set(summary["policies"]) >= set(rows)
    page = (workdir / "seed_report.md").read_text()
    assert "| auto:teacher_forced |" in page and "| set:d0+d3 |" in page
