"""The memory layouts a deployment's weights are served in: one set, chosen by the compiler.

On a TPU an array's layout (which dimension is minor, how it is tiled) is part of a
compiled program's signature. Compiled with the device's default layouts, the speculative
generate of Llama-3.1-70B on a v5p-8 relaid ~600 weight arrays of ≥ 1 MiB per call (its
attention and MLP matrices, in the layout its products read them), once each call, before
its loop. Compiled with the layouts the compiler chooses (`Layout.AUTO`) it relays none —
but then each program would choose its own, and weights placed once can be in one layout
only. So a deployment is served in one set: the one the compiler chooses for a reference
program — the speculative generate over every drafter with weights (the program a serving
deployment runs most) — and every other program (decode step, scores, plan calls, the
autoregressive baseline, other rules and drafter sets) is compiled for weights already in
that set. Where a program would rather read a weight another way it relays it, and the
planner's count of relayout copies says so.

The set is saved as JSON (one entry per weight array: its major-to-minor order, tiling and
sub-byte size), so that the planner's child processes share it; a loader places the
weights once in these formats (``jax.device_put(x, Format(layout, sharding))``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jax
from jax.experimental.layout import Format, Layout

from specjax.atomic import atomic_write_text

__all__ = ['apply', 'auto', 'chosen', 'load', 'save']


def _params_of(d_data) -> Any:
    return getattr(d_data, 'params', None)


def _auto_in_shardings(args: tuple) -> tuple:
    """A call's in_shardings: `Layout.AUTO` for the verifier's weights (``args[0]``) and
    every drafter's (``args[1][i].params``), the argument's own sharding elsewhere."""
    auto = lambda a: Format(Layout.AUTO, a.sharding)
    own = lambda a: a.sharding
    v = jax.tree.map(auto, args[0])
    ds = tuple(
        jax.tree.map(own, d).replace(params=jax.tree.map(auto, _params_of(d)))
        if _params_of(d) is not None
        else jax.tree.map(own, d)
        for d in args[1]
    )
    return (v, ds) + tuple(jax.tree.map(own, a) for a in args[2:])


def auto(fn, statics: dict, args: tuple):
    """``fn(*args, **statics)`` jitted with the weights' layouts left to the compiler
    (`Layout.AUTO`: the verifier's ``args[0]`` and each drafter's ``args[1][i].params``);
    every other argument keeps its sharding and the default layout."""
    return jax.jit(lambda *a: fn(*a, **statics), in_shardings=_auto_in_shardings(args))


def chosen(input_formats) -> tuple[list, list[list]]:
    """(the verifier's layouts, each drafter's) from a program compiled by `auto` (its
    ``input_formats``), as flat lists of `Layout` in `jax.tree.leaves` order."""
    v = [f.layout for f in jax.tree.leaves(input_formats[0])]
    ds = [
        [f.layout for f in jax.tree.leaves(_params_of(d))] if _params_of(d) is not None else []
        for d in input_formats[1]
    ]
    return v, ds


def _to_json(layout: Layout) -> dict:
    return {
        'major_to_minor': list(layout.major_to_minor),
        'tiling': [list(t) for t in layout.tiling],
        'sub_byte_element_size_in_bits': int(layout.sub_byte_element_size_in_bits),
    }


def _from_json(d: dict) -> Layout:
    return Layout(
        tuple(d['major_to_minor']),
        tuple(tuple(t) for t in d['tiling']),
        d['sub_byte_element_size_in_bits'],
    )


def save(path: Path, verifier: list, drafters: dict[str, list], about: dict) -> None:
    """Writes the set (``drafters``: by drafter name) and what it was chosen by."""
    doc = {
        'about': about,
        'verifier': [_to_json(x) for x in verifier],
        'drafters': {n: [_to_json(x) for x in ls] for n, ls in drafters.items()},
    }
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(Path(path), json.dumps(doc, indent=1) + "\n")


def load(path: Path) -> tuple[list, dict[str, list]]:
    """(the verifier's layouts, {drafter name: its layouts}) from `save`'s file."""
    doc = json.loads(Path(path).read_text(encoding='utf-8'))
    return (
        [_from_json(x) for x in doc['verifier']],
        {n: [_from_json(x) for x in ls] for n, ls in doc['drafters'].items()},
    )


def _placed(tree, layouts: list):
    leaves, treedef = jax.tree.flatten(tree)
    if len(leaves) != len(layouts):
        raise ValueError(f'served layouts: {len(layouts)} for {len(leaves)} weight arrays')
    return jax.tree.unflatten(
        treedef,
        [
            jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=Format(lay, a.sharding))
            for a, lay in zip(leaves, layouts)
        ],
    )


def apply(args: tuple, verifier: list, drafters: list[list | None]) -> tuple:
    """A call's abstract ``args`` with the verifier's weights (``args[0]``) and the
    drafters' (``args[1][i].params``, where ``drafters[i]`` is not None) in the served
    layouts; a call without drafter data (the autoregressive one) passes ``[]``."""
    out = [_placed(args[0], verifier)]
    if len(args) > 1 and isinstance(args[1], tuple) and drafters:
        out.append(
            tuple(
                d.replace(params=_placed(d.params, lay))
                if lay is not None and _params_of(d) is not None
                else d
                for d, lay in zip(args[1], drafters)
            )
        )
        out.extend(args[2:])
    else:
        out.extend(args[1:])
    return tuple(out)
