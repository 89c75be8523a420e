"""How good the zoo's models are: what experiments/train_zoo.py records in the manifest and
the tests re-measure.

  heldout_loss          next-token loss of a text, nats/token and nats/byte (`train.loop.eval_loss`)
  unigram_counts / unigram_loss   the add-one-smoothed unigram baseline on the same tokens
  acceptance_rates      each drafter's mean α = Σ_x min(p, q) on a text, in verifier space
  decode_tokens_per_s   greedy decoding speed at batch 1

It sits above the models, the rules' distributions and the training loop, which it measures
with (`specjax.models.zoo` only loads).
"""

from __future__ import annotations

import functools
import math
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from specjax.engine.deployment import from_zoo
from specjax.field_report import FIELD_REPORT_ACCEPTANCE
from specjax.models.api import advance
from specjax.tokenizers import Tokenizer
from specjax.train.loop import eval_loss
from specjax.verify.distributions import sampling_probs, to_verifier_space

__all__ = [
    'first_differences',
    'heldout_loss',
    'unigram_counts',
    'unigram_loss',
    'acceptance_rates',
    'decode_tokens_per_s',
]


def heldout_loss(
    lm,
    params,
    tokenizer: Tokenizer,
    text: str,
    seq_len: int | None = None,
    max_tokens: int | None = None,
    batch_size: int = 8,
) -> dict[str, float]:
    """Next-token loss of ``text`` in nats/token and nats/byte.

    Consecutive windows of ``seq_len`` predictions (default: the model's ``max_len``),
    as `specjax.train.loop.eval_loss`; the first token of the text is context only, so bytes
    are counted over the predicted tokens.
    """
    ids = np.asarray(tokenizer.encode(text), np.int32)
    if max_tokens is not None:
        ids = ids[: max_tokens + 1]
    nats_tok = eval_loss(lm, params, ids, seq_len=seq_len, batch_size=batch_size)
    n_pred = len(ids) - 1
    n_bytes = sum(len(tokenizer.token_bytes(int(i))) for i in ids[1:])
    return {
        'nats_per_token': nats_tok,
        'nats_per_byte': nats_tok * n_pred / n_bytes,
        'tokens': int(n_pred),
        'bytes': int(n_bytes),
    }


def unigram_counts(tokenizer: Tokenizer, train_text: str) -> np.ndarray:
    """Token counts of ``train_text`` (int64[V])."""
    ids = np.asarray(tokenizer.encode(train_text), np.int64)
    return np.bincount(ids, minlength=tokenizer.vocab_size)


def unigram_loss(
    tokenizer: Tokenizer, counts: np.ndarray, text: str, max_tokens: int | None = None
) -> dict[str, float]:
    """Loss of an add-one-smoothed unigram model (``counts`` + 1) on ``text``.

    Scored over the same tokens as `heldout_loss` (all but the first).
    """
    logp = np.log((counts + 1.0) / (counts.sum() + len(counts)))
    ids = np.asarray(tokenizer.encode(text), np.int64)
    if max_tokens is not None:
        ids = ids[: max_tokens + 1]
    pred = ids[1:]
    nats = float(-logp[pred].sum())
    n_bytes = sum(len(tokenizer.token_bytes(int(i))) for i in pred)
    return {'nats_per_token': nats / len(pred), 'nats_per_byte': nats / n_bytes}


@functools.partial(jax.jit, static_argnames=('lm', 'temperature'))
def _verifier_probs(lm, params, tokens, temperature):
    return sampling_probs(lm.logits_full(params, tokens), temperature)


@functools.partial(jax.jit, static_argnames=('spec', 'v_vocab'))
def _overlap_sums(spec, data, p, ids, ends, valid, v_vocab):
    """Σ over valid positions of Σ_x min(p, q) for one drafter, and the count."""
    logits = spec.lm.logits_full(data.params, ids)
    at = jnp.take_along_axis(logits, ends[:, :, None], axis=1)
    q = sampling_probs(
        at, spec.temperature, top_k=spec.top_k, top_p=spec.top_p, mask=data.to_verifier >= 0
    )
    q = to_verifier_space(q, data.to_verifier, v_vocab)
    overlap = jnp.minimum(p, q).sum(-1)
    return jnp.where(valid, overlap, 0.0).sum(), valid.sum()


