"""The benchmarks' timing loops (specjax.timing) time what they say. The scripts themselves
run end to end in tests/test_experiment_scripts.py."""

from __future__ import annotations


def test_forward_timer_writes_the_cache_in_place(tiny_lm, tiny_params):
    """The timed forward loop carries its cache as the engine does: no copy of a layer's
    cache per rep (a loop that closed over the cache copied it on every rep, adding 0.85 ms
    to a 3.6 ms step of the zoo verifier at batch 32 and biasing T_step and T_score)."""
    from specjax.timing import forward_timer  # pylint: disable=import-outside-toplevel

    batch, capacity = 2, 32
    run = forward_timer(tiny_lm, tiny_params, batch, 3, 12, capacity, reps=4)
    assert run() > 0
    cache = tiny_lm.init_cache(batch, capacity)
    shapes = {",".join(map(str, a.shape)) for a in (cache.k[0], cache.v[0])}
    copies, computation = [], None
    for line in run.executable.as_text().splitlines():
        if line and not line.startswith(" ") and "{" in line:  # a computation's header
            computation = "ENTRY" if line.startswith("ENTRY") else line.split(" ")[0]
        if " copy(" in line and any(f"[{s}]" in line for s in shapes):
            copies.append((computation, line.strip()))
    # One copy per call of the (undonated) input cache is in the entry computation; a copy
    # per rep would sit in the loop's body.
    assert all(c == "ENTRY" for c, _ in copies), copies
