"""Registers the project's experiments with the runner (imported lazily by the registry)."""
from specjax.runner import experiments  # noqa: F401  (registers "plans")
