"""The GGUF container as specjax reads it: every call into ggml's ``gguf`` package.

`_open` opens a file through a ``gguf.GGUFReader`` that bounds-checks every read, so a
short or corrupt file fails as one `ConfigError` line naming the file and the metadata
field or tensor where it breaks; `_metadata` reads the typed metadata into a dict;
`dequantize` turns one tensor (any of `TENSOR_TYPES`) into f32 on the host. What the
metadata and tensors mean as a specjax model (config, names, layouts) is
`specjax.models.gguf`'s.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from specjax.errors import ConfigError

__all__ = ['TENSOR_TYPES', 'dequantize']

#: Tensor types read (dequantized at load). The formats the issue's models use are tested
#: bit-exactly against an independent decoder; the others go through ``gguf.quants``.
TENSOR_TYPES = (
    'F32',
    'F16',
    'BF16',
    'Q8_0',
    'Q4_0',
    'Q4_1',
    'Q5_0',
    'Q5_1',
    'Q2_K',
    'Q3_K',
    'Q4_K',
    'Q5_K',
    'Q6_K',
)


def _fail(msg: str) -> ConfigError:
    return ConfigError(' '.join(msg.split()))


def _gguf():
    try:
        import gguf  # pylint: disable=import-outside-toplevel
    except ImportError:
        raise _fail("GGUF files need the 'gguf' package (pip install gguf)") from None
    return gguf


def _field_value(field) -> Any:
    v = field.contents()
    if isinstance(v, np.generic):
        v = v.item()
    return v


class _Broken(Exception):
    """Raised inside `_Reader`: what is wrong, in words (the file is named by `_open`)."""


_READER = None


def _reader_class():
    """``gguf.GGUFReader`` that says where a short or corrupt file breaks.

    The stock reader slices its memory map without bounds checks: a file cut short fails
    later with an unrelated numpy error (a reshape), and an unknown tensor type id as a
    bare enum ``ValueError``. Every read goes through ``_get``, so checking there (and
    recording which part of the file is being parsed) turns both into one line naming the
    metadata field or tensor. (The hooks are ``GGUFReader``'s internal methods, stable
    since gguf 0.6; the tests read truncated and patched files through them.)
    """
    global _READER  # pylint: disable=global-statement
    if _READER is not None:
        return _READER
    gguf = _gguf()

    class Reader(gguf.GGUFReader):
        _part = 'the header (magic, version, counts)'
        _src = _buf = None

        def _get(self, offset, dtype, count=1, override_order=None):
            # As the stock `_get`, but slicing a plain ndarray view of the map (slicing the
            # np.memmap subclass costs ~10 us a call, and a 49k-token vocabulary takes
            # ~250k calls) and bounds-checked.
            if self._src is not self.data:
                self._src, self._buf = self.data, self.data.view(np.ndarray)
            dt, count = np.dtype(dtype), int(count)
            end = int(offset) + dt.itemsize * count
            if end > self._buf.shape[0]:
                raise _Broken(
                    f'truncated file: {self._part} needs bytes up to {end} but the '
                    f'file has {self._buf.shape[0]}'
                )
            arr = self._buf[int(offset) : end].view(dt)[:count]
            order = self.byte_order if override_order is None else override_order
            return arr.view(arr.dtype.newbyteorder(order))

        def _build_fields(self, offs, count):
            self._part = 'the first metadata field'
            return super()._build_fields(offs, count)

        def _push_field(self, field, skip_sum=False):
            out = super()._push_field(field, skip_sum)
            if not field.name.startswith('GGUF.'):
                self._part = f'the metadata field after {field.name}'
            return out

        def _build_tensor_info(self, offs, count):
            self._part = 'the tensor table (first entry)'
            return super()._build_tensor_info(offs, count)

        def _get_tensor_info_field(self, orig_offs):
            field = super()._get_tensor_info_field(orig_offs)
            self._part = f'the tensor table (the entry after {field.name})'
            return field

        def _build_tensors(self, start_offs, fields):
            size = self.data.shape[0]
            for field in fields:  # parts: name_len, name, n_dims, dims, type, offset
                name = bytes(field.parts[1]).decode('utf-8', errors='replace')
                raw = int(field.parts[4][0])
                try:
                    kind = gguf.GGMLQuantizationType(raw)
                except ValueError:
                    raise _Broken(
                        f'tensor {name} has ggml type id {raw}, which is not a ggml '
                        f'tensor type (allowed: {", ".join(TENSOR_TYPES)})'
                    ) from None
                block, type_size = gguf.GGML_QUANT_SIZES[kind]
                n = math.prod(int(s) for s in field.parts[3])
                begin = int(start_offs) + int(field.parts[5][0])
                end = begin + n * type_size // block
                if end > size:
                    raise _Broken(
                        f'truncated file: tensor {name} ({kind.name}) occupies bytes '
                        f'{begin}..{end} but the file has {size}'
                    )
            self._part = 'the tensor data'
            return super()._build_tensors(start_offs, fields)

    _READER = Reader
    return Reader


def _open(path: Path):
    """The ``gguf.GGUFReader`` of ``path``, every failure as one line naming the file."""
    reader_class = _reader_class()
    if not path.is_file():
        raise _fail(f'gguf {path}: no such file (a local .gguf file is needed)')
    size = path.stat().st_size
    with open(path, 'rb') as fh:
        magic = fh.read(4)
    if magic != b'GGUF':
        if len(magic) < 4 and b'GGUF'.startswith(magic) and size:
            raise _fail(
                f'gguf {path}: truncated file: the header needs bytes up to 24 but '
                f'the file has {size}'
            )
        raise _fail(
            f'gguf {path}: not a GGUF file (it starts with {magic!r}, a GGUF file '
            f"with b'GGUF'; {size} bytes)"
        )
    try:
        reader = reader_class(str(path))
    except _Broken as e:
        raise _fail(f'gguf {path}: {e}') from None
    except Exception as e:  # corrupt headers raise anything from numpy/struct/enum
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise _fail(
            f'gguf {path}: not a readable GGUF file ({type(e).__name__}: {msg}; '
            f'{size} bytes on disk)'
        ) from None
    for t in reader.tensors:  # the reader above checks this; kept for other readers
        end = int(t.data_offset) + int(t.n_bytes)
        if end > size:
            raise _fail(
                f'gguf {path}: tensor {t.name} ends at byte {end} but the file has '
                f'{size} (truncated file)'
            )
    return reader


def _metadata(reader, where: str) -> dict[str, Any]:
    out = {}
    for name, field in reader.fields.items():
        if name.startswith('GGUF.'):
            continue
        try:
            out[name] = _field_value(field)
        except Exception as e:  # pylint: disable=broad-except
            msg = str(e).splitlines()[0] if str(e) else ''
            raise _fail(
                f'{where}: metadata {name} is unreadable ({type(e).__name__}: {msg})'
            ) from None
    return out


def dequantize(tensor) -> np.ndarray:
    """One tensor as f32 ``[rows, columns]`` (HF ``[out, in]``; 1-D stays 1-D)."""
    gguf = _gguf()
    kind = tensor.tensor_type
    data = tensor.data
    if kind == gguf.GGMLQuantizationType.F32:
        out = np.asarray(data, np.float32)
    elif kind == gguf.GGMLQuantizationType.F16:
        out = np.asarray(data).view(np.float16).astype(np.float32)
    else:
        out = gguf.quants.dequantize(np.asarray(data), kind).astype(np.float32, copy=False)
    shape = tuple(int(s) for s in reversed(tensor.shape.tolist()))
    return out.reshape(shape)
