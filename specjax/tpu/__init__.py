"""Compile-only TPU targets: specjax's programs compiled by XLA:TPU on a host without a TPU.

`targets` names slices (their chips' published HBM, bf16 peak and bandwidth) and builds a
mesh over libtpu's compile-only devices; `shapes` gives abstract parameters for any model
specjax loads (a GGUF header, a HF ``config.json``, a named preset); `aot` lowers and
compiles a program for a target and reads memory, cost and collectives off the result;
`programs` builds the engine's own programs (forward steps, speculative and
autoregressive generates, plan calls) with a deployment's shardings; `plan` answers
what fits and what a round costs (``python -m specjax.tpu.plan``).

Nothing here measures time: every figure is the compiler's (memory, FLOPs, bytes, its
own time model) or a roofline from them, and says which.
"""
