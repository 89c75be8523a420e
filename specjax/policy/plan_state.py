"""Plan state carried from one step to the next: a step costs its own tokens.

A plan's next step continues from where its committed step left the models: the verifier's
KV cache already holds the committed text, so it is never prefilled again, and each
drafter's cache holds the text up to where it last ran; a drafter behind the committed text
(it sat out a step, or its branch lost) consumes only the new verifier tokens, γ + 1 per
forward, at the start of its next call (`speculative_generate(state=...)`). Nothing is
decoded to text and re-encoded between steps: the verifier continues its own token
sequence, and drafters of another tokenizer read the new tokens through the retokenisation
table (SPEC §3.3), as inside a step.

`PlanStates` holds, for every plan of a run, the verifier's token buffer, length and cache
(rows = plans) and, once a drafter has run for a plan, that drafter's cache, logits and
synced length. Shapes are fixed for the run (token buffer and caches sized from the longest
prompt and every step's budget), so a run compiles a bounded set of programs: one prefill
per model, and per call shape one gather, one engine program and one commit.

Costs (SPEC §7): one verifier prefill per plan (its prompt), one drafter prefill per plan
and drafter at its first use, and one catch-up pass per γ + 1 committed tokens a drafter
missed (counted with the drafter prefills, priced c_i like them).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from specjax.engine.decode import consume_width
from specjax.engine.deployment import Deployment
from specjax.engine.features import feature_layout, pick_features
from specjax.engine.prefill import prefill
from specjax.engine.programs import run_program
from specjax.engine.state import EngineState
from specjax.errors import ConfigError
from specjax.measure.price_programs import register_state
from specjax.models.api import causal_block_mask, forward_rows

__all__ = ['PlanStates', 'CallState']


@dataclasses.dataclass
class _DrafterRows:
    cache: Any  # the drafter's cache, rows = plans
    logits: jax.Array  # f32[P, Vd] after its cached tokens
    synced: jax.Array  # i32[P] committed verifier tokens in its cache


jax.tree_util.register_dataclass(
    _DrafterRows, data_fields=["cache", "logits", "synced"], meta_fields=[]
)


@dataclasses.dataclass
class CallState:
    """What a call left behind: its `EngineState` (rows = the call's padded rows), the
    drafters of the call (indices into the deployment, in the state's order), the plan of
    each row, and each row's new verifier tokens."""

    state: EngineState
    drafters: tuple
    plans: list
    new_tokens: list
    dsynced: np.ndarray  # i32[K_call, R] on the host


def _take(x, idx):
    return jnp.take(x, idx, axis=0)


@jax.jit
def _gather(v: EngineState, ds: tuple, idx):
    take = functools.partial(_take, idx=idx)
    return EngineState(
        tokens=take(v.tokens),
        length=take(v.length),
        vcache=jax.tree.map(take, v.vcache),
        dcaches=tuple(jax.tree.map(take, d.cache) for d in ds),
        dsynced=(
            jnp.stack([take(d.synced) for d in ds])
            if ds
            else jnp.zeros((0, idx.shape[0]), jnp.int32)
        ),
        dlogits=tuple(take(d.logits) for d in ds),
    )


def _put(dst, src, dst_idx, src_idx):
    """dst rows dst_idx ← src rows src_idx; a dst index past the end is dropped."""
    return dst.at[dst_idx].set(jnp.take(src, src_idx, axis=0), mode="drop")


@jax.jit
def _commit(v: EngineState, ds: tuple, call: EngineState, v_dst, v_src, d_dst, d_src):
    put = lambda dst_i, src_i: lambda a, b: _put(a, b, dst_i, src_i)
    v = v.replace(
        tokens=put(v_dst, v_src)(v.tokens, call.tokens),
        length=put(v_dst, v_src)(v.length, call.length),
        vcache=jax.tree.map(put(v_dst, v_src), v.vcache, call.vcache),
    )
    out = []
    for k, d in enumerate(ds):
        f = put(d_dst[k], d_src[k])
        out.append(
            _DrafterRows(
                cache=jax.tree.map(f, d.cache, call.dcaches[k]),
                logits=f(d.logits, call.dlogits[k]),
                synced=f(d.synced, call.dsynced[k]),
            )
        )
    return v, tuple(out)


@jax.jit
def _put_drafter(d: _DrafterRows, cache, logits, synced, dst, src):
    f = lambda a, b: _put(a, b, dst, src)
    return _DrafterRows(
        cache=jax.tree.map(f, d.cache, cache),
        logits=f(d.logits, logits),
        synced=f(d.synced, synced),
    )


def _verifier_features(verifier, v_params, vcache, idx, tokens, lo, request, pick):
    """The verifier's features [B, W, F] (what a feature drafter reads, `pick` of
    `feature_layout`'s `request`) of tokens[b] at positions lo[b] + [0, W): a block over a
    copy of the carried cache's rows `idx` rolled back to lo[b] (its slots before lo[b]
    committed; the carried cache itself untouched)."""
    vc = jax.tree.map(lambda x: jnp.take(x, idx, axis=0), vcache).replace(length=lo)
    b, w = tokens.shape
    pos = lo[:, None] + jnp.arange(w)[None, :]
    at = jnp.zeros((b, 1), jnp.int32)  # the head on one row: only the states are read
    out = forward_rows(
        verifier, v_params, vc, tokens, pos, causal_block_mask(b, w), at, with_hidden=request
    )
    return pick_features(out[1], pick, request)


@functools.partial(jax.jit, static_argnames=("verifier", "lm", "request", "pick"))
def _fill_features(
    v_params, vcache, d: _DrafterRows, idx, dst, tokens, lo, n, *, verifier, lm, request, pick
):
    """Feature drafter rows ``dst`` ← the verifier's features of the committed tokens they
    have not read (tokens[b, :n[b]], at slots lo[b] + j): one verifier block over the
    carried cache (`_verifier_features`), written into the drafter's carried cache
    (``dst`` past the end: a padding row, dropped)."""
    feats = _verifier_features(verifier, v_params, vcache, idx, tokens, lo, request, pick)
    rows = jax.tree.map(lambda x: jnp.take(x, idx, axis=0), d.cache)
    rows = lm.write_features(rows, feats, lo, n)
    src = jnp.arange(idx.shape[0], dtype=jnp.int32)
    cache = jax.tree.map(lambda a, b: _put(a, b, dst, src), d.cache, rows)
    return dataclasses.replace(d, cache=cache)


@functools.partial(jax.jit, static_argnames=("request", "pick"))
def _pick_rows(hidden, idx, *, request, pick):
    """Rows ``idx`` of the verifier's prompt states, the slices a feature drafter reads."""
    return pick_features(jnp.take(hidden, idx, axis=0), pick, request)


@functools.partial(jax.jit, static_argnames=("verifier", "request", "pick"))
def _prompt_features(v_params, vcache, idx, tokens, *, verifier, request, pick):
    """`_verifier_features` of tokens from position 0 (a feature drafter's first use: the
    features its prompt's prefill writes first, as the engine's `prompt_state` does)."""
    # A runtime 0 (token ids are ≥ 0): a compile-time empty cache lets XLA constant-fold
    # the attention over every empty slot (tens of seconds of compilation per shape).
    lo = jnp.minimum(tokens[:, 0], 0).astype(jnp.int32)
    return _verifier_features(verifier, v_params, vcache, idx, tokens, lo, request, pick)


def _bucket(n: int, b: int) -> int:
    return -(-int(n) // int(b)) * int(b)


#: Row counts of a call: 1, 2, 4, then multiples of `ROW_STEP`.
ROW_STEP = 4


def padded_count(n: int) -> int:
    """The row count a call of `n` rows is padded to: a power of two up to `ROW_STEP`, then
    the next multiple of it (at most ROW_STEP − 1 padding rows: few programs, and a call's
    padding — charged in its wall clock — stays small whatever the count. Powers of two
    throughout cost one-call policies up to 78% extra rows, e.g. 36 branch rows in 64,
    against 0 for routed calls split into fours: a wall-clock artifact)."""
    n = max(int(n), 1)
    if n <= ROW_STEP:
        return 1 << (n - 1).bit_length()
    return -(-n // ROW_STEP) * ROW_STEP


def padded_rows(rows: Sequence[int]) -> list:
    """`rows` padded to `padded_count` entries by repeating its first entry."""
    return list(rows) + [rows[0]] * (padded_count(len(rows)) - len(rows))


class PlanStates:
    """Every plan's carried state (see the module docstring).

    Args:
      dep: the deployment.
      texts: each plan's text so far (its prompt, and on a resume the journaled steps):
        what a drafter's first prefill spells in its own tokens.
      histories: each plan's verifier tokens so far (the encoded prompt, and on a resume
        the journaled steps' own tokens).
      steps: steps left to run (sizes the token buffer and the caches).
      gamma / max_step_tokens / bucket: as in `PlanConfig`.

    Attributes:
      hist: host copies of each plan's verifier tokens (prompt + committed).
      seconds / priced: seconds and price keys (`specjax.measure.price_programs`) of the programs
        that prefilled, gathered and committed, not yet charged to a plan (`take_charges`).
    """

    def __init__(
        self,
        dep: Deployment,
        texts: Sequence[str],
        histories: Sequence[Sequence[int]],
        *,
        steps: int,
        gamma: int,
        max_step_tokens: int,
        bucket: int,
    ):
        self.dep = dep
        self.texts0 = list(texts)
        self.hist = [list(map(int, h)) for h in histories]
        self.hist0 = [list(h) for h in self.hist]  # a feature drafter's prompt: these ids
        self.gamma = int(gamma)
        p = len(self.hist)
        k = len(dep.drafters)
        n0 = np.array([len(h) for h in self.hist], np.int32)
        if (n0 < 1).any():
            raise ConfigError(f"prompt: plan {int(np.argmin(n0))} is empty; allowed: ≥ 1 token")
        self.width = _bucket(int(n0.max()), bucket)
        grow = int(steps) * int(max_step_tokens)
        self.buf_len = self.width + grow + self.gamma + 1
        need = self.width + grow + k * self.gamma
        if need > dep.verifier.max_len:
            raise ConfigError(
                f"verifier context: {steps} steps of ≤ {max_step_tokens} tokens "
                f"after a {self.width}-token prompt need {need} positions; "
                f"allowed: ≤ max_len = {dep.verifier.max_len} (fewer or shorter "
                "steps, or shorter prompts)"
            )
        self.v_cap = min(self.buf_len + (k - 1) * self.gamma, dep.verifier.max_len)
        # Feature drafters (`specjax.models.eagle`): the verifier states they read, those of
        # the prompts kept from the verifier's prefill (its first use of a plan reads them;
        # steps' come from `sync_features`), and the verifier blocks run for them not yet
        # charged (plan → blocks, `take_fills`).
        self._request, self._picks = feature_layout(dep.verifier, [d.lm for d in dep.drafters])
        self.fills: dict[int, int] = {}
        # Ragged prefill groups (if any) at the plan's bucket: few distinct programs.
        cache, _, secs, *hidden = prefill(
            dep.verifier,
            dep.v_params,
            self.hist,
            capacity=self.v_cap,
            width=self.width,
            cached=np.maximum(n0 - 1, 0),
            bucket=int(bucket),
            with_hidden=self._request,
        )
        self._prompt_hidden = hidden[0] if hidden else None  # [P, width, ·]
        tokens = np.zeros((p, self.buf_len), np.int32)
        for i, h in enumerate(self.hist):
            tokens[i, : len(h)] = h
        self.v = EngineState(
            tokens=jnp.asarray(tokens),
            length=jnp.asarray(n0),
            vcache=cache,
            dcaches=(),
            dsynced=jnp.zeros((0, p), jnp.int32),
            dlogits=(),
        )
        self.d: dict[int, _DrafterRows] = {}
        self.synced: dict[int, np.ndarray] = {}  # host copy; −1: not prefilled yet
        self.d_width: dict[int, int] = {}
        self._d_cap: dict[int, int] = {}
        self._n0 = n0
        self.seconds = secs
        self.priced: dict = {}
        self.bucket = int(bucket)
        self.steps = int(steps)
        self.max_step_tokens = int(max_step_tokens)
        # Every drafter's score read of the committed text (`policy.carried_scores`), made
        # by the plan runner when a router scores drafters teacher forced.
        self.score_reads = None

    @property
    def n_plans(self) -> int:
        return len(self.hist)

    def d_capacity(self, j: int) -> int:
        """Drafter j's cache capacity (its carried rows are allocated on first use)."""
        if j not in self._d_cap:
            self._allocate(j)
        return self._d_cap[j]

    def reads_features(self, j: int) -> bool:
        """Whether drafter j drafts from the verifier's features."""
        return self._picks[j] is not None

    def take_fills(self) -> dict[int, int]:
        """plan → the verifier blocks run for its feature drafters since the last take
        (`sync_features`; each priced like a verifier prefill in the modelled cost)."""
        out, self.fills = self.fills, {}
        return out

    def take_charges(self) -> tuple[float, dict]:
        """(seconds, price key → runs) of the state programs run since the last take: the
        caller charges them to the plans they ran for."""
        s, p = self.seconds, self.priced
        self.seconds, self.priced = 0.0, {}
        return s, p

    def _run(self, fn, args: tuple, statics: dict | None = None):
        """Runs a state program (`run_program`), its seconds and its price key pending."""
        statics = statics or {}
        key = register_state(fn, statics, args, self.n_plans, self.v_cap)
        out, secs = run_program(fn, statics, args)
        self.seconds += secs
        self.priced[key] = self.priced.get(key, 0) + 1
        return out

    # ------------------------------------------------------------------ drafters
    def ensure(self, js: Sequence[int], plans: Sequence[int]) -> dict[int, list[int]]:
        """Prefills drafters `js` for the `plans` that have not run them yet; returns
        drafter → the plans it was prefilled for (each a drafter prefill to charge)."""
        out = {}
        for j in js:
            if j not in self.d:
                self._allocate(j)
            need = [p for p in dict.fromkeys(plans) if self.synced[j][p] < 0]
            if not need:
                continue
            spec, data = self.dep.drafters[j], self.dep.d_data[j]
            rows = padded_rows(need)
            cap = self._d_cap[j]
            features = None
            if self.reads_features(j):
                # Its prompt in the verifier's ids, the verifier's features of it (from its
                # prefill) written first; those of later steps `sync_features` writes.
                prompts = [self.hist0[p] for p in rows]
                features = self.prompt_features(j, rows)
            else:
                enc = self.dep.drafter_encode[j]
                prompts = [enc(self.texts0[p]) for p in rows]
            cache, logits, secs = prefill(
                spec.lm,
                data.params,
                prompts,
                capacity=cap,
                width=self.d_width[j],
                bucket=self.bucket,
                features=features,
            )
            n_v = self._n0[np.asarray(rows)]
            dst = np.full((len(rows),), self.n_plans, np.int32)
            dst[: len(need)] = need
            self.d[j] = self._run(
                _put_drafter,
                (
                    self.d[j],
                    cache,
                    logits,
                    jnp.asarray(n_v),
                    jnp.asarray(dst),
                    jnp.arange(len(rows), dtype=jnp.int32),
                ),
            )
            self.seconds += secs
            self.synced[j][need] = self._n0[need]
            out[j] = need
        return out

    def prompt_features(self, j: int, rows: list) -> tuple:
        """(features [R, W, F], count i32[R]) drafter j reads before plans ``rows``' prompts
        (their first tokens: every prompt token but the last): the verifier's states kept
        from its prefill, gathered (a state program)."""
        n = np.maximum(self._n0[np.asarray(rows)] - 1, 0).astype(np.int32)
        feats = self._run(
            _pick_rows,
            (self._prompt_hidden, jnp.asarray(rows, jnp.int32)),
            dict(request=self._request, pick=self._picks[j]),
        )
        return feats, jnp.asarray(n)

    def _prompt_features(self, j: int, rows: list) -> tuple:
        """(features [R, W, F], count i32[R]) of the verifier over plans ``rows``' committed
        tokens but the last, from position 0 (W a multiple of the run's bucket): a verifier
        block over the whole text (where steps were committed before a first use that
        cannot catch up on them, `ScoreReads`)."""
        n = np.array([len(self.hist[p]) - 1 for p in rows], np.int32)
        w = min(_bucket(max(int(n.max()), 1), self.bucket), self.v_cap)
        tokens = np.zeros((len(rows), w), np.int32)
        for r, p in enumerate(rows):
            tokens[r, : n[r]] = self.hist[p][: n[r]]
        feats = self._run(
            _prompt_features,
            (self.dep.v_params, self.v.vcache, jnp.asarray(rows, jnp.int32), jnp.asarray(tokens)),
            dict(verifier=self.dep.verifier, request=self._request, pick=self._picks[j]),
        )
        return feats, jnp.asarray(n)

    def sync_features(self, js: Sequence[int], plans: Sequence[int]) -> None:
        """Writes into feature drafters ``js``' carried caches the verifier's features of
        the committed tokens they have not read for ``plans`` (steps they sat out or whose
        branch lost): one verifier block over the missed tokens from the carried cache per
        drafter, before a call that catches them up (`engine.checks.check_state_features`)."""
        for j in js:
            if not self.reads_features(j) or j not in self.d:
                continue
            vlen = np.asarray(self.d[j].cache.vlen)
            need = [
                p
                for p in dict.fromkeys(plans)
                if self.synced[j][p] >= 0 and vlen[p] < len(self.hist[p]) - 1
            ]
            if not need:
                continue
            rows = padded_rows(need)
            lo = np.array([vlen[p] for p in rows], np.int32)
            n = np.array([len(self.hist[p]) - 1 - vlen[p] for p in rows], np.int32)
            n[len(need) :] = 0  # padding rows write nothing
            w = _bucket(int(n.max()), 8)
            tokens = np.zeros((len(rows), w), np.int32)
            for r, p in enumerate(need):
                tokens[r, : n[r]] = self.hist[p][lo[r] : lo[r] + n[r]]
            dst = np.full((len(rows),), self.n_plans, np.int32)
            dst[: len(need)] = need
            self.d[j] = self._run(
                _fill_features,
                (
                    self.dep.v_params,
                    self.v.vcache,
                    self.d[j],
                    jnp.asarray(rows, jnp.int32),
                    jnp.asarray(dst),
                    jnp.asarray(tokens),
                    jnp.asarray(lo),
                    jnp.asarray(n),
                ),
                dict(
                    verifier=self.dep.verifier,
                    lm=self.dep.drafters[j].lm,
                    request=self._request,
                    pick=self._picks[j],
                ),
            )
            for p in need:
                self.fills[p] = self.fills.get(p, 0) + 1

    def _allocate(self, j: int) -> None:
        spec, data = self.dep.drafters[j], self.dep.d_data[j]
        enc = self.dep.drafter_encode[j]
        if self.reads_features(j):  # its prompt: the verifier's ids (positions align)
            lens = [len(h) for h in self.hist0]
        else:
            lens = [len(enc(t)) for t in self.texts0]
        self.d_width[j] = _bucket(max(lens), self.bucket)
        m = int(data.retok.shape[1])
        need = self.d_width[j] + consume_width(m, self.gamma + 1) + self.gamma
        if need > spec.lm.max_len:
            raise ConfigError(
                f"drafter {spec.name!r} context: its prompts need {need} "
                f"positions; allowed: ≤ max_len = {spec.lm.max_len}"
            )
        # Its prompt, ≤ m pieces of every verifier token the run commits, its kept drafts.
        cap = int(
            min(spec.lm.max_len, self.d_width[j] + (self.buf_len - self.width) * m + self.gamma)
        )
        self._d_cap[j] = cap
        p = self.n_plans
        cache = spec.lm.init_cache(p, cap)
        self.d[j] = _DrafterRows(
            cache=cache,
            logits=jnp.zeros((p, spec.lm.vocab_size), jnp.float32),
            synced=jnp.zeros((p,), jnp.int32),
        )
        self.synced[j] = np.full((p,), -1, np.int64)

    # ------------------------------------------------------------------ calls
    def gather(self, plans: Sequence[int], js: Sequence[int]) -> EngineState:
        """The state of rows `plans` (one per row) with drafters `js`, for one call."""
        return self._run(
            _gather, (self.v, tuple(self.d[j] for j in js), jnp.asarray(plans, jnp.int32))
        )

    def commit(self, call: CallState, v_rows: dict[int, int], d_rows: dict[tuple, int]) -> None:
        """Plan p's verifier ← call row v_rows[p]; plan p's drafter j ← row d_rows[(p, j)]."""
        p_n = self.n_plans
        v_dst = np.full((p_n,), p_n, np.int32)
        v_src = np.zeros((p_n,), np.int32)
        for i, (p, r) in enumerate(v_rows.items()):
            v_dst[i], v_src[i] = p, r
        d_dst = np.full((len(call.drafters), p_n), p_n, np.int32)
        d_src = np.zeros((len(call.drafters), p_n), np.int32)
        fill = [0] * len(call.drafters)
        for (p, j), r in d_rows.items():
            k = call.drafters.index(j)
            d_dst[k, fill[k]], d_src[k, fill[k]] = p, r
            fill[k] += 1
            self.synced[j][p] = int(call.dsynced[k, r])
        if not v_rows and not d_rows:
            return
        v, ds = self._run(
            _commit,
            (
                self.v,
                tuple(self.d[j] for j in call.drafters),
                call.state,
                jnp.asarray(v_dst),
                jnp.asarray(v_src),
                jnp.asarray(d_dst),
                jnp.asarray(d_src),
            ),
        )
        self.v = v
        for j, d in zip(call.drafters, ds):
            self.d[j] = d
        for p, r in v_rows.items():
            self.hist[p] = self.hist[p] + list(call.new_tokens[r])

    def commit_verifier(
        self, state: EngineState, plans: Sequence[int], new_tokens: dict[int, list]
    ) -> None:
        """After a verifier-only call over every plan's row (inactive rows unchanged)."""
        self.v = state
        for p in plans:
            self.hist[p] = self.hist[p] + list(new_tokens[p])
