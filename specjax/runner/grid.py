"""Sweep grids: the cartesian product of the axes a config declares in ``config.grid``.

    config.grid = ml_collections.ConfigDict()
    config.grid.gamma = [2, 4, 8]                       # axis name -> list of values
    config.grid.pairing = [("code", "prose"), ("code", "prose", "reasoning")]
    config.grid.policy = ["naive", "all_on"]            # names or switch dicts
    config.grid.seed = [0, 1]

`expand_grid` returns one dict per cell, in a deterministic order: the axes vary in the
order they are declared, the last one fastest (``itertools.product``). Values are given to
experiments in their JSON form (tuples become lists, ConfigDicts dicts), so that what an
experiment sees is exactly what the results file records.

Each cell carries a ``cell_id``: the first 12 hex digits of the SHA-256 of the cell's
canonical JSON (sorted keys, no whitespace, integral floats written as integers so that
``1.0`` and ``1`` name the same cell). The id depends only on the cell's values — not on
its position or on the other axes — so a grid can be extended (another seed, another γ)
and resumed in the same workdir: the cells already run keep their ids and are skipped.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
from typing import Any

import ml_collections

from specjax.errors import ConfigError

__all__ = [
    "RESERVED_AXES",
    "MAX_CELLS",
    "grid_axes",
    "expand_grid",
    "cell_id",
    "cell_params",
    "split_rows",
    "to_jsonable",
    "canonical_json",
]

# Keys the runner adds to every cell / result row; an axis may not use them.
RESERVED_AXES = ("cell_id", "cell", "wall_time_s", "finished_at", "process_index")
# The most cells one grid may have (the product of its axes' lengths): a sweep is a list
# the runner walks, so the bound is checked before any cell is built.
MAX_CELLS = 10_000


def grid_axes(config: ml_collections.ConfigDict) -> dict[str, list]:
    """``config.grid`` as ``{axis: [values...]}`` in declaration order, validated.

    Raises:
      ConfigError: no grid, an empty grid, an axis that is not a non-empty list, a reserved
        axis name, a value that is not JSON-serialisable (or NaN), or a repeated value.
    """
    grid = config.get("grid") if hasattr(config, "get") else None
    if grid is None:
        raise ConfigError.invalid(
            "grid",
            None,
            "a ConfigDict of axis name -> non-empty list "
            "of values (e.g. config.grid.gamma = [2, 4])",
        )
    if isinstance(grid, ml_collections.ConfigDict):
        try:
            # to_json keeps declaration order (ConfigDict iteration is sorted).
            axes = json.loads(grid.to_json())
        except (TypeError, ValueError) as e:
            raise ConfigError.invalid(
                "grid", _brief(grid), f"JSON-serialisable values ({e})"
            ) from e
    elif isinstance(grid, dict):
        try:
            axes = {str(k): to_jsonable(v, f"grid.{k}") for k, v in grid.items()}
        except TypeError as e:
            raise ConfigError.invalid("grid", grid, f"JSON-serialisable values ({e})") from e
    else:
        raise ConfigError.invalid("grid", grid, "a ConfigDict of axis name -> non-empty list")
    if not axes:
        raise ConfigError.invalid("grid", {}, "at least one axis with at least one value")
    for name, values in axes.items():
        field = f"grid.{name}"
        if name in RESERVED_AXES:
            raise ConfigError.invalid(
                "grid", name, f"an axis name other than the reserved {', '.join(RESERVED_AXES)}"
            )
        if not isinstance(values, list):
            raise ConfigError.invalid(field, values, "a list of values (write [x] for one value)")
        if not values:
            raise ConfigError.invalid(field, values, "a non-empty list of values")
        seen: dict[str, Any] = {}
        for v in values:
            key = canonical_json(v, field)
            if key in seen:
                raise ConfigError.invalid(
                    field, values, f"distinct values ({v!r} repeats {seen[key]!r})"
                )
            seen[key] = v
    n = math.prod(len(v) for v in axes.values())
    if n > MAX_CELLS:
        raise ConfigError.invalid(
            "grid",
            {k: f"{len(v)} values" for k, v in axes.items()},
            f"at most {MAX_CELLS} cells (the product of the axes' lengths; this grid has {n})",
        )
    return axes


def expand_grid(config: ml_collections.ConfigDict) -> list[dict]:
    """Every cell of ``config.grid``: ``{"cell_id": ..., axis: value, ...}``, in order."""
    axes = grid_axes(config)
    names = list(axes)
    cells = []
    for values in itertools.product(*(axes[n] for n in names)):
        params = dict(zip(names, values))
        cells.append({"cell_id": cell_id(params), **params})
    return cells


def cell_params(cell: dict) -> dict:
    """The cell without the runner's own keys (what `cell_id` hashes)."""
    return {k: v for k, v in cell.items() if k not in RESERVED_AXES}


