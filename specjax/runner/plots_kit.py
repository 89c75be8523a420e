"""The kit the report's figures (`specjax.runner.plots`) are drawn with: a grid of panels,
saving a figure as PNG (atomically, or into a binary file object), colours and legend
handles, and the per-row values the figures group by (a row's policy label, each drafter's
α, a metric's mean and sd per policy).
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any, Sequence

from specjax.policy import names as policy_names
from specjax.runner.rows import Row, is_number, numbers, sd


def _figure(n: int, width: float, height: float, sharey: bool = False, max_cols: int = 0):
    """n panels of width × height, in rows of at most `max_cols` (0 = one row)."""
    from matplotlib.figure import Figure  # pylint: disable=import-outside-toplevel

    cols = min(n, max_cols) if max_cols else n
    nrows = -(-n // cols)
    fig = Figure(figsize=(width * cols, height * nrows), dpi=110, layout="constrained")
    grid = fig.subplots(nrows, cols, sharey=sharey, squeeze=False)
    axs = [ax for row in grid for ax in row]
    for ax in axs[n:]:
        ax.set_visible(False)
    return fig, axs[:n]


def _save(fig, path) -> bool:
    """Draws `fig` as PNG into `path`: a file path (atomically) or a binary file object;
    False (nothing written) when there is no figure."""
    if fig is None:
        return False
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # pylint: disable=import-outside-toplevel

    FigureCanvasAgg(fig)
    if hasattr(path, "write"):
        fig.savefig(path, format="png")
        return True
    import io  # pylint: disable=import-outside-toplevel

    from specjax.runner.results import atomic_write_bytes  # pylint: disable=import-outside-toplevel

    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    atomic_write_bytes(Path(path), buf.getvalue())
    return True


def _colors(keys: Sequence[str]) -> dict[str, Any]:
    from matplotlib import colormaps  # pylint: disable=import-outside-toplevel

    cmap = colormaps["tab10"]
    return {k: cmap(i % 10) for i, k in enumerate(keys)}


def _handle(ax, marker: str, color: Any, text: str):
    del ax
    from matplotlib.lines import Line2D  # pylint: disable=import-outside-toplevel

    return Line2D(
        [],
        [],
        marker=marker,
        linestyle="",
        markerfacecolor=color,
        markeredgecolor="black",
        markersize=7,
        label=text,
    )


def _dedup_legend(ax, order: Sequence[str] = (), **kwargs) -> None:
    handles, labels = ax.get_legend_handles_labels()
    seen = {}
    for h, l in zip(handles, labels):
        seen.setdefault(l, h)
    rank = {l: i for i, l in enumerate(order)}
    names = sorted(seen, key=lambda l: rank.get(l, len(rank)))
    if names:
        ax.legend([seen[l] for l in names], names, **kwargs)


def _line(color: Any, style: str, text: str):
    from matplotlib.lines import Line2D  # pylint: disable=import-outside-toplevel

    return Line2D([], [], color=color, linestyle=style, linewidth=1.5, label=text)


def _patch(color: Any, alpha: float, text: str):
    from matplotlib.patches import Patch  # pylint: disable=import-outside-toplevel

    return Patch(facecolor=color, alpha=alpha * 2, edgecolor="none", label=text)


def _policy(r: Row) -> str:
    """The row's policy as tables and plots show it (`specjax.policy.names.label`)."""
    return policy_names.label(r.get("policy"))


def _acceptance(r: Row) -> dict[str, float]:
    """Each drafter's α per position (its chain tested alone), else accepted / proposed."""
    a = r.get("per_drafter_alpha") or r.get("acceptance")
    if isinstance(a, dict):
        return {str(k): v for k, v in a.items() if is_number(v)}
    if is_number(a):
        return {"drafter": a}
    return {}


def _per_group(rows: Sequence[Row], groups: Sequence[str], key: str):
    means, sds = [], []
    for g in groups:
        vals = numbers(r.get(key) for r in rows if _policy(r) == g)
        means.append(statistics.fmean(vals) if vals else math.nan)
        sds.append(sd(vals))
    return means, sds
