"""A distilled drafter's data (`specjax.train.distill`, steps 1 and 2): prompts of a
domain cut from the corpus's train split, and the verifier's own generations with its
top-k soft targets (`Generated`, `generate`: a ragged prefill, then a `lax.scan` of
one-token steps with the KV cache)."""

from __future__ import annotations

import ast
import dataclasses
import functools
import time
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from specjax.atomic import atomic_file
from specjax.data import corpora, reasoning
from specjax.errors import NPZ_ERRORS, unreadable
from specjax.models.api import causal_block_mask, forward_rows

__all__ = ['Generated', 'domain_pairs', 'domain_prompts', 'generate']

# ----------------------------------------------------------------------------------------
# Prompts (train split)
# ----------------------------------------------------------------------------------------


def _code_pairs(doc: str) -> list[tuple[str, str]]:
    """(prompt, continuation) for every function of a source file whose ``def`` line(s) +
    first body line fit in 3 lines with at least 3 body lines after (the shipped code
    prompts' rule): the prompt those lines, the continuation the rest of the file."""
    try:
        tree = ast.parse(doc)
    except SyntaxError:
        return []
    lines = doc.splitlines(keepends=True)
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        end = node.body[0].lineno
        if end - node.lineno + 1 > 3 or (node.end_lineno or 0) - end < 3:
            continue
        p = ''.join(lines[node.lineno - 1 : end])
        if p.strip():
            out.append((p, ''.join(lines[end:])))
    return out


