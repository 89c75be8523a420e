"""Ahead-of-time compilation for a compile-only target, and what the compiler says of it.

`compile_for` lowers a jitted function over abstract arguments (``jax.ShapeDtypeStruct``
with shardings on a compile-only mesh, `specjax.tpu.targets`), traced for the TPU
(`specjax.runtime.backend.tracing_for`), and compiles it with XLA:TPU. `Compiled` holds what the
compiled object can tell: per-chip memory (`memory_analysis`: arguments, outputs, aliased
(donated) bytes, temporaries, generated code; peak = arguments + outputs − aliased +
temporaries), cost (`cost_analysis`: FLOPs, bytes accessed, the compiler's own time
estimate ``optimal_seconds``) and the collectives and copies read from the optimized HLO
(`hlo_ops`), each with its bytes and whether it sits inside a loop body.

A program that does not fit fails in the compiler (RESOURCE_EXHAUSTED); `compile_for`
returns that as `Compiled.error` rather than raising, so a planner can report it.
"""

from __future__ import annotations

import dataclasses
import re
import time
from typing import Any

import numpy as np

from specjax.runtime.backend import tracing_for

__all__ = ['COLLECTIVES', 'Compiled', 'HloOp', 'compile_for', 'hlo_ops', 'shape_bytes']

COLLECTIVES = (
    'all-gather',
    'all-reduce',
    'reduce-scatter',
    'all-to-all',
    'collective-permute',
)

_DTYPE_BYTES = {
    'pred': 1, 's8': 1, 'u8': 1, 's16': 2, 'u16': 2, 'bf16': 2, 'f16': 2, 's32': 4, 'u32': 4,
    'f32': 4, 's64': 8, 'u64': 8, 'f64': 8, 'c64': 8, 'c128': 16, 'f8e4m3fn': 1, 'f8e5m2': 1,
    's4': 1, 'u4': 1,
}  # fmt: skip
_SHAPE = re.compile(r'\b([a-z]+[0-9]*(?:e[0-9]m[0-9]fn)?)\[([0-9,]*)\]')


def shape_bytes(text: str) -> int:
    """Bytes of every array shape in an HLO result type (``bf16[8,128]{1,0}`` or a tuple
    ``(f32[2], s32[])``)."""
    total = 0
    for dt, dims in _SHAPE.findall(text):
        if dt not in _DTYPE_BYTES:
            continue
        n = int(np.prod([int(d) for d in dims.split(',') if d])) if dims else 1
        total += n * _DTYPE_BYTES[dt]
    return total


@dataclasses.dataclass(frozen=True)
class HloOp:
    """One instruction of the optimized HLO: its opcode, result bytes, result type text,
    the computation it is in and whether that computation is a while loop's body (it runs
    once per trip: per round, per step)."""

    op: str
    bytes: int
    shape: str
    computation: str
    in_loop: bool


_INSTR = re.compile(r'^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.+?)\s+([a-z][a-z0-9\-]*)\((.*)$')
_COMP = re.compile(r'^(?:ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$')
_MEMSPACE = re.compile(r'S\(\d+\)|SC\([^)]*\)')


def _layout(type_text: str) -> str:
    """An array type without its memory space (``S(1)``: on-chip memory): what a copy
    between two memory spaces leaves unchanged."""
    return _MEMSPACE.sub('', type_text).replace(':)', ')').replace(':}', '}')


def hlo_ops(text: str, ops=COLLECTIVES + ('copy',)) -> list[HloOp]:
    """The instructions of kinds ``ops`` in optimized HLO text (``compiled.as_text()``).

    Async pairs (``all-gather-start`` / ``-done``) count once, as their start. A ``copy``
    counts only where it changes the array's layout (a relayout); copies that only move
    an array between memory spaces (prefetches into on-chip memory) are not counted. An
    instruction is ``in_loop`` when its computation is reached from some while loop's
    body (directly or through fusions and calls)."""
    comp = None
    found: list[tuple[str, str, str, str]] = []
    types: dict[str, str] = {}
    edges: dict[str, set[str]] = {}
    bodies: set[str] = set()
    fused: set[str] = set()  # fusion bodies: their copies are not materialised
    for line in text.splitlines():
        m = _COMP.match(line)
        if m and not line.startswith(' '):
            comp = m.group(1)
            continue
        im = _INSTR.match(line)
        if not im or comp is None:
            continue
        name, shape, op, rest = im.groups()
        types[name] = shape
        for key, callee in re.findall(r'(body|condition|to_apply|calls)=%?([\w.\-]+)', line):
            edges.setdefault(comp, set()).add(callee)
            if key == 'body' and op == 'while':
                bodies.add(callee)
            if key == 'calls' and op == 'fusion':
                fused.add(callee)
        if op.endswith('-done'):
            continue
        base = op[: -len('-start')] if op.endswith('-start') else op
        if base in ops:
            operand = re.match(r'\s*%?([\w.\-]+)', rest)
            found.append((base, shape, comp, operand.group(1) if operand else ''))
    looped = set()
    todo = list(bodies)
    while todo:
        c = todo.pop()
        if c in looped:
            continue
        looped.add(c)
        todo.extend(edges.get(c, ()))
    out = []
    for base, shape, c, operand in found:
        result = shape
        if shape.startswith('(') and (base in COLLECTIVES or base == 'copy'):
            # an async start's result is (operand, result[, context]): the result
            parts = re.findall(r'[a-z]+[0-9]*\[[0-9,]*\](?:\{[^}]*\})?', shape)
            if len(parts) >= 2:
                result = parts[1] if base != 'copy' else parts[0]
        if base == 'copy':
            if c in fused:
                continue
            src = types.get(operand, '')
            if src.startswith('('):
                continue
            if _layout(src) == _layout(result):
                continue
        out.append(HloOp(base, shape_bytes(result), result, c, c in looped))
    return out


