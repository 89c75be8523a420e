"""The deployment kinds a config names (`deployment = 'zoo'`, ...): one module per kind."""
