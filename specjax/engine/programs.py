"""The engine's compiled programs and its parameter check, shared by every entry point.

* `check_finite`: NaN/inf in parameters, checked once per parameter array (memoised by
  identity), never per call.
* `compile_program` / `run_program`: a jitted function lowered and compiled ahead of time
  once per (static arguments, argument types), kept in a bounded LRU, and timed as its
  execution alone (compilation is a separate step, never a rerun). Under memory-mapping
  pressure the cache releases executables (`release_programs`).
* the first-execution effect: the first run of a freshly compiled executable is slower
  than the next ones (its code pages faulted in, its buffers first allocated: 2.1–2.9× a
  warm run on the zoo's routed policies). `run_program` therefore *warms* every program
  before its first timed execution: it runs it once, untimed, on the same arguments (on
  copies of the arguments it donates), then times a second run. So every measured
  `seconds` is a warm execution: no compilation and no first execution. The warm-up is
  counted (`warmed_programs`); ``SPECJAX_WARM_PROGRAMS=0`` turns it off (then the first
  execution is timed as it is).
"""

from __future__ import annotations

import collections
import time
import weakref
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from specjax.errors import ConfigError, env_value
from specjax.runtime import debug

__all__ = [
    'check_finite',
    'compile_program',
    'run_program',
    'release_programs',
    'compiled_programs',
    'cached_programs',
    'warmed_programs',
]


# ----------------------------------------------------------------------------------------
# Parameter finiteness: once per parameter array, not per call
# ----------------------------------------------------------------------------------------

_FINITE: dict[int, Any] = {}  # id(array) -> weakref to it, for arrays checked finite


def _known_finite(x) -> bool:
    ref = _FINITE.get(id(x))
    return ref is not None and ref() is x


def _remember_finite(x) -> None:
    key = id(x)
    try:
        _FINITE[key] = weakref.ref(x, lambda _, key=key: _FINITE.pop(key, None))
    except TypeError:  # not weak-referenceable: it is checked again next time
        pass


def check_finite(name: str, params) -> None:
    """Raises ConfigError if a floating parameter of `params` holds NaN or inf.

    Each array is checked once (memoised by identity while it lives), with one device→host
    transfer of a single flag for all unchecked device arrays; loaders may call it at load
    time, and the generate calls then find every array already checked.
    """
    todo = [
        x
        for x in jax.tree.leaves(params)
        if hasattr(x, 'dtype')
        and not isinstance(x, jax.ShapeDtypeStruct)  # abstract (a compile target's): no values
        and jnp.issubdtype(x.dtype, jnp.floating)
        and not _known_finite(x)
    ]
    if not todo:
        return
    host = [x for x in todo if isinstance(x, np.ndarray)]
    dev = [x for x in todo if not isinstance(x, np.ndarray)]
    ok = all(np.isfinite(x).all() for x in host)
    if ok and dev:
        ok = bool(jax.device_get(jnp.stack([jnp.all(jnp.isfinite(x)) for x in dev]).all()))
    if not ok:
        raise ConfigError(f"{name} parameters: contain NaN or inf; allowed: finite values")
    for x in todo:
        _remember_finite(x)


# ----------------------------------------------------------------------------------------
# Ahead-of-time compiled programs
# ----------------------------------------------------------------------------------------

#: Compiled programs kept, least recently used first; at most `_MAX_PROGRAMS` (a long sweep
#: over many shapes would otherwise hold every executable it ever compiled). An evicted
#: program is compiled again when next needed (quickly, from the persistent compilation
#: cache).
#:
#: Evicting is not enough to free one: JAX's in-memory compilation cache keeps every
#: executable whose lowering its lowering cache still holds (thousands), and on XLA:CPU
#: each executable holds its JIT-compiled code in memory mappings — 800–1,000 per zoo
#: speculative program. A sweep then hits the kernel's per-process limit
#: (`vm.max_map_count`, 65,530 by default), LLVM fails with "Cannot allocate memory" and
#: the process dies (`make reproduce` did, at cell 50 of 72). So when, after a compilation,
#: the process holds more than `_MAP_SHARE` of its mapping limit, the older half of this
#: cache is dropped and JAX's in-memory caches are cleared (`jax.clear_caches`): what this
#: cache still holds stays alive, the rest is freed, and any other jitted function
#: recompiles from the persistent cache when next called.
_PROGRAMS: collections.OrderedDict = collections.OrderedDict()
#: None: ``$SPECJAX_MAX_PROGRAMS`` (read at use, `_max_programs`); a test may set a number.
_MAX_PROGRAMS: int | None = None
_MAP_SHARE = 0.5
_COMPILED = [0]
_RELEASES = [0]
_WARMED = [0]
#: Executables already run once (by identity, while they live): their next run is warm.
_RAN: "weakref.WeakSet" = weakref.WeakSet()
#: None: ``$SPECJAX_WARM_PROGRAMS`` (read at use, `_warm_enabled`); a test may set a bool.
_WARM: bool | None = None