def split_rows(rows: list[dict], cells: list[dict]) -> tuple[list[dict], list[tuple[dict, str]]]:
    """(the rows of `cells`, [(row, why it is not) ...] for every other row).

    A row belongs to the grid when its ``cell_id`` is one of the cells' and its recorded
    ``cell`` (when it has one) is that cell's values. Other rows — an earlier grid's cells
    after the grid shrank, a row copied from another run, a hand-edited row — stay in the
    journal but are no cell of this grid: they are reported, never counted.
    """
    params = {c["cell_id"]: cell_params(c) for c in cells}
    inside, outside = [], []
    for r in rows:
        cid = r.get("cell_id") if isinstance(r, dict) else None
        if cid not in params:
            why = (
                "it has no cell_id" if cid is None else f"cell_id {cid!r} is not a cell of the grid"
            )
            outside.append((r, why))
            continue
        if "cell" in r and not _same(r["cell"], params[cid]):
            outside.append(
                (
                    r,
                    f"its cell {_brief_value(r['cell'])} is not the values of "
                    f"cell {cid} {_brief_value(params[cid])}",
                )
            )
            continue
        inside.append(r)
    return inside, outside


def _same(a: Any, b: Any) -> bool:
    try:
        return canonical_json(a) == canonical_json(b)
    except (TypeError, ValueError):
        return False


def _brief_value(value: Any, limit: int = 60) -> str:
    text = json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def cell_id(params: dict) -> str:
    """Stable id of a cell: 12 hex digits of SHA-256 of its canonical JSON."""
    return hashlib.sha256(canonical_json(cell_params(params)).encode()).hexdigest()[:12]


def canonical_json(obj: Any, field: str = "grid") -> str:
    """Sorted-key, compact JSON with integral floats as integers; NaN/inf not allowed."""
    return json.dumps(
        _canonical(to_jsonable(obj, field), field),
        sort_keys=True,
        separators=(",", ":"),
        allow_nan=False,
    )


def to_jsonable(obj: Any, field: str = "value") -> Any:
    """Tuples -> lists, ConfigDicts -> dicts, numpy/JAX scalars and arrays -> Python.

    Raises:
      TypeError: something that has no JSON form (the message names `field`).
    """
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v, field) for v in obj]
    if isinstance(obj, ml_collections.ConfigDict):
        return {str(k): to_jsonable(v, f"{field}.{k}") for k, v in obj.items()}
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v, f"{field}.{k}") for k, v in obj.items()}
    if hasattr(obj, "__array__") or hasattr(obj, "item"):
        import numpy as np  # numpy/JAX values returned by experiments

        return to_jsonable(np.asarray(obj).tolist(), field)
    raise TypeError(f"{field}: {type(obj).__name__} {obj!r} is not JSON-serialisable")


def _canonical(obj: Any, field: str) -> Any:
    if isinstance(obj, float):
        if not math.isfinite(obj):
            raise ConfigError.invalid(field, obj, "finite numbers")
        return int(obj) if obj.is_integer() else obj
    if isinstance(obj, list):
        return [_canonical(v, field) for v in obj]
    if isinstance(obj, dict):
        return {k: _canonical(v, field) for k, v in obj.items()}
    return obj


def _brief(grid: ml_collections.ConfigDict) -> dict:
    return {k: type(v).__name__ for k, v in grid.items()}
