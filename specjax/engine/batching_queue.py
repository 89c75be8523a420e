"""The queue of a continuous-batching call (`specjax.engine.batching`): its inputs checked
on the host (numpy only, before any work, one-line errors naming the field) and the shapes
fixed for the whole call (prompt widths, token buffer, cache capacities); the host's
mirrors of the B rows (`Rows`) and each prompt's tally (`Tally`)."""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import numpy as np

from specjax.engine.decode import consume_width
from specjax.engine.generate import (
    CallShapes,
    check_drafters,
    check_slots,
    check_vocab_maps,
    drafter_capacity,
    verifier_capacity,
)
from specjax.engine.spec import EngineConfig
from specjax.errors import ConfigError

__all__ = ["Queue", "Rows", "Tally", "check_queue", "positive_int", "pad_rows"]

# ----------------------------------------------------------------------------------------
# Validation
# ----------------------------------------------------------------------------------------


def positive_int(field: str, value, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ConfigError(f"{field}: got {value!r}; allowed: an integer ≥ 1 ({what})")
    return int(value)


def _budgets(max_new_tokens, n: int) -> np.ndarray:
    if isinstance(max_new_tokens, (int, np.integer)) and not isinstance(max_new_tokens, bool):
        positive_int("max_new_tokens", max_new_tokens, "new tokens per prompt")
        return np.full((n,), int(max_new_tokens), np.int64)
    values = list(max_new_tokens)
    if len(values) != n:
        raise ConfigError(
            f"max_new_tokens: got {len(values)} budgets for {n} prompts; "
            "allowed: one integer, or one per prompt"
        )
    for i, v in enumerate(values):
        positive_int(f"max_new_tokens[{i}]", v, "new tokens for that prompt")
    return np.asarray(values, np.int64)


def _lengths(field: str, prompts, n: int) -> np.ndarray:
    if len(prompts) != n:
        raise ConfigError(f"{field}: got {len(prompts)} prompts; allowed: one per prompt ({n})")
    lens = np.array([len(p) for p in prompts], np.int64)
    if (lens < 1).any():
        i = int(np.argmin(lens))
        raise ConfigError(f"{field}[{i}]: got an empty prompt; allowed: ≥ 1 token")
    return lens


def _fits(field: str, model: str, lens, extra, max_len: int, what: str) -> None:
    """Every prompt's length + `extra` (its budget and a block) within `max_len`."""
    need = lens + extra
    if (need > max_len).any():
        i = int(np.argmax(need > max_len))
        raise ConfigError(
            f"{field}[{i}]: got {int(lens[i])} tokens, needing {int(need[i])} "
            f"positions with {what}; allowed: ≤ {model} max_len = {max_len}"
        )


def _width(lens, bucket: int, max_len: int) -> int:
    """Padded prompt width: the longest, rounded up to `bucket`, within the context."""
    longest = int(lens.max())
    return max(longest, min(-(-longest // bucket) * bucket, max_len))


def pad_rows(prompts, ids, width: int, rows: int) -> tuple[np.ndarray, np.ndarray]:
    """Prompts `ids` right-padded into (i32[rows, width], i32[rows]); spare rows hold a
    one-token dummy prompt."""
    arr = np.zeros((rows, width), np.int32)
    lens = np.ones((rows,), np.int32)
    for j, i in enumerate(ids):
        p = prompts[i]
        arr[j, : len(p)] = p
        lens[j] = len(p)
    return arr, lens


# ----------------------------------------------------------------------------------------
# The call's checked inputs and its fixed shapes
# ----------------------------------------------------------------------------------------


@dataclasses.dataclass
class Queue:
    """A call's checked inputs (N prompts, K drafters; K = 0 for the verifier alone) and
    the shapes fixed for the whole call.

    `plens` / `budgets` i32[N]: prompt lengths and budgets; `windows`: each drafter's γ_k
    (`gamma` their max, 0 alone); `slots` i32[N, S] (None alone); `width` / `d_widths`:
    the padded prompt widths of the verifier and of each drafter; `shapes`: the token
    buffer and cache capacities."""

    prompts: Sequence[Sequence[int]]
    plens: np.ndarray
    budgets: np.ndarray
    row_keys: np.ndarray
    stop_table: np.ndarray
    batch: int
    chunk: int
    spec: bool
    drafters: tuple
    d_data: tuple
    drafter_prompts: Any
    slots: Any
    windows: list
    gamma: int
    width: int = 0
    d_widths: list = dataclasses.field(default_factory=list)
    shapes: CallShapes | None = None

    @property
    def n(self) -> int:
        return len(self.prompts)


def check_queue(
    cfg: EngineConfig,
    verifier,
    prompts,
    row_keys,
    *,
    batch,
    chunk,
    max_new_tokens,
    drafters,
    d_data,
    drafter_prompts,
    slots,
    stop_table,
    bucket,
) -> Queue:
    """`continuous_generate`'s inputs checked (host, numpy only, before any work), with the
    call's fixed shapes."""
    batch = positive_int("batch", batch, "rows served at once")
    chunk = positive_int("chunk", chunk, "rounds per row per chunk")
    bucket = positive_int("bucket", bucket, "prompt widths are rounded up to a multiple")
    n = len(prompts)
    if n < 1:
        raise ConfigError("prompts: got an empty queue; allowed: ≥ 1 prompt")
    plens = _lengths("prompts", prompts, n)
    budgets = _budgets(cfg.max_new_tokens if max_new_tokens is None else max_new_tokens, n)
    row_keys = np.asarray(row_keys)
    if row_keys.ndim < 1 or row_keys.shape[0] != n:
        raise ConfigError(
            f"row_keys: got shape {row_keys.shape}; allowed: one key per prompt ({n} rows)"
        )
    if stop_table is None:
        stop_table = np.zeros((verifier.vocab_size,), bool)
    stop_table = np.asarray(stop_table, bool)
    if stop_table.shape != (verifier.vocab_size,):
        raise ConfigError(
            f"stop_table: got shape {stop_table.shape}; allowed: "
            f"({verifier.vocab_size},), one flag per verifier token"
        )
    q = Queue(
        prompts=prompts,
        plens=plens,
        budgets=budgets,
        row_keys=row_keys,
        stop_table=stop_table,
        batch=batch,
        chunk=chunk,
        spec=drafters is not None,
        drafters=tuple(drafters or ()),
        d_data=(),
        drafter_prompts=drafter_prompts,
        slots=None,
        windows=[],
        gamma=0,
    )
    d_lens = _check_drafters(cfg, q, d_data, slots) if q.spec else []
    block = cfg.n_slots * q.gamma if q.spec else 1
    _fits(
        "prompts",
        "the verifier's",
        plens,
        budgets + block,
        verifier.max_len,
        f"its max_new_tokens and a block of {block}",
    )
    _set_shapes(cfg, verifier, q, d_lens, bucket)
    return q


def _check_drafters(cfg: EngineConfig, q: Queue, d_data, slots) -> list[np.ndarray]:
    """A speculative call's drafters, their arrays, slots and prompts checked and stored
    in `q`; returns each drafter's prompt lengths (i64[N])."""
    k, n = len(q.drafters), q.n
    if k < 1:
        raise ConfigError(
            "drafters: got none; allowed: ≥ 1 drafter, or None for the verifier alone"
        )
    q.d_data = tuple(d_data or ())
    q.windows = check_drafters(cfg, q.drafters)
    if len(q.d_data) != k:
        raise ConfigError(f"d_data: got {len(q.d_data)} entries; allowed: one per drafter ({k})")
    q.gamma = max(q.windows)
    q.slots = check_slots(cfg, slots, n, k)
    if q.drafter_prompts is None or len(q.drafter_prompts) != k:
        raise ConfigError(f"drafter_prompts: need {k} lists of {n} prompts (one per drafter)")
    check_vocab_maps(q.drafters, q.d_data)
    d_lens = [_lengths(f"drafter_prompts[{i}]", dp, n) for i, dp in enumerate(q.drafter_prompts)]
    for i, (d, data, lens, g) in enumerate(zip(q.drafters, q.d_data, d_lens, q.windows)):
        m = int(data.retok.shape[1])
        _fits(
            f"drafter_prompts[{i}]",
            f"drafter {d.name!r}",
            lens,
            consume_width(m, g + 1) + g,
            d.lm.max_len,
            "one consume block",
        )
    return d_lens


def _set_shapes(cfg: EngineConfig, verifier, q: Queue, d_lens, bucket: int) -> None:
    """The shapes fixed for the whole call: prompt widths, token buffer, cache capacities
    (from the longest prompt and the largest budget)."""
    q.width = _width(q.plens, bucket, verifier.max_len)
    block = q.gamma + 1 if q.spec else 1
    buf_len = q.width + int(q.budgets.max()) + block
    v_cap = verifier_capacity(verifier, buf_len, q.gamma, cfg.n_slots if q.spec else 1)
    q.d_widths = [_width(lens, bucket, d.lm.max_len) for d, lens in zip(q.drafters, d_lens)]
    d_caps = tuple(
        drafter_capacity(d.lm, int(data.retok.shape[1]), w, q.width, buf_len, g)
        for d, data, w, g in zip(q.drafters, q.d_data, q.d_widths, q.windows)
    )
    q.shapes = CallShapes(buf_len=buf_len, v_cap=v_cap, d_caps=d_caps)


# ----------------------------------------------------------------------------------------
# Host mirrors of the rows and the per-prompt tally
# ----------------------------------------------------------------------------------------


@dataclasses.dataclass
class Rows:
    """Host mirrors of the B rows: which prompt each serves (-1: idle), where its prompt
    ends (`start`), its length, its key and its slots."""

    prompt: np.ndarray
    start: np.ndarray
    length: np.ndarray
    keys: np.ndarray
    slots: np.ndarray

    @classmethod
    def idle(cls, q: Queue) -> "Rows":
        """B idle rows (keys and slots those of the first prompt, as placeholders)."""
        keys = np.zeros((q.batch,) + q.row_keys.shape[1:], q.row_keys.dtype)
        keys[:] = q.row_keys[0]
        slots = np.tile(q.slots[0], (q.batch, 1)) if q.spec else np.zeros((q.batch, 1), np.int32)
        return cls(
            prompt=np.full((q.batch,), -1, np.int64),
            start=np.ones((q.batch,), np.int64),
            length=np.ones((q.batch,), np.int64),
            keys=keys,
            slots=slots,
        )

    def assign(self, q: Queue, rows, ids) -> None:
        """Rows `rows` now serve prompts `ids` (just prefilled)."""
        self.prompt[rows] = ids
        self.start[rows] = q.plens[ids]
        self.length[rows] = q.plens[ids]
        self.keys[rows] = q.row_keys[ids]
        if q.spec:
            self.slots[rows] = q.slots[ids]

    def budget_left(self, q: Queue, live) -> np.ndarray:
        """i32[B] tokens each live row may still commit (0 for an idle row)."""
        left = np.where(live, q.budgets[np.maximum(self.prompt, 0)] - (self.length - self.start), 0)
        return left.astype(np.int32)


@dataclasses.dataclass
class Tally:
    """Per prompt, its tokens once finished and its counters summed over chunks; per
    call, programs run and their seconds."""

    out: list
    rounds: np.ndarray
    from_draft: np.ndarray
    proposed: np.ndarray
    accepted: np.ndarray
    seconds: float = 0.0
    refill_seconds: float = 0.0
    chunks: int = 0
    refills: int = 0

    @classmethod
    def zeros(cls, n: int, k: int) -> "Tally":
        return cls(
            out=[None] * n,
            rounds=np.zeros((n,), np.int64),
            from_draft=np.zeros((n,), np.int64),
            proposed=np.zeros((n, k), np.int64),
            accepted=np.zeros((n, k), np.int64),
        )
