"""The side-by-side page's section on real cross-family heterogeneity
(`runner.seed_compare_heterogeneity`): the pairwise KL on the common support, the KL
ceiling's effect, which sets share a prefix — read from the fixture rows
(tests/test_seed_compare.py's, under three deployments' configs). No model runs here."""

from __future__ import annotations

import copy

from test_seed_compare import (  # noqa: F401  (_few_resamples: the same autouse fixture)
    _cells,
    _few_resamples,
    _line,
    _page3,
    _with_ceiling_rows,
)

from specjax.runner import seed_compare_heterogeneity


def _hetero(page: str, k: str | None = None) -> str:
    sec = page.split("## What real cross-family heterogeneity changes", 1)[1]
    return sec if k is None else sec.split(f"\n### {k} (", 1)[1].split("\n### ", 1)[0]


def test_heterogeneity_section_reads_kl_ceiling_and_sets_from_the_rows():
    rows = _with_ceiling_rows()
    page = _page3(gemma_rows=rows)
    gem = _hetero(page, "gemma3")
    kl = max(r["kl_max"] for r in rows if isinstance(r.get("kl_max"), float))
    assert f"largest {kl:.2f} nats" in gem
    # all_on_minus_kl_ceiling ran one set of d0..d3, all_on each alone: the ceiling kept
    # every pair apart; so did naive_plus_kl_ceiling against naive.
    every = "d0–d1, d0–d2, d0–d3, d1–d2, d1–d3, d2–d3"
    line = _cells(_line(gem, "| all_on vs all_on_minus_kl_ceiling |"))
    assert line[-1] == every and line[5] == f"0 / {_shared(rows, 'all_on_minus_kl_ceiling')}"
    assert _cells(_line(gem, "| naive_plus_kl_ceiling vs naive |"))[-1] == every
    assert "(all_on_minus_kl_ceiling − all_on)" in line[2]
    # a run without the ceiling policies reads "not run", naming the missing policy
    zoo = _hetero(page, "zoo")
    assert "not run (all_on_minus_kl_ceiling has no rows)" in zoo
    # the drafter sets that shared a prefix, with the policy's joint acceptance
    naive = _cells(_line(gem, "| naive |"))
    assert naive[1] == "d0+d1+d2+d3 (18)" and naive[2].startswith(
        _cells(_line(page, "| naive joint acceptance on shared prefixes |"))[3]
    )
    assert "Every drafter ran alone under: all_on, naive_plus_kl_ceiling." in gem
    # four drafters: KL per pair is not in the rows, and the page says so
    assert "KL per drafter pair: not recorded" in gem


def _shared(rows, policy) -> int:
    return sum(r["shared_rounds"] for r in rows if r["policy"] == policy)


def test_heterogeneity_pairs_follow_the_branch_records():
    rows = _with_ceiling_rows()
    for r in rows:  # under all_on, d0 and d1 now share a set on every step
        if r["policy"] == "all_on":
            recs = []
            for b in r["branch_records"]:
                if b["drafters"] == ["d1"]:
                    continue
                if b["drafters"] == ["d0"]:
                    b = dict(b, drafters=["d0", "d1"])
                recs.append(b)
            r["branch_records"] = recs
    gem = _hetero(_page3(gemma_rows=rows), "gemma3")
    line = _cells(_line(gem, "| all_on vs all_on_minus_kl_ceiling |"))
    assert line[-1] == "d0–d2, d0–d3, d1–d2, d1–d3, d2–d3"
    assert _cells(_line(gem, "| all_on |"))[1] == "d0+d1 (6)"
    for r in rows:  # without the ceiling every drafter now runs alone too: nothing to split
        if r["policy"] == "all_on_minus_kl_ceiling":
            r["branch_records"] = [
                dict(b, drafters=[d]) for b in r["branch_records"] for d in b["drafters"]
            ]
    gem = _hetero(_page3(gemma_rows=rows), "gemma3")
    line = _cells(_line(gem, "| all_on vs all_on_minus_kl_ceiling |"))
    assert line[-1] == "none (no pair shares a set under all_on_minus_kl_ceiling either)"
    assert "so the ceiling had no pair to keep apart" in gem


