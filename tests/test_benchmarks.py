"""The benchmarks' timing loops (specjax.measure.timing) time what they say. The scripts themselves
run end to end in tests/test_experiment_scripts.py."""

from __future__ import annotations

import numpy as np


def test_forward_timer_writes_the_cache_in_place(tiny_lm, tiny_params):
    """The timed forward loop carries its cache as the engine does: no copy of a layer's
    cache per rep (a loop that closed over the cache copied it on every rep, adding 0.85 ms
    to a 3.6 ms step of the zoo verifier at batch 32 and biasing T_step and T_score)."""
    from specjax.measure.timing import forward_timer  # pylint: disable=import-outside-toplevel

    batch, capacity = 2, 32
    run = forward_timer(tiny_lm, tiny_params, batch, 3, 12, capacity, reps=4)
    assert run() > 0
    cache = tiny_lm.init_cache(batch, capacity)
    shapes = {",".join(map(str, a.shape)) for a in (cache.k[0], cache.v[0])}
    copies, computation = [], None
    for line in run.executable.as_text().splitlines():
        if line and not line.startswith(" ") and "{" in line:  # a computation's header
            computation = "ENTRY" if line.startswith("ENTRY") else line.split(" ")[0]
        if " copy(" in line and any(f"[{s}]" in line for s in shapes):
            copies.append((computation, line.strip()))
    # One copy per call of the (undonated) input cache is in the entry computation; a copy
    # per rep would sit in the loop's body.
    assert all(c == "ENTRY" for c, _ in copies), copies


def _speed_result(spec_ratio: float, slots: int = 1, gamma: int = 3, layout="bfloat16"):
    row = dict(
        drafter="a" if slots == 1 else "a+b",
        rule="rejection",
        slots=slots,
        gamma=gamma,
        batch=1,
        tau=1.0,
        drafter_tau=1.0,
        ar_tokens_per_s=40.0,
        spec_tokens_per_s=50.0,
        measured_speedup=1.25,
        hardware_aware_speedup=1.3,
        measured_over_hardware_aware=0.96,
        alpha=0.5,
        tokens_per_round=2.0,
        row_use=1.0,
        c=0.03,
        t_score_over_t_step=spec_ratio,
    )
    ratio = {"1": 1.0, "2": 1.1, "4": 1.3, "10": 1.9}
    return {
        "stream_bytes_per_s": 3e10,
        "new_tokens": 64,
        "prompts_per_domain": 1,
        "repeats": 2,
        "layout": layout,
        "ratio": [
            dict(
                dtype="bfloat16",
                batch=1,
                t_step=0.02,
                floor_s=0.01,
                ratio=ratio,
                roofline_ratio={"TPU": {k: 1.0 for k in ratio}},
                roofline_t_step={"TPU": 1e-4},
            )
        ],
        "spec": [row],
    }


def test_the_speed_page_flags_a_score_ratio_its_own_table_contradicts():
    """A spec row's T_score / T_step is compared with the ratio table's at the same k
    (linear between the measured widths): 1.3 at k = 4 agrees, 1.7 does not; a two-drafter
    tree at γ 3 scores k = 7 (1.6 in the table); a row of another layout, or a width
    outside the table's, is not compared."""
    from specjax.measure.benchmark_tables import ratio_disagreements, real_speed_page

    assert ratio_disagreements(_speed_result(1.3)) == []
    bad = ratio_disagreements(_speed_result(1.7))
    assert len(bad) == 1 and bad[0]["k"] == 4 and abs(bad[0]["table"] - 1.3) < 1e-9
    tree = ratio_disagreements(_speed_result(1.3, slots=2))
    assert len(tree) == 1 and tree[0]["k"] == 7 and abs(tree[0]["table"] - 1.6) < 1e-9
    assert ratio_disagreements(_speed_result(1.6, slots=2)) == []
    assert ratio_disagreements(_speed_result(3.0, gamma=5, slots=2)) == []  # k 11: not measured
    assert ratio_disagreements(_speed_result(1.7, layout="float32")) is None
    live = _speed_result(1.7)  # the run's own result holds int widths (JSON: str)
    live["ratio"][0]["ratio"] = {int(k): v for k, v in live["ratio"][0]["ratio"].items()}
    assert [b["k"] for b in ratio_disagreements(live)] == [4]
    page = "\n".join(real_speed_page(_speed_result(1.7)))
    assert "**Check:**" in page and "k 4, 1.70 here against 1.30" in page
    assert "within 15%" in "\n".join(real_speed_page(_speed_result(1.3)))


def test_speedup_interval_covers_the_calls_and_the_page_prints_it():
    """The bootstrap interval of spec ÷ AR over calls: a ratio of pooled sums, containing
    the pooled ratio, wider when the calls disagree, a point when they all agree."""
    from specjax.measure.benchmark_tables import real_speed_page  # pylint: disable=import-outside-toplevel
    from specjax.metrics import speedup_interval  # pylint: disable=import-outside-toplevel

    rng = np.random.default_rng(0)
    ar = np.stack([np.full(24, 64.0), rng.uniform(1.5, 1.7, 24)], 1)  # (tokens, seconds)
    same = ar.copy()
    same[:, 1] /= 1.5  # every call 1.5x
    lo, hi = speedup_interval(same, ar)
    assert abs(lo - 1.5) < 1e-9 and abs(hi - 1.5) < 1e-9
    mixed = ar.copy()
    mixed[:, 1] /= rng.uniform(1.1, 1.9, 24)  # the calls' speed-ups vary
    pooled = (mixed[:, 0].sum() / mixed[:, 1].sum()) / (ar[:, 0].sum() / ar[:, 1].sum())
    lo, hi = speedup_interval(mixed, ar)
    assert lo < pooled < hi and hi - lo > 0.1
    result = _speed_result(1.3)
    result["spec"][0]["speedup_interval"] = [1.18, 1.33]
    assert "| 1.25 (1.18–1.33) |" in "\n".join(real_speed_page(result))
    del result["spec"][0]["speedup_interval"]  # a result written before intervals
    assert "| 1.25 | 1.30 |" in "\n".join(real_speed_page(result))


def test_drafter_entries():
    from specjax.measure import drafter_entries as e  # pylint: disable=import-outside-toplevel

    assert e.members("lookup+eagle*2") == ["lookup", "eagle", "eagle"]
    assert e.labels(e.members("eagle*3")) == ["eagle", "eagle#2", "eagle#3"]
    assert e.twin_counts("eagle+lookup+eagle") == {"eagle": 2, "lookup": 1}
    assert e.entry_ok("lookup+eagle*2") and e.entry_ok("code")
    assert not any(map(e.entry_ok, ["eagle*0", "eagle*", "+code", "eagle*x"]))
