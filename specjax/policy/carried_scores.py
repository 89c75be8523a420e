"""Teacher-forced scores from every drafter's own carried read of the committed text.

`auto:teacher_forced` scores every candidate drafter after each step on the text the
verifier committed (`AutoRouter.observe_scores`): α̂_i = Σ_t Σ_x min(p_t, q_i,t) over the
positions that predicted the step's new tokens. The verifier's p there is one block from
its carried cache (`policy.scores._window_pass`). This module gives each drafter the same
treatment: a *score read* per drafter and plan — a cache of its own, read like the engine's
(the prompt in the drafter's own tokenizer at first use, then each committed verifier
token's re-spelling, `DrafterData.retok`) — advances over the step's new tokens only, so a
step's scoring costs every drafter a forward over the step's pieces, not over the whole
text again (`policy.scores.teacher_forced`, which re-reads every row from its start, stays
the reference). A feature drafter (`specjax.models.eagle`) reads the verifier's ids, and the
verifier's features of the step's tokens come with its block (`verifier_window`'s hidden
states), written into its read before the step's tokens are fed, as the engine does; its
prompt's, at first use, those kept from the verifier's prefill (`PlanStates.prompt_features`;
a verifier block over the committed text where the step's block does not reach back to the
prompt, `PlanStates._prompt_features`).

Its q is the engine's: a drafter that runs next step starts from the same context it is
scored in (the read is not shared with the engine's carried rows, `PlanStates.d`, whose
caches may hold drafts past the committed text). For a drafter of the verifier's tokenizer
the read equals the whole-text re-spelling; for another tokenizer the prompt is its own
encoding, as in the loop.

Cost: the first use per drafter and plan is a prefill of the prompt (priced as that
forward); each step one program per drafter — gather the plans' rows, read the new pieces,
score against p, put the rows back — priced as the ``state`` program it is (its template
registered and re-timed by `specjax.measure.price_programs`), so the predicted seconds
contain the scoring. Memory: one more cache per drafter and plan.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from specjax.engine.drafting import draw
from specjax.engine.features import pick_features
from specjax.engine.prefill import prefill
from specjax.engine.programs import run_program
from specjax.measure.price_programs import register_state
from specjax.metrics import price_key
from specjax.models.api import causal_block_mask, forward_rows
from specjax.policy.plan_state import _DrafterRows, _put_drafter, padded_rows
from specjax.verify.qlaw import q_dense

__all__ = ["ScoreReads", "READ_BUCKET"]

#: Token columns and pieces of a read are padded to a multiple of this: few programs.
READ_BUCKET = 8


def _up(n: int, b: int = READ_BUCKET) -> int:
    return max(b, -(-int(n) // b) * b)


def _read_score(
    rows,
    data,
    idx,
    dst,
    ids,
    npieces,
    ends,
    last,
    v_law,
    vcol,
    want,
    feats=None,
    *,
    spec,
    v_vocab,
):
    """One drafter's score read over the rows ``idx`` of its plans: reads ``ids`` (each
    row's ``npieces`` new pieces) after its cached text, takes its law after each new
    token's last piece (``ends``) and before the first (the stored logits), scores Σ_x
    min(p, q) against the verifier's law p at the same positions (``vcol``: the column of
    ``v_law`` for each law; ``want``: the positions scored), and puts the advanced rows
    back at ``dst`` (past the end: a padded row, dropped). ``feats`` (a feature drafter):
    (the verifier's features [B, W, F], their first position i32[B], count i32[B]) written
    into its read first. Returns (α f32[B], rows)."""
    take = lambda x: jnp.take(x, idx, axis=0)  # noqa: E731
    cache = jax.tree.map(take, rows.cache)
    if feats is not None:
        cache = spec.lm.write_features(cache, *feats)
    prev = take(rows.logits)  # [B, Vd]: the law before the first new token
    b, wp = ids.shape
    start = cache.length
    pos = start[:, None] + jnp.arange(wp)[None, :]
    logits, cache = forward_rows(
        spec.lm, data.params, cache, ids, pos, causal_block_mask(b, wp), ends
    )
    cache = cache.replace(length=start + npieces)
    laws = jnp.concatenate([prev[:, None].astype(logits.dtype), logits], 1)  # [B, T+1, Vd]
    t1 = laws.shape[1]
    flat = laws.reshape(b * t1, laws.shape[-1]).astype(jnp.float32)
    _, _, q = draw(False, spec, data, v_vocab, flat, jnp.zeros((b * t1,), jnp.float32))
    q = q_dense(q).reshape(b, t1, v_vocab)
    p = jax.vmap(lambda v, c: jnp.take(v, c, axis=0))(v_law, vcol)  # [B, T+1, V]
    alpha = (jnp.minimum(p, q).sum(-1) * want).sum(-1)
    after = jnp.take_along_axis(laws, last[:, None, None], 1)[:, 0].astype(jnp.float32)
    synced = take(rows.synced) + last  # verifier tokens read
    out = _put_drafter(rows, cache, after, synced, dst, jnp.arange(b, dtype=jnp.int32))
    return alpha, out


_read_score_jit = jax.jit(_read_score, static_argnames=("spec", "v_vocab"))


class ScoreReads:
    """Every drafter's score read for the plans of one `PlanStates` (one per run)."""

    def __init__(self, dep, states):
        self.dep, self.states = dep, states
        self.rows: dict[int, _DrafterRows] = {}
        self.synced: dict[int, np.ndarray] = {}  # verifier tokens read per plan; −1: none
        self.pieces: dict[int, np.ndarray] = {}  # cache slots used per plan
        self.cap: dict[int, int] = {}
        self.width: dict[int, int] = {}  # the prompts' padded width

    def _allocate(self, j: int) -> None:
        st, spec, data = self.states, self.dep.drafters[j], self.dep.d_data[j]
        m = int(data.retok.shape[1])
        enc = self.dep.drafter_encode[j]
        if st.reads_features(j):  # its prompt: the verifier's ids (positions align)
            longest = max(len(h) for h in st.hist0)
        else:
            longest = max(len(enc(t)) for t in st.texts0)
        self.width[j] = min(_up(longest, st.bucket), spec.lm.max_len)
        read = _up(_up(st.max_step_tokens + 1) * m)  # the widest read of one step
        self.cap[j] = int(min(spec.lm.max_len, self.width[j] + (st.buf_len - st.width) * m + read))
        p = st.n_plans
        self.rows[j] = _DrafterRows(
            cache=spec.lm.init_cache(p, self.cap[j]),
            logits=jnp.zeros((p, spec.lm.vocab_size), jnp.float32),
            synced=jnp.zeros((p,), jnp.int32),
        )
        self.synced[j] = np.full((p,), -1, np.int64)
        self.pieces[j] = np.zeros((p,), np.int64)

    def _ensure(self, j: int, plans, lo: dict) -> tuple[float, dict]:
        """Prefills drafter j's read of the prompts of ``plans`` that have none (``lo``:
        plan → the first position of the verifier's block this step, `score`)."""
        if j not in self.rows:
            self._allocate(j)
        need = [p for p in dict.fromkeys(plans) if self.synced[j][p] < 0]
        if not need:
            return 0.0, {}
        st, spec, data = self.states, self.dep.drafters[j], self.dep.d_data[j]
        rows = padded_rows(need)
        features, priced = None, {}
        if st.reads_features(j):  # the verifier's ids, its features of the text written first
            prompts = [st.hist0[p] for p in rows]
            n0 = st._n0  # pylint: disable=protected-access
            if all(lo.get(p, 0) <= n0[p] - 1 for p in rows):
                # Kept from the verifier's prefill; the step's block (from ``lo``) has the rest.
                features = st.prompt_features(j, rows)
            else:  # steps the step's block does not cover: the verifier reads the text again
                features = st._prompt_features(j, rows)  # pylint: disable=protected-access
        else:
            enc = self.dep.drafter_encode[j]
            prompts = [enc(st.texts0[p]) for p in rows]
        cache, logits, secs = prefill(
            spec.lm,
            data.params,
            prompts,
            capacity=self.cap[j],
            width=self.width[j],
            bucket=st.bucket,
            features=features,
        )
        if features is not None:  # its verifier block: a state program of `states`
            secs_f, priced = st.take_charges()
            secs += secs_f
        dst = np.full((len(rows),), st.n_plans, np.int32)
        dst[: len(need)] = need
        n0 = st._n0[np.asarray(rows)]  # pylint: disable=protected-access
        args = (
            self.rows[j],
            cache,
            logits,
            jnp.asarray(n0, jnp.int32),
            jnp.asarray(dst),
            jnp.arange(len(rows), dtype=jnp.int32),
        )
        key = register_state(_put_drafter, {}, args, st.n_plans, self.cap[j])
        self.rows[j], put_s = run_program(_put_drafter, {}, args)
        self.synced[j][need] = st._n0[need]  # pylint: disable=protected-access
        self.pieces[j][need] = [len(x) for x in prompts[: len(need)]]
        for k in (price_key("draft", spec.name, self.width[j], len(rows), self.cap[j]), key):
            priced[k] = priced.get(k, 0) + 1
        return secs + put_s, priced

    def _refill(self, j: int, plans, room: int) -> tuple[float, dict]:
        """Drafter j's read of ``plans`` rebuilt from the most recent whole verifier tokens
        read so far whose re-spelling fits half of ``room`` slots (as `scores.teacher_forced`
        reads a row longer than a drafter's context: the start of a long text is not read),
        so the step's pieces fit after it. A prefill, priced as one."""
        st, spec, data = self.states, self.dep.drafters[j], self.dep.d_data[j]
        if st.reads_features(j):  # its slots are the verifier's positions: no window
            raise ValueError(
                f"ScoreReads: feature drafter {spec.name!r} cannot read the plans' text "
                f"within its context of {self.cap[j]} slots"
            )
        retok, lens = np.asarray(data.retok), np.asarray(data.retok_len)
        keep = max(room // 2, 1)
        rows = padded_rows(list(plans))
        prompts = []
        for p in rows:
            toks = np.asarray(st.hist[p][: int(self.synced[j][p])], np.int64)
            k = lens[toks]
            first = int(np.searchsorted(np.cumsum(k) - k, max(int(k.sum()) - keep, 0), "left"))
            first = min(first, len(toks) - 1)  # at least the last token: its law is needed
            prompts.append(np.concatenate([retok[t, : lens[t]] for t in toks[first:]]))
        width = min(_up(max(len(x) for x in prompts), st.bucket), self.cap[j])
        cache, logits, secs = prefill(
            spec.lm, data.params, prompts, capacity=self.cap[j], width=width, bucket=st.bucket
        )
        dst = np.full((len(rows),), st.n_plans, np.int32)
        dst[: len(plans)] = plans
        synced = jnp.asarray(self.synced[j][np.asarray(rows)], jnp.int32)
        args = (
            self.rows[j],
            cache,
            logits,
            synced,
            jnp.asarray(dst),
            jnp.arange(len(rows), dtype=jnp.int32),
        )
        key = register_state(_put_drafter, {}, args, st.n_plans, self.cap[j])
        self.rows[j], put_s = run_program(_put_drafter, {}, args)
        for p, x in zip(plans, prompts):
            self.pieces[j][p] = len(x)
        priced = {price_key("draft", spec.name, width, len(rows), self.cap[j]): 1, key: 1}
        return secs + put_s, priced

    def score(self, plans, v_law, lo, new, hidden=None) -> tuple[np.ndarray, float, dict]:
        """α f32[K, B] of every drafter over rows ``plans`` (padded: a plan may repeat;
        each real plan once, first), the verifier's law at τ 1 ``v_law`` f32[B, W, V] at
        positions lo[b] + [0, W), each row's last ``new[b]`` tokens scored; (α, seconds,
        price key → runs; the seconds are the programs', as every row's: no host Python).
        ``hidden``: the verifier's states [B, W, ·] there (`verifier_window`), which feature
        drafters read. Each drafter's read advances to the committed text."""
        st = self.states
        plans = [int(p) for p in plans]
        b = len(plans)
        first = {}
        for r, p in enumerate(plans):
            first.setdefault(p, r)
        real = [first[p] == r for r, p in enumerate(plans)]
        n = np.asarray([len(st.hist[p]) for p in plans], np.int64)
        new = np.asarray(new, np.int64)
        lo = np.asarray(lo, np.int64)
        w_v = int(v_law.shape[1])
        secs, priced, out = 0.0, {}, []
        for j, (spec, data) in enumerate(zip(self.dep.drafters, self.dep.d_data)):
            s, pr = self._ensure(j, plans, dict(zip(plans, lo.tolist())))
            secs += s
            for k, x in pr.items():
                priced[k] = priced.get(k, 0) + x
            synced = self.synced[j][np.asarray(plans)]
            if (synced > n - new).any():
                raise ValueError("ScoreReads: a drafter's read is past the step's first token")
            retok, lens = np.asarray(data.retok), np.asarray(data.retok_len)
            toks = [st.hist[p][int(s0) :] for p, s0 in zip(plans, synced)]
            t_cols = _up(max(len(t) for t in toks))
            pieces = [np.concatenate([retok[t, : lens[t]] for t in tk]) for tk in toks]
            w_p = _up(max(len(x) for x in pieces))
            if w_p > self.cap[j]:
                raise ValueError(
                    f"ScoreReads: drafter {spec.name!r} cannot read one step ({w_p} pieces) "
                    f"within its context of {self.cap[j]} slots"
                )
            full = [p for p, ok in zip(plans, real) if ok and self.pieces[j][p] + w_p > self.cap[j]]
            if full:  # the read outgrows the drafter's context: it keeps the recent text
                s, pr = self._refill(j, full, self.cap[j] - w_p)
                secs += s
                for k, x in pr.items():
                    priced[k] = priced.get(k, 0) + x
            ids = np.zeros((b, w_p), np.int32)
            ends = np.zeros((b, t_cols), np.int32)
            vcol = np.zeros((b, t_cols + 1), np.int32)
            want = np.zeros((b, t_cols + 1), np.float32)
            for r, (tk, pc) in enumerate(zip(toks, pieces)):
                ids[r, : len(pc)] = pc
                ends[r, : len(tk)] = np.cumsum(lens[np.asarray(tk, np.int64)]) - 1
                at = synced[r] - 1 + np.arange(t_cols + 1)  # the position of each law
                vcol[r] = np.clip(at - lo[r], 0, w_v - 1)
                want[r] = (at >= n[r] - new[r] - 1) & (at <= n[r] - 2) & (at - lo[r] < w_v)
            dst = np.asarray([p if ok else st.n_plans for p, ok in zip(plans, real)], np.int32)
            last = np.asarray([len(t) for t in toks], np.int32)
            statics = dict(
                spec=dataclasses.replace(spec.static, gamma=None),
                v_vocab=int(self.dep.verifier.vocab_size),
            )
            args = (
                self.rows[j],
                data.replace(temperature=jnp.float32(spec.temperature)),
                jnp.asarray(plans, jnp.int32),
                jnp.asarray(dst),
                jnp.asarray(ids),
                jnp.asarray(np.asarray([len(x) for x in pieces], np.int32)),
                jnp.asarray(ends),
                jnp.asarray(last),
                v_law,
                jnp.asarray(vcol),
                jnp.asarray(want),
            )
            if st.reads_features(j):  # the features of positions lo .. n − 2
                if hidden is None:
                    raise ValueError("ScoreReads.score: a feature drafter needs `hidden`")
                feats = pick_features(hidden, st._picks[j], st._request)  # pylint: disable=protected-access
                args += (
                    (
                        feats,
                        jnp.asarray(lo, jnp.int32),
                        jnp.asarray(np.minimum(n - 1 - lo, w_v), jnp.int32),
                    ),
                )
            key = register_state(_read_score_jit, statics, args, b, self.cap[j])
            (alpha, self.rows[j]), s = run_program(_read_score_jit, statics, args)
            secs += s
            priced[key] = priced.get(key, 0) + 1
            out.append(alpha)
            for p, ok, tk, pc in zip(plans, real, toks, pieces):
                if ok:
                    self.synced[j][p] += len(tk)
                    self.pieces[j][p] += len(pc)
        alpha = np.stack([np.asarray(a) for a in jax.device_get(out)])
        return alpha, secs, priced
