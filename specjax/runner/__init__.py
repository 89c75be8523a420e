"""Sweeps: config -> grid of cells -> one registered experiment per cell -> JSONL -> report.

errors (specjax.errors)  ConfigError, check: every config validation
registry      register_experiment / get_experiment: experiments by name, with hooks
grid          expand_grid: config.grid -> cells with stable ids (at most MAX_CELLS);
              split_rows: a journal's rows of the grid, and the others (reported)
plans_validation  the plans experiment's validate hook: every cell checked first
results       the resumable JSONL journal (atomic appends, torn-line tolerant)
sweep         prepare / execute / run: one workdir per run, resumable, multi-process
report        report.md and plots from the results (also ``python -m specjax.report``)
cli           one-line errors for the command-line entry points
"""