def _windows(
    v_ids: np.ndarray, widths: list[np.ndarray], max_lens: list[int], window: int
) -> list[tuple[int, int]]:
    """[start, end) windows of at most ``window`` verifier tokens whose re-spelling in
    every drafter's ids fits that drafter's context."""
    out, start, used = [], 0, [0] * len(widths)
    for i, tok in enumerate(v_ids):
        w = [int(x[tok]) for x in widths]
        if i - start >= window or any(u + a > m for u, a, m in zip(used, w, max_lens)):
            out.append((start, i))
            start, used = i, [0] * len(widths)
        used = [u + a for u, a in zip(used, w)]
    if len(v_ids) > start:
        out.append((start, len(v_ids)))
    return out


def acceptance_rates(
    dep,
    text: str,
    window: int = 128,
    verifier_temperature: float = 1.0,
    batch_size: int = 8,
    max_tokens: int | None = None,
) -> np.ndarray:
    """Each drafter's mean acceptance α = Σ_x min(p(x), q(x)) on ``text``, in verifier space.

    The text is spelt with the verifier's tokenizer and cut into windows of at most
    ``window`` verifier tokens; within a window every position counts (the context is the
    window so far). ``p`` is the verifier's sampling distribution at
    ``verifier_temperature``; ``q`` is what the drafter samples from at its temperature
    after the token-level-intersection mask, read at verifier-token boundaries with the
    prefix re-spelt through the drafter's re-tokenisation table — the same quantity as
    `specjax.engine.deployment.prefix_distributions`, computed with the re-spelt prefix
    packed (no per-token padding to the table's width), so long windows fit the context.

    Returns:
      f32[K], in ``dep.drafters`` order.
    """
    v_ids = np.asarray(dep.encode(text), np.int32)
    if max_tokens is not None:
        v_ids = v_ids[:max_tokens]
    if len(v_ids) < 1:
        raise ValueError('acceptance_rates: empty text')
    retok = [np.asarray(d.retok) for d in dep.d_data]
    lens = [np.asarray(d.retok_len) for d in dep.d_data]
    wins = _windows(v_ids, lens, [s.lm.max_len for s in dep.drafters], window)
    W = max(e - s for s, e in wins)
    n_pad = math.ceil(len(wins) / batch_size) * batch_size
    v_tok = np.zeros((n_pad, W), np.int32)
    valid = np.zeros((n_pad, W), bool)
    for r, (s, e) in enumerate(wins):
        v_tok[r, : e - s] = v_ids[s:e]
        valid[r, : e - s] = True
    # Drafter streams: concatenated re-spellings; ends[r, t] = index of token t's last piece.
    streams = []
    for k, spec in enumerate(dep.drafters):
        flats = [np.concatenate([retok[k][t, : lens[k][t]] for t in v_ids[s:e]]) for s, e in wins]
        # Pad to the longest stream (rounded up to 64, so shapes repeat across texts).
        L = min(spec.lm.max_len, -(-max(len(f) for f in flats) // 64) * 64)
        ids = np.zeros((n_pad, L), np.int32)
        ends = np.zeros((n_pad, W), np.int32)
        for r, ((s, e), flat) in enumerate(zip(wins, flats)):
            ids[r, : len(flat)] = flat
            ends[r, : e - s] = np.cumsum(lens[k][v_ids[s:e]]) - 1
        streams.append((ids, ends))
    tot = np.zeros(len(dep.drafters))
    cnt = 0.0
    for b in range(0, n_pad, batch_size):
        sl = slice(b, b + batch_size)
        p = _verifier_probs(
            dep.verifier, dep.v_params, jnp.asarray(v_tok[sl]), float(verifier_temperature)
        )
        for k, (spec, data) in enumerate(zip(dep.drafters, dep.d_data)):
            ids, ends = streams[k]
            s, c = _overlap_sums(
                spec,
                data,
                p,
                jnp.asarray(ids[sl]),
                jnp.asarray(ends[sl]),
                jnp.asarray(valid[sl]),
                dep.verifier.vocab_size,
            )
            tot[k] += float(s)
        cnt += float(valid[sl].sum())
    return (tot / cnt).astype(np.float32)


def decode_tokens_per_s(lm, params, n_tokens: int = 256, repeats: int = 3) -> float:
    """Greedy decoding speed at batch 1: one-token ``forward`` steps inside a jitted
    ``lax.scan`` (compiled once, then the best of ``repeats`` timed runs)."""
    n_tokens = min(n_tokens, lm.max_len)

    @jax.jit
    def run(params, first):
        def step(carry, i):
            cache, tok = carry
            logits, cache = lm.forward(
                params,
                cache,
                tok[:, None],
                jnp.full((1, 1), i, jnp.int32),
                jnp.ones((1, 1, 1), bool),
            )
            cache = advance(cache, jnp.ones((1,), jnp.int32))
            nxt = jnp.argmax(logits[:, -1], axis=-1).astype(jnp.int32)
            return (cache, nxt), nxt

        _, toks = jax.lax.scan(step, (lm.init_cache(1), first), jnp.arange(n_tokens))
        return toks

    first = jnp.zeros((1,), jnp.int32)
    run(params, first).block_until_ready()
    best = float('inf')
    for _ in range(repeats):
        t0 = time.perf_counter()
        run(params, first).block_until_ready()
        best = min(best, time.perf_counter() - t0)
    return n_tokens / best


# ----------------------------------------------------------------------------------------
# The zoo manifest's measurements (experiments/train_zoo.py)
# ----------------------------------------------------------------------------------------


def record_heldout(zoo, records: dict, heldout: dict, corpora: dict, counts: dict) -> None:
    """Each model's held-out loss per domain, and an add-one unigram's on the same text, into
    ``records[name]['heldout']``. ``counts``: {(tokenizer name, domain): unigram counts of
    the training text}, filled from ``corpora[domain]`` where missing."""
    for m in (zoo.verifier,) + zoo.drafters:
        rec = records[m.name]
        rec['heldout'] = {}
        for dom, text in heldout.items():
            key = (m.tokenizer_name, dom)
            if key not in counts:
                counts[key] = unigram_counts(m.tokenizer, corpora[dom])
            loss = heldout_loss(m.lm, m.params, m.tokenizer, text, seq_len=256)
            uni = unigram_loss(m.tokenizer, counts[key], text)
            rec['heldout'][dom] = dict(
                nats_per_token=round(loss['nats_per_token'], 4),
                nats_per_byte=round(loss['nats_per_byte'], 4),
                unigram_nats_per_token=round(uni['nats_per_token'], 4),
                unigram_nats_per_byte=round(uni['nats_per_byte'], 4),
                tokens=loss['tokens'],
                bytes=loss['bytes'],
                in_domain=dom in m.domains,
            )


def record_acceptance(zoo, records: dict, heldout: dict, window: int) -> None:
    """Each drafter's re-spelling width M and its α per domain on the held-out text, into
    ``records[name]['retok_width']`` and ``['acceptance']``."""

    dep = from_zoo(zoo)
    for name, data in zip(dep.names, dep.d_data):
        # M: the most drafter tokens one verifier token re-spells into (1: same tokenizer).
        records[name]['retok_width'] = int(np.asarray(data.retok).shape[1])
    for dom, text in heldout.items():
        for name, a in zip(dep.names, acceptance_rates(dep, text, window=window)):
            records[name].setdefault('acceptance', {})[dom] = round(float(a), 4)


def zoo_measurement(train_bytes: int, window: int) -> dict:
    """How the manifest's measurements were made (recorded in it)."""

    return dict(
        heldout_text='specjax.data.load_heldout(domain) (shipped, ~32 KB each)',
        heldout_loss='consecutive windows of 256 predicted tokens (specjax.train.loop.eval_loss); '
        'nats/byte = total nats / bytes of the predicted tokens',
        unigram="add-one smoothed unigram of the model's tokenizer, fitted on the same "
        f'train prefix ({train_bytes} B) of the domain',
        acceptance='alpha = mean over positions of sum_x min(p(x), q(x)) in verifier space; '
        'p: verifier at temperature 1; q: drafter at its default temperature '
        'after the token-level-intersection mask, read at verifier-token '
        f'boundaries; windows of {window} verifier tokens of '
        'the shipped held-out text',
        decode='greedy, batch 1, 256 one-token steps inside a jitted lax.scan; best of 3; '
        'machine-dependent',
        seed_acceptance=FIELD_REPORT_ACCEPTANCE,
    )


def print_zoo_report(manifest: dict, out, domains) -> None:
    """The built zoo (`manifest`, written to `out`) on stdout: sizes, held-out loss per
    domain against the unigram, each drafter's α per domain against the field report's."""

    domains = tuple(domains)
    models = manifest['models']
    size = sum(f.stat().st_size for f in Path(out).rglob('*') if f.is_file())
    print(
        f'\nzoo written to {out} ({size / 1e6:.2f} MB); training {manifest["wall_s"]["training"]:.0f}s, '
        f'total {manifest["wall_s"]["total"]:.0f}s\n'
    )
    print('| model | params | c_i | steps | train s | decode tok/s |')
    print('| --- | --- | --- | --- | --- | --- |')
    for n, r in models.items():
        print(
            f'| {n} | {r["n_params"]:,} | {r.get("cost", 1.0):.3f} | {r["train"]["steps"]} | '
            f'{r["train"]["wall_s"]:.0f} | {r["decode_tokens_per_s"]:.0f} |'
        )
    print('\nheld-out loss, nats/byte (model / unigram); * = trained on that domain')
    print('| model | ' + ' | '.join(domains) + ' |')
    print('| --- |' + ' --- |' * len(domains))
    for n, r in models.items():
        cells = []
        for d in domains:
            h = r['heldout'][d]
            cells.append(
                f'{h["nats_per_byte"]:.3f} / {h["unigram_nats_per_byte"]:.3f}'
                + (' *' if h['in_domain'] else '')
            )
        print(f'| {n} | ' + ' | '.join(cells) + ' |')
    print(
        '\nacceptance α = Σ min(p, q) vs the verifier (τ_v = 1, drafter at its default τ); '
        'seed: 0.68 / 0.61 / 0.54 (code / prose / reasoning, own domain)'
    )
    print('| drafter | τ | M | ' + ' | '.join(domains) + ' | mixed | seed |')
    print('| --- | --- | --- |' + ' --- |' * len(domains) + ' --- | --- |')
    for n in list(manifest['drafter_order']) + list(manifest.get('extra_drafters', [])):
        r = models[n]
        cells = [f'{r["acceptance"][d]:.3f}' + (' *' if d in r['domains'] else '') for d in domains]
        mixed = float(np.mean([r['acceptance'][d] for d in domains]))
        print(
            f'| {n} | {r["temperature"]} | {r["retok_width"]} | '
            + ' | '.join(cells)
            + f' | {mixed:.3f} | {FIELD_REPORT_ACCEPTANCE.get(n, "—")} |'
        )
    order = manifest['drafter_order']
    mixed = [float(np.mean([models[n]['acceptance'][d] for d in domains])) for n in order]
    own_best = all(
        models[n]['acceptance'][models[n]['domains'][0]]
        == max(models[m]['acceptance'][models[n]['domains'][0]] for m in order)
        for n in order
    )
    inside = all(0.5 <= a <= 0.7 for a in mixed)
    print(
        f'\nmixed-traffic acceptance {" / ".join(f"{a:.2f}" for a in mixed)}: '
        f'{"inside" if inside else "OUTSIDE"} the seed band 0.5–0.7; each drafter best in '
        f'its own domain: {"yes" if own_best else "no"}'
    )


def first_differences(lm, params, prompts, want, got, temperature: float) -> list[dict]:
    """Where each prompt's tokens ``got`` first leave ``want`` (e.g. static batching's),
    for a reproducibility question, not a law: the prompt, the position, both tokens and
    their probabilities and places in the cumulative distribution under the verifier's law
    there (an uncached forward over prompt + the common prefix; at τ 0 the τ 1 law, whose
    argmax the draw was). Two tokens both far below the f32 rounding of a cumulative sum
    over the vocabulary mean batch composition decided the draw, not a lost law.

    Args:
      lm, params: the verifier (`TransformerLM` API: ``logits_full``).
      prompts: each prompt's token ids; want / got: each prompt's generated ids.
      temperature: the verifier's τ.
    """
    fwd = jax.jit(lambda p, x: lm.logits_full(p, x)[0, -1])
    tau = float(temperature) if temperature > 0 else 1.0
    out = []
    for i, (a, b) in enumerate(zip(want, got)):
        a, b = [int(t) for t in a], [int(t) for t in b]
        if a == b:
            continue
        n = min(len(a), len(b))
        k = next((j for j in range(n) if a[j] != b[j]), n)
        row = {'prompt': i, 'position': k, 'lengths': [len(a), len(b)]}
        if k < n:
            z = np.asarray(
                fwd(params, np.asarray([list(prompts[i]) + a[:k]], np.int32)), np.float64
            )
            p = np.exp((z - z.max()) / tau)
            p /= p.sum()
            cdf = np.cumsum(p)
            row.update(
                tokens=[a[k], b[k]],
                p=[float(p[a[k]]), float(p[b[k]])],
                cdf=[float(cdf[a[k]]), float(cdf[b[k]])],
            )
        out.append(row)
    return out
