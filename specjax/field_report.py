"""The field report's figures and thresholds, in one place (SPEC §6, §8).

The field report (``shared/seed``, "the seed" in the SPEC) measured a 70B verifier with 1.5B
code, 3B prose and 7B reasoning drafters; its boundary function and KL ceiling carry these
defaults. Everything else — `policy.boundary`, `policy.switches`, the runner, the report,
the field-report table (`runner.seed_table`) — reads them from here. ("Seed" elsewhere in
the code is the PRNG seed.)
"""

from __future__ import annotations

#: Model sizes, in billions of parameters.
FIELD_REPORT_MODEL_SIZES_B = {"verifier": 70.0, "code": 1.5, "prose": 3.0, "reasoning": 7.0}
#: c_i at the field report's sizes: drafter parameters / verifier parameters.
FIELD_REPORT_COSTS = {
    n: s / FIELD_REPORT_MODEL_SIZES_B["verifier"]
    for n, s in FIELD_REPORT_MODEL_SIZES_B.items()
    if n != "verifier"
}
#: The field report's table (SPEC §8).
FIELD_REPORT_ACCEPTANCE = {"code": 0.68, "prose": 0.61, "reasoning": 0.54}
FIELD_REPORT_TABLE = {
    "per_drafter_acceptance": FIELD_REPORT_ACCEPTANCE,
    "joint_acceptance": {"naive": 0.19, "all_on": 0.52},
    "consensus_fallback_rate": {"naive": 0.80, "all_on": 0.14},
    "throughput_ratio_vs_single": {"naive": 0.4, "all_on": 1.7},
}
#: `should_truncate_and_repropose`'s defaults, as the field report writes them.
TRUNCATION_OVERHEAD_RATIO = 0.15
ACCEPTANCE_FLOOR = 0.45
DEPTH_CEILING = 2.5
#: Switch 4's default ceiling, nats: the field report's observed safe range is "< 0.35 nats".
KL_CEILING = 0.35
