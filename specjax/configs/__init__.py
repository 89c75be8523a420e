"""What the config files in ``configs/`` import: `specjax.configs.common` (no JAX)."""
