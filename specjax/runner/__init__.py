"""Sweeps: config -> grid of cells -> one registered experiment per cell -> JSONL -> report.

  errors (specjax.errors)  ConfigError, check: every config validation
  config_args   parse_config_arg: ``get_config("runlocal,key=value")`` for config files
  registry      register_experiment / get_experiment: experiments by name, with hooks
  grid          expand_grid: config.grid -> cells with stable ids (at most MAX_CELLS);
                split_rows: a journal's rows of the grid, and the others (reported)
  plans_validation  the plans experiment's validate hook: every cell checked first
  results       the resumable JSONL journal (atomic appends, torn-line tolerant)
  sweep         prepare / execute / run: one workdir per run, resumable, multi-process
  report        report.md and plots from the results (also ``python -m specjax.report``)
  cli           one-line errors for the command-line entry points
"""

__all__ = ["parse_config_arg", "plans_defaults"]


def __getattr__(name):
    # The config files' public API (imported lazily: configs load before JAX is needed).
    if name == "parse_config_arg":
        from specjax.runner.config_args import parse_config_arg
        return parse_config_arg
    if name == "plans_defaults":
        from specjax.runner.experiments import plans_defaults
        return plans_defaults
    raise AttributeError(name)