@dataclasses.dataclass
class Compiled:
    """What the compiler said of one program on one target (per chip)."""

    name: str
    target: str
    seconds_to_compile: float = float('nan')
    error: str | None = None
    argument_bytes: int = 0
    output_bytes: int = 0
    alias_bytes: int = 0
    temp_bytes: int = 0
    code_bytes: int = 0
    flops: float = float('nan')
    bytes_accessed: float = float('nan')
    optimal_seconds: float = float('nan')
    ops: list = dataclasses.field(default_factory=list)
    hlo: str = ''
    input_formats: Any = None  # the compiled program's argument formats (layout + sharding)

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def peak_bytes(self) -> int:
        """Per-chip HBM the program holds at its peak: its arguments, its outputs not
        aliased to a donated argument, and its temporaries."""
        return self.argument_bytes + self.output_bytes - self.alias_bytes + self.temp_bytes

    def collectives(self, in_loop: bool | None = None) -> dict[str, tuple[int, int]]:
        """{kind: (count, bytes)} over the collectives (only those in loop bodies with
        ``in_loop=True``, only those outside with False)."""
        out: dict[str, tuple[int, int]] = {}
        for o in self.ops:
            if o.op not in COLLECTIVES or (in_loop is not None and o.in_loop != in_loop):
                continue
            n, b = out.get(o.op, (0, 0))
            out[o.op] = (n + 1, b + o.bytes)
        return out

    def largest(self, op: str, in_loop: bool | None = None) -> HloOp | None:
        cands = [o for o in self.ops if o.op == op and (in_loop is None or o.in_loop == in_loop)]
        return max(cands, key=lambda o: o.bytes) if cands else None

    def copies(self, min_bytes: int = 1 << 20, in_loop: bool | None = None) -> list[HloOp]:
        """Copies (relayouts) of at least ``min_bytes``."""
        return [
            o
            for o in self.ops
            if o.op == 'copy' and o.bytes >= min_bytes and (in_loop is None or o.in_loop == in_loop)
        ]

    def summary(self) -> dict[str, Any]:
        coll = self.collectives()
        return {
            'name': self.name,
            'target': self.target,
            'ok': self.ok,
            'error': self.error,
            'compile_s': round(self.seconds_to_compile, 1),
            'peak_gib': self.peak_bytes / 2**30,
            'argument_gib': self.argument_bytes / 2**30,
            'temp_gib': self.temp_bytes / 2**30,
            'alias_gib': self.alias_bytes / 2**30,
            'flops': self.flops,
            'bytes_accessed': self.bytes_accessed,
            'optimal_seconds': self.optimal_seconds,
            'collectives': {k: list(v) for k, v in coll.items()},
            'collectives_in_loop': {k: list(v) for k, v in self.collectives(True).items()},
            'copies_over_1mib': len(self.copies()),
        }


def _cost(exe) -> dict:
    try:
        cost = exe.cost_analysis()
    except Exception:  # pylint: disable=broad-except  # a backend without a cost model
        return {}
    if isinstance(cost, (list, tuple)):
        cost = cost[0] if cost else {}
    return dict(cost or {})


def compile_for(
    fn,
    args: tuple,
    statics: dict | None = None,
    *,
    name: str = '',
    target: str = '',
    platform: str = 'tpu',
    keep_hlo: bool = False,
) -> Compiled:
    """Lowers ``fn`` (a `jax.jit` function) on ``args`` (abstract, with shardings) and its
    static keyword arguments ``statics``, traced for ``platform``, and compiles it.

    Returns a `Compiled`; a compiler error (a program over HBM among them) is its
    ``error``, the first line of the message."""
    out = Compiled(name=name, target=target)
    t0 = time.perf_counter()
    try:
        with tracing_for(platform):
            exe = fn.lower(*args, **(statics or {})).compile()
    except Exception as e:  # pylint: disable=broad-except  # reported, not raised
        out.seconds_to_compile = time.perf_counter() - t0
        msg = str(e).strip().splitlines()
        out.error = f'{type(e).__name__}: {msg[0] if msg else ""}'[:500]
        return out
    out.seconds_to_compile = time.perf_counter() - t0
    mem = exe.memory_analysis()
    if mem is not None:
        out.argument_bytes = int(mem.argument_size_in_bytes)
        out.output_bytes = int(mem.output_size_in_bytes)
        out.alias_bytes = int(mem.alias_size_in_bytes)
        out.temp_bytes = int(mem.temp_size_in_bytes)
        out.code_bytes = int(getattr(mem, 'generated_code_size_in_bytes', 0))
    cost = _cost(exe)
    out.flops = float(cost.get('flops', float('nan')))
    out.bytes_accessed = float(cost.get('bytes accessed', float('nan')))
    out.optimal_seconds = float(cost.get('optimal_seconds', float('nan')))
    out.input_formats = exe.input_formats[0]
    text = exe.as_text()
    out.ops = hlo_ops(text)
    if keep_hlo:
        out.hlo = text
    return out