def test_heterogeneity_two_drafters_name_their_one_pair():
    """A deployment of two drafters (gemma3's smollm2 and lookup): the rows' largest KL is
    that pair's, and the page says so; against the ceiling, from the rows' kl_ceiling."""
    rows = [
        {"policy": "all_on", "pairing": ["smollm2", "lookup"], "kl_max": 0.2, "kl_ceiling": 0.35},
        {"policy": "naive", "pairing": ["smollm2", "lookup"], "kl_max": 0.3, "kl_mean": 0.1},
    ]
    text = "\n".join(seed_compare_heterogeneity._kl_lines({"rows": rows}))
    assert "the one pair's (smollm2, lookup)" in text and "largest 0.30 nats" in text
    assert "at or below the 0.35-nat ceiling" in text
    assert "(mean over those positions): not recorded" in text  # no kl_outside_mass


def test_heterogeneity_says_not_recorded_where_the_rows_lack_a_field():
    rows = _with_ceiling_rows()
    for r in rows:
        r.pop("kl_max", None)
        r.pop("kl_outside_mass", None)
        if r["policy"] == "naive_plus_kl_ceiling":
            r.pop("branch_records")
    page = _page3(gemma_rows=rows)
    gem = _hetero(page, "gemma3")
    assert "largest not recorded" in gem and "Against the ceiling: not recorded" in gem
    assert "no row carries `kl_max`" in gem
    assert "not recorded (no branch_records[].drafters in naive_plus_kl_ceiling's rows)" in _line(
        gem, "| naive_plus_kl_ceiling vs naive |"
    )
    assert "the largest KL: not recorded on gemma3 or the zoo (`kl_max`)" in _hetero(page)


def test_heterogeneity_sentences_are_conditional_on_the_figures():
    rows = copy.deepcopy(_with_ceiling_rows())
    for r in rows:  # gemma3's drafters: far more divergent than the zoo's
        if isinstance(r.get("kl_max"), float):
            r["kl_max"] *= 3
            r["kl_outside_mass"] = min(1.0, r["kl_outside_mass"] * 1.2)
    text = _hetero(_page3(gemma_rows=rows)).split("\n### ", 1)[0]
    assert "Both lie above the zoo's on gemma3." in text
    low = copy.deepcopy(_with_ceiling_rows())
    for r in low:  # now every pair below the ceiling
        if isinstance(r.get("kl_max"), float):
            r["kl_max"] = 0.1
    page = _page3(gemma_rows=low)
    assert "The largest KL is at or below the 0.35-nat ceiling" in _hetero(page, "gemma3")
    assert "exceeds the ceiling on zoo, smollm2 and not on gemma3" in _hetero(page)
    assert "On no real deployment do both lie above the zoo's." in _hetero(page)


def test_a_tiny_distinguishable_ceiling_effect_is_written_with_its_size(monkeypatch):
    """A paired effect that rounds to ±0.00 but whose interval excludes zero is written
    with four decimals and 'under 0.005', not as a bare '+0.00, distinguishable'."""
    page = _page3(gemma_rows=_with_ceiling_rows())
    assert "primary throughput moves by" in _hetero(page, "gemma3")
    tiny = {"value": 0.0012, "ci": [0.0005, 0.002], "distinguishable": True}
    real = seed_compare_heterogeneity.effect
    monkeypatch.setattr(
        seed_compare_heterogeneity,
        "effect",
        lambda s, label, what: tiny if what == "primary" else real(s, label, what),
    )
    gem = _hetero(_page3(gemma_rows=_with_ceiling_rows()), "gemma3")
    assert "primary throughput moves by +0.0012 (" in gem
    assert "distinguishable from zero but under 0.005" in gem
