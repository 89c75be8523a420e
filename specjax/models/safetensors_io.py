"""Reading and writing safetensors files tensor by tensor (no full copy in memory).

The format: an 8-byte little-endian header length, a JSON header naming each tensor's
dtype, shape and byte range, then the raw little-endian bytes. Files are memory-mapped
and read one tensor at a time as numpy views (bfloat16 through ``ml_dtypes``); written one
tensor at a time. Why not ``safetensors.safe_open``: its numpy frontend cannot return
bfloat16, the dtype of most real checkpoints, and its slices do not compose with the
transposes a layout change needs. Every problem is one `ConfigError` line naming the file
and the tensor.
"""

from __future__ import annotations

import dataclasses
import json
import math
import mmap
import struct
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

from specjax.atomic import atomic_file
from specjax.errors import ConfigError

__all__ = ['ST_DTYPES', 'ST_NAMES', 'TensorInfo', 'TensorMaps', 'read_header', 'write_file']

ST_DTYPES = {
    'F32': np.dtype(np.float32),
    'F16': np.dtype(np.float16),
    'BF16': np.dtype(ml_dtypes.bfloat16),
    'F64': np.dtype(np.float64),
}
ST_NAMES = {v: k for k, v in ST_DTYPES.items()}


def _fail(msg: str) -> ConfigError:
    return ConfigError(' '.join(msg.split()))


@dataclasses.dataclass(frozen=True)
class TensorInfo:
    file: Path
    dtype: np.dtype
    shape: tuple[int, ...]
    start: int  # absolute byte offset in the file
    end: int


def read_header(path: Path) -> dict[str, TensorInfo]:
    size = path.stat().st_size
    with open(path, 'rb') as fh:
        raw = fh.read(8)
        if len(raw) < 8:
            raise _fail(f'{path}: truncated safetensors file ({size} bytes, no header)')
        (n,) = struct.unpack('<Q', raw)
        if n > size - 8:
            raise _fail(f'{path}: truncated safetensors file (header of {n} bytes, file of {size})')
        try:
            header = json.loads(fh.read(n))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise _fail(f'{path}: corrupt safetensors header ({e})') from None
    if not isinstance(header, dict):
        raise _fail(
            f'{path}: corrupt safetensors header (a JSON {type(header).__name__}, not an object)'
        )
    out = {}
    for name, rec in header.items():
        if name == '__metadata__':
            continue
        try:
            dtype = ST_DTYPES[rec['dtype']]
            shape = tuple(int(s) for s in rec['shape'])
            a, b = (int(x) for x in rec['data_offsets'])
        except (KeyError, TypeError, ValueError):
            raise _fail(
                f'{path}: tensor {name}: unsupported dtype or malformed header entry '
                f'{rec!r} (allowed dtypes: {", ".join(ST_DTYPES)})'
            ) from None
        if b - a != dtype.itemsize * math.prod(shape):
            raise _fail(
                f'{path}: tensor {name}: header size {b - a} bytes does not match '
                f'shape {list(shape)} of {rec["dtype"]}'
            )
        if 8 + n + b > size:
            raise _fail(
                f'{path}: truncated safetensors file: tensor {name} needs bytes up to '
                f'{8 + n + b}, the file has {size}'
            )
        out[name] = TensorInfo(path, dtype, shape, 8 + n + a, 8 + n + b)
    return out


class TensorMaps:
    """Read-only memory maps of the checkpoint's files, opened once, closed on exit."""

    def __init__(self):
        self._open: dict[Path, tuple[Any, mmap.mmap]] = {}

    def view(self, t: TensorInfo) -> np.ndarray:
        if t.file not in self._open:
            fh = open(t.file, 'rb')
            self._open[t.file] = (fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ))
        buf = self._open[t.file][1]
        count = math.prod(t.shape)
        return np.frombuffer(buf, t.dtype, count, offset=t.start).reshape(t.shape)

    def release(self, t: TensorInfo) -> None:
        """Drops the tensor's pages from this process's resident set (they stay in the OS
        page cache): the mapping never holds more than the tensor being placed."""
        mm = self._open.get(t.file, (None, None))[1]
        if mm is None or not hasattr(mm, 'madvise') or not hasattr(mmap, 'MADV_DONTNEED'):
            return
        start = t.start - t.start % mmap.PAGESIZE
        try:
            mm.madvise(mmap.MADV_DONTNEED, start, t.end - start)
        except (OSError, ValueError):
            pass

    def close(self):
        for fh, mm in self._open.values():
            try:
                mm.close()
            except BufferError:  # a caller still holds a view; the map dies with it
                pass
            fh.close()
        self._open.clear()


def write_file(
    path: Path, header: dict[str, Any], tensors: Sequence[tuple[str, Callable[[], np.ndarray]]]
) -> None:
    """Writes one safetensors file atomically: ``header`` (names -> dtype, shape,
    data_offsets, in file order) and each tensor produced, written and dropped in turn."""
    path = Path(path)
    blob = json.dumps(header, separators=(',', ':')).encode()
    blob += b' ' * (-len(blob) % 8)  # 8-byte alignment of the data
    with atomic_file(path) as fh:
        fh.write(struct.pack('<Q', len(blob)))
        fh.write(blob)
        for name, make in tensors:
            arr = make()
            rec = header[name]
            if list(arr.shape) != list(rec['shape']):
                raise _fail(
                    f'safetensors export: tensor {name} has shape {list(arr.shape)}, '
                    f'expected {list(rec["shape"])}'
                )
            dt = ST_DTYPES[rec['dtype']]
            fh.write(arr.astype(dt.newbyteorder('<'), copy=False).tobytes())
            del arr