def domain_pairs(domain: str) -> dict[str, str]:
    """Every train-split prompt of ``domain`` -> the corpus text that follows it (its
    document's first occurrence): code, a function's head -> the rest of its file; prose, a
    book's heading and a verse -> the verses after it; reasoning, a question -> ''."""

    pairs: list[tuple[str, str]] = []
    if domain == 'code':
        train = corpora.split_documents(corpora.domain_documents('code'))[0]
        pairs = [pc for _, doc in train for pc in _code_pairs(doc)]
    elif domain == 'prose':
        train = corpora.split_documents(corpora.domain_documents('prose'))[0]
        for _, doc in train:
            lines = doc.splitlines(keepends=True)
            head, verses = lines[0], [v for v in lines[1:] if v.strip()]
            step = max(1, len(verses) // 4)
            pairs += [
                (head + verses[i], ''.join(verses[i + 1 :])) for i in range(0, len(verses), step)
            ]
    elif domain == 'reasoning':
        pairs = [
            (f'Q: {p.question}\n', '')
            for p in reasoning.generate_problems(corpora.REASONING_PROBLEMS, corpora.REASONING_SEED)
            if not corpora.is_heldout(p.question)
        ]
    else:
        raise ValueError(
            f"domain_prompts: domain={domain!r} (allowed: 'code', 'prose', 'reasoning')"
        )
    out: dict[str, str] = {}
    for prompt, cont in pairs:
        out.setdefault(prompt, cont)
    return out


def domain_prompts(domain: str, n: int, seed: int = 0) -> list[str]:
    """``n`` prompts of ``domain`` from the corpus's train split (deterministic)."""
    pool = sorted(domain_pairs(domain))
    idx = np.random.default_rng(seed).permutation(len(pool))[:n]
    return [pool[i] for i in idx]


# ----------------------------------------------------------------------------------------
# Generation with soft targets
# ----------------------------------------------------------------------------------------


@dataclasses.dataclass
class Generated:
    """Verifier generations: row r is ``prompt[r, :prompt_len[r]]`` then ``tokens[r]``.

    Attributes:
      prompt: i32[N, P] (right-padded); prompt_len: i32[N].
      tokens: i32[N, G] sampled tokens; valid: bool[N, G] (False after EOS).
      top_ids: i32[N, G, k] / top_logp: f32[N, G, k]: the verifier's top-k log-probs at
        each generated position (the distribution the token was sampled from).
      temperature: the verifier's τ.
    """

    prompt: np.ndarray
    prompt_len: np.ndarray
    tokens: np.ndarray
    valid: np.ndarray
    top_ids: np.ndarray
    top_logp: np.ndarray
    temperature: float

    def save(self, path) -> None:
        """Writes the generations to ``path`` (.npz) atomically (`specjax.atomic`)."""

        with atomic_file(path) as out:
            np.savez_compressed(
                out, **{f.name: np.asarray(getattr(self, f.name)) for f in dataclasses.fields(self)}
            )

    @classmethod
    def load(cls, path) -> 'Generated':
        """The generations `save` wrote to ``path``; a damaged or foreign file is one
        `ConfigError` line naming it."""

        try:
            with np.load(path) as z:
                return cls(
                    **{
                        f.name: (float(z[f.name]) if f.name == 'temperature' else z[f.name])
                        for f in dataclasses.fields(cls)
                    }
                )
        except NPZ_ERRORS as e:
            raise unreadable(
                path, e, 'an .npz of generations (train_drafters.py --stage=generate)'
            ) from None

    @classmethod
    def from_pairs(cls, rows, temperature: float, width: int | None = None) -> 'Generated':
        """Rows of text not sampled here: ``rows`` (prompt ids, reply ids) pairs, the
        replies right-padded to ``width`` (default: the longest); no top-k entries."""
        N, P = len(rows), max(len(p) for p, _ in rows)
        G = max(len(c) for _, c in rows) if width is None else int(width)
        prompt, tokens = np.zeros((N, P), np.int32), np.zeros((N, max(G, 1)), np.int32)
        valid = np.zeros(tokens.shape, bool)
        for r, (p, c) in enumerate(rows):
            prompt[r, : len(p)], tokens[r, : len(c)], valid[r, : len(c)] = p, c, True
        return cls(
            prompt=prompt,
            prompt_len=np.array([len(p) for p, _ in rows], np.int32),
            tokens=tokens,
            valid=valid,
            top_ids=np.zeros(tokens.shape + (0,), np.int32),
            top_logp=np.zeros(tokens.shape + (0,), np.float32),
            temperature=float(temperature),
        )

    @classmethod
    def concat(cls, parts: Sequence['Generated']) -> 'Generated':
        P = max(p.prompt.shape[1] for p in parts)
        pad = [np.pad(p.prompt, ((0, 0), (0, P - p.prompt.shape[1]))) for p in parts]
        cat = lambda name: np.concatenate([getattr(p, name) for p in parts])  # noqa: E731
        return cls(
            np.concatenate(pad),
            cat('prompt_len'),
            cat('tokens'),
            cat('valid'),
            cat('top_ids'),
            cat('top_logp'),
            parts[0].temperature,
        )

    def sequences(self) -> list[np.ndarray]:
        """Each row's prompt + valid generated tokens."""
        return [
            np.concatenate([self.prompt[r, : self.prompt_len[r]], self.tokens[r][self.valid[r]]])
            for r in range(len(self.tokens))
        ]

    @property
    def n_generated(self) -> int:
        return int(self.valid.sum())


@functools.lru_cache(maxsize=16)
def _generate_program(lm, new_tokens: int, top_k: int, eos: int):
    # Cached per (model, settings): each `generate` call of the same settings reuses the
    # compiled program instead of tracing and compiling a fresh `jax.jit` closure.
    # The empty cache is an argument, not built inside: a cache created in the program is
    # a constant that XLA tries to fold through the prefill (minutes at 30 layers). It is not
    # donated: no output could take its buffer (XLA warns and copies nothing either way).
    @jax.jit
    def run(params, cache, prompt, prompt_len, key, temperature):
        B, P = prompt.shape
        pos = jnp.broadcast_to(jnp.arange(P, dtype=jnp.int32), (B, P))
        last, cache = forward_rows(
            lm, params, cache, prompt, pos, causal_block_mask(B, P), (prompt_len - 1)[:, None]
        )
        last = last[:, 0]
        cache = lm.advance(cache, prompt_len)  # keep each row's own prompt slots

        def step(carry, k):
            cache, logits, alive = carry
            logp = jax.nn.log_softmax(logits / temperature, axis=-1)
            tok = jax.random.categorical(k, logp).astype(jnp.int32)
            top_logp, top_ids = jax.lax.top_k(logp, top_k)
            out = (tok, alive, top_ids.astype(jnp.int32), top_logp)
            alive = alive & (tok != eos)
            nxt, cache = lm.forward(
                params, cache, tok[:, None], cache.length[:, None], causal_block_mask(B, 1)
            )
            cache = lm.advance(cache, jnp.ones((B,), jnp.int32))
            return (cache, nxt[:, 0], alive), out

        keys = jax.random.split(key, new_tokens)
        _, (tok, alive, ids, lp) = jax.lax.scan(step, (cache, last, jnp.ones((B,), bool)), keys)
        return (tok.T, alive.T, ids.transpose(1, 0, 2), lp.transpose(1, 0, 2))

    return run


def generate(
    model,
    texts: Sequence[str],
    *,
    new_tokens: int = 160,
    batch: int = 32,
    temperature: float = 1.0,
    top_k: int = 16,
    seed: int = 0,
    bucket: int = 32,
    log=None,
    prefix: Sequence[int] = (),
) -> Generated:
    """The verifier's continuations of ``texts`` (already in its chat template), batched by
    prompt length; one compiled program per padded prompt width (multiples of ``bucket``).
    ``prefix``: ids put before every text's tokens (a base model's BOS, Gemma's)."""
    log = log or (lambda msg: print(msg, flush=True))
    tok = model.tokenizer
    eos = int(model.eos_id if getattr(model, 'eos_id', None) is not None else -1)
    ids = [np.asarray([*prefix, *tok.encode(t)], np.int32) for t in texts]
    order = np.argsort([len(x) for x in ids], kind='stable')
    program = _generate_program(model.lm, new_tokens, top_k, eos)
    parts, t0, done = [], time.perf_counter(), 0
    for b in range(0, len(ids), batch):
        rows = [ids[i] for i in order[b : b + batch]]
        P = -(-max(len(r) for r in rows) // bucket) * bucket
        prompt = np.zeros((batch, P), np.int32)
        plen = np.ones((batch,), np.int32)
        for r, x in enumerate(rows):
            prompt[r, : len(x)] = x
            plen[r] = len(x)
        key = jax.random.fold_in(jax.random.key(seed), b)
        cache = model.lm.init_cache(batch, P + new_tokens)
        out = jax.device_get(
            program(
                model.params,
                cache,
                jnp.asarray(prompt),
                jnp.asarray(plen),
                key,
                jnp.float32(temperature),
            )
        )
        n = len(rows)
        parts.append(
            Generated(
                prompt[:n],
                plen[:n],
                out[0][:n],
                out[1][:n],
                out[2][:n],
                out[3][:n],
                float(temperature),
            )
        )
        done += int(out[1][:n].sum())
        log(
            f'generate: {b + n}/{len(ids)} prompts, {done} tokens, '
            f'{done / (time.perf_counter() - t0):.0f} tok/s'
        )
    inv = np.argsort(order, kind='stable')
    g = Generated.concat(parts)
    return Generated(
        g.prompt[inv],
        g.prompt_len[inv],
        g.tokens[inv],
        g.valid[inv],
        g.top_ids[inv],
        g.top_logp[inv],
        g.temperature,
    )
