"""How specjax's programs are traced, compiled, placed and checked.

backend        the platform programs are traced for (`tracing_for('tpu')` in a CPU process)
compile_cache  the persistent XLA compilation cache ($SPECJAX_COMPILE_CACHE)
sharding       device mesh, logical axis rules, sharded placement of models and caches
debug          value checks traced into the programs when enabled (SPECJAX_CHECKS=1)
"""
