"""Measurement: what a run is measured by, on this machine and against the field.

hardware          stream bandwidth, weight bytes per forward, the accelerator roofline, and
                  T_score(k) / T_step beside them (experiments/benchmark_real.py's ratio part)
round_anatomy     experiments/profile_round.py's tools: HLO census, per-thunk profile, budgets
round_profile     experiments/profile_round.py's measurement: the timed loop against its forwards
real_speed        experiments/benchmark_real.py's measurement: ratio, spec and peer parts
benchmark_tables  experiments/benchmark.py's tables and page; benchmark_real.py's page
peer              specjax against transformers' assisted generation on the zoo's weights
peer_real         transformers on the real verifier's GGUF weights (benchmark_real.py's peer)
evaluation        how good the zoo's models are (held-out loss, acceptance, decode speed)
drafter_entries   the speed scripts' drafter entries ('lookup+eagle*2')
loop_law          what teacher-forced acceptance predicts for the loop's rounds

The machine's timers and prices (`specjax.measure.timing`, `specjax.measure.prices`,
`specjax.measure.price_programs`) still sit at the package root.
"""