def _max_programs() -> int:
    """How many compiled programs the cache keeps: `_MAX_PROGRAMS`, else the variable's
    value (a ConfigError naming it when it is not allowed; never at import)."""
    return _MAX_PROGRAMS if _MAX_PROGRAMS is not None else env_value("SPECJAX_MAX_PROGRAMS")


def _warm_enabled() -> bool:
    """Whether a program runs once, untimed, before its first timed run."""
    return _WARM if _WARM is not None else env_value("SPECJAX_WARM_PROGRAMS")


def _map_count() -> int | None:
    """Memory mappings this process holds (Linux), else None."""
    try:
        with open("/proc/self/maps", "rb") as f:
            return sum(1 for _ in f)
    except OSError:
        return None


def _map_limit() -> int:
    try:
        with open("/proc/sys/vm/max_map_count") as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return 65530


def release_programs(keep: int | None = None) -> None:
    """Keeps the `keep` most recently used engine programs (default all this cache holds),
    drops the rest and clears JAX's in-memory caches, so that executables nothing holds
    are freed (see `_PROGRAMS`)."""
    keep = len(_PROGRAMS) if keep is None else max(int(keep), 0)
    while len(_PROGRAMS) > keep:
        _PROGRAMS.popitem(last=False)
    jax.clear_caches()
    _RELEASES[0] += 1


def compiled_programs() -> int:
    """How many engine programs this process has compiled (a retracing test reads it)."""
    return _COMPILED[0]


def cached_programs() -> int:
    """How many compiled engine programs this process holds now (≤ SPECJAX_MAX_PROGRAMS)."""
    return len(_PROGRAMS)


def _leaf_key(x):
    sharding = getattr(x, 'sharding', None) if isinstance(x, jax.Array) else None
    return (tuple(x.shape), str(x.dtype), bool(getattr(x, 'weak_type', False)), sharding)


def compile_program(fn, statics: dict, args: tuple):
    """`fn` lowered and compiled for these static arguments and these argument types,
    compiled once per process (the persistent compilation cache spans processes)."""
    key = (
        fn,
        tuple(sorted(statics.items())),
        jax.tree.structure(args),
        tuple(_leaf_key(x) for x in jax.tree.leaves(args)),
        debug.enabled(),
    )
    exe = _PROGRAMS.get(key)
    if exe is None:
        exe = fn.lower(*args, **statics).compile()
        _COMPILED[0] += 1
        _PROGRAMS[key] = exe
        while len(_PROGRAMS) > max(_max_programs(), 1):
            _PROGRAMS.popitem(last=False)
        maps = _map_count()
        if maps is not None and maps > _MAP_SHARE * _map_limit():
            release_programs(max(len(_PROGRAMS) // 2, 1))
    else:
        _PROGRAMS.move_to_end(key)
    return exe


def warmed_programs() -> int:
    """How many executables `run_program` has warmed (run once untimed) in this process."""
    return _WARMED[0]


def _donated(exe) -> bool:
    try:
        return any(getattr(a, "donated", False) for a in jax.tree.leaves(exe.args_info))
    except Exception:  # pylint: disable=broad-except  # no args_info: assume donation
        return True


def _warm(exe, args: tuple) -> None:
    """Runs `exe` once, untimed, unless it already ran (see the module docstring)."""
    try:
        if exe in _RAN:
            return
        _RAN.add(exe)
    except TypeError:  # not hashable / weak-referenceable: warm every time would be wrong
        return
    if _donated(exe):
        args = jax.tree.map(lambda x: x.copy() if isinstance(x, jax.Array) else x, args)
    jax.block_until_ready(exe(*args))
    _WARMED[0] += 1


def run_program(fn, statics: dict, args: tuple):
    """Runs the compiled program; returns (outputs on device, seconds of execution).

    The seconds are a warm execution: compilation is a separate step, and a program's
    first execution is run untimed before it (module docstring)."""
    exe = compile_program(fn, statics, args)
    if _warm_enabled():
        _warm(exe, args)
    t0 = time.perf_counter()
    out = jax.block_until_ready(exe(*args))
    return out, time.perf_counter() - t0
