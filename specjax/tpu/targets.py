"""Named TPU slices and meshes over libtpu's compile-only devices.

A `Slice` is a Cloud TPU slice as one buys it: its chips, their topology (the name libtpu's
topology API takes) and each chip's published figures — usable HBM, dense bf16 peak and
HBM bandwidth, from Google's Cloud TPU pages (cited per chip in `CHIPS`). `compile_devices`
asks libtpu (``pip install -e '.[tpu]'``) for compile-only devices of that topology: JAX
lowers and compiles for them on any host, no TPU attached, and nothing can run on them.

Slice names follow Cloud TPU's accelerator types: v5e and v6e count chips
(``v5litepod-16`` = 16 chips, written here ``v5e-16``), v5p counts TensorCores, two per
chip (``v5p-8`` = 4 chips, topology 2x2x1).
"""

from __future__ import annotations

import dataclasses
import functools
import os

import numpy as np
from jax.sharding import AxisType, Mesh

from specjax.errors import ConfigError

__all__ = ['CHIPS', 'SLICES', 'Chip', 'Slice', 'compile_devices', 'get_slice', 'slice_mesh']


@dataclasses.dataclass(frozen=True)
class Chip:
    """One accelerator chip's published figures (per chip)."""

    name: str
    device_kind: str  # what libtpu's compile-only devices report
    hbm_bytes: float  # usable HBM
    peak_flops: float  # dense bf16 FLOP/s
    hbm_bandwidth: float  # bytes/s
    source: str


CHIPS = {
    # https://cloud.google.com/tpu/docs/v5e — 197 TFLOP/s bf16, 16 GB HBM2 at 819 GB/s.
    'v5e': Chip('TPU v5e', 'TPU v5 lite', 16e9, 197e12, 819e9, 'cloud.google.com/tpu/docs/v5e'),
    # https://cloud.google.com/tpu/docs/v5p — 459 TFLOP/s bf16, 95 GiB usable HBM2e (of 96
    # physical) at 2,765 GB/s, two TensorCores per chip.
    'v5p': Chip('TPU v5p', 'TPU v5', 95 * 2**30, 459e12, 2765e9, 'cloud.google.com/tpu/docs/v5p'),
    # https://cloud.google.com/tpu/docs/v6e — 918 TFLOP/s bf16, 32 GB HBM at 1,640 GB/s.
    'v6e': Chip('TPU v6e', 'TPU v6 lite', 32e9, 918e12, 1640e9, 'cloud.google.com/tpu/docs/v6e'),
    # https://www.nvidia.com/en-us/data-center/h100/ — SXM: 989 TFLOP/s dense bf16, 80 GB
    # HBM3 at 3.35 TB/s (a roofline reference only: no compile-only devices).
    'h100': Chip('H100 SXM', 'NVIDIA H100', 80e9, 989e12, 3.35e12, 'nvidia.com H100 datasheet'),
}


@dataclasses.dataclass(frozen=True)
class Slice:
    """A TPU slice: ``chips`` chips of kind ``chip`` in libtpu topology ``topology``."""

    name: str
    chip: str
    topology: str
    chips: int
    one_host: bool = False  # a single chip needs chips_per_host_bounds=[1, 1, 1]

    @property
    def spec(self) -> Chip:
        return CHIPS[self.chip]


SLICES = {
    s.name: s
    for s in (
        Slice('v5e-1', 'v5e', 'v5e:1x1', 1, one_host=True),
        Slice('v5e-4', 'v5e', 'v5e:2x2', 4),
        Slice('v5e-8', 'v5e', 'v5e:2x4', 8),
        Slice('v5e-16', 'v5e', 'v5e:4x4', 16),
        Slice('v5p-8', 'v5p', 'v5p:2x2x1', 4),
        Slice('v5p-16', 'v5p', 'v5p:2x2x2', 8),
        Slice('v6e-4', 'v6e', 'v6e:2x2', 4),
        Slice('v6e-8', 'v6e', 'v6e:2x4', 8),
    )
}


def get_slice(name) -> Slice:
    """The named slice, or a ConfigError naming the allowed ones."""
    if isinstance(name, Slice):
        return name
    if name not in SLICES:
        raise ConfigError(f"slice: got {name!r}; allowed: one of {', '.join(SLICES)}")
    return SLICES[name]


def libtpu_available() -> bool:
    """Whether libtpu is installed (the `tpu` extra)."""
    try:
        import libtpu  # noqa: F401  # pylint: disable=import-outside-toplevel,unused-import
    except ImportError:
        return False
    return True


@functools.cache
def compile_devices(name: str) -> tuple:
    """The compile-only devices of a named slice (libtpu's topology API)."""
    sl = get_slice(name)
    if not libtpu_available():
        raise ConfigError(
            f"slice {sl.name!r}: libtpu is not installed; allowed: install the TPU compiler "
            "with `pip install -e '.[tpu]'` (or `make test-tpu`)"
        )
    # Compile-only use holds no chip: several processes (test workers) may load libtpu
    # at once, and its startup warnings about a missing TPU are noise here.
    for var, value in (
        ('ALLOW_MULTIPLE_LIBTPU_LOAD', '1'),
        ('TPU_STDERR_LOG_LEVEL', '3'),
        ('TPU_MIN_LOG_LEVEL', '3'),
    ):
        os.environ.setdefault(var, value)
    from jax.experimental import topologies  # pylint: disable=import-outside-toplevel

    kw = {'chips_per_host_bounds': [1, 1, 1]} if sl.one_host else {}
    devices = topologies.get_topology_desc(platform='tpu', topology_name=sl.topology, **kw).devices
    if len(devices) != sl.chips:
        raise ConfigError(
            f'slice {sl.name!r}: libtpu gave {len(devices)} devices for topology '
            f'{sl.topology!r}, expected {sl.chips}'
        )
    return tuple(devices)


def slice_mesh(name, data: int = 1, model: int | None = None) -> Mesh:
    """A ('data', 'model') mesh over the slice's compile-only devices, Auto axis types;
    ``model`` defaults to every chip not on 'data'."""
    sl = get_slice(name)
    if model is None:
        model = sl.chips // max(int(data), 1)
    if data < 1 or model < 1 or data * model != sl.chips:
        raise ConfigError(
            f'mesh: data={data} x model={model} on slice {sl.name!r}; allowed: '
            f'data * model = {sl.chips} (its chips)'
        )
    devices = np.asarray(compile_devices(sl.name), dtype=object).reshape(data, model)
    return Mesh(devices, ('data', 'model'), axis_types=(AxisType.Auto,) * 2)
