"""Distilled drafters (`specjax.train.distill`): the verifier's generations and the training.

1. `generate`: at τ → 0 (1e-4) the verifier's greedy continuation, computed independently
   one token at a time with `logits_full`, for ragged prompts in one batch and across
   batches (right padding, per-row cache lengths, the rows put back in input order);
   `valid` turns False right after the first EOS; the top-k log-probs at a sampling τ are
   the top-k of `log_softmax(logits / τ)` of the full forward over the written text.
2. `Generated`: save / load / concat / sequences round-trip.
3. `train_drafter` on the tiny byte verifier: the soft-target loss (recomputed here on
   every target) falls over a few dozen steps, the subset is the most frequent ids, and
   the drafter's params load into the engine (greedy speculative decoding with it equals
   the verifier's greedy decoding).
4. `domain_prompts` uses the train split only (synthetic corpora with held-out keys, and
   the real corpora when the cache is there).
"""

from __future__ import annotations

import dataclasses
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_subset_vocab_engine import (
    BYTE_CONFIG,
    GREEDY_KEPT,
    byte_verifier,
    check_greedy_equality,
    greedy_prompts,
    greedy_reference,
)

from specjax.data import corpora
from specjax.models.subset_vocab import SubsetVocabLM, most_frequent_ids
from specjax.tokenizers import ByteTokenizer
from specjax.train import distill, distill_data

TEXTS = ["def f(x):", "a", "Genesis 1\nIn the b", "Q: 2", "abc", "hello, world"]  # ragged
NEW, TOP_K, BUCKET, BATCH = 24, 5, 32, 4  # 6 prompts: two batches of 4 rows, one width


def _model(eos):
    lm, params = byte_verifier()
    return types.SimpleNamespace(lm=lm, params=params, tokenizer=ByteTokenizer(), eos_id=eos)


def _quiet(*_):
    pass


@pytest.fixture(scope="module")
def greedy():
    """(model with an EOS the greedy text writes, the greedy continuations i32[6, NEW])."""
    lm, params = byte_verifier()
    enc = [list(ByteTokenizer().encode(t)) for t in TEXTS]
    width = BUCKET + NEW
    buf = np.zeros((len(enc), width), np.int32)
    lens = np.array([len(e) for e in enc])
    for r, e in enumerate(enc):
        buf[r, : len(e)] = e
    full = jax.jit(lm.logits_full)
    for _ in range(NEW):  # one token at a time; causal, so what follows is never read
        logits = np.asarray(full(params, jnp.asarray(buf)))
        buf[np.arange(len(enc)), lens] = logits[np.arange(len(enc)), lens - 1].argmax(-1)
        lens += 1
    ref = np.stack([buf[r, len(e) : len(e) + NEW] for r, e in enumerate(enc)])
    # EOS: the token row 0 writes 4th, so at least one row ends mid-generation.
    return _model(int(ref[0, 3])), ref


def _expected_valid(ref, eos):
    valid = np.ones(ref.shape, bool)
    for r, row in enumerate(ref):
        hits = np.nonzero(row == eos)[0]
        if len(hits):
            valid[r, hits[0] + 1 :] = False  # EOS itself is a target; nothing after it
    return valid


def test_generate_at_tau_zero_is_the_greedy_continuation(greedy):
    model, ref = greedy
    g = distill.generate(
        model,
        TEXTS,
        new_tokens=NEW,
        batch=BATCH,
        temperature=1e-4,
        top_k=TOP_K,
        bucket=BUCKET,
        log=_quiet,
    )
    assert g.tokens.shape == (len(TEXTS), NEW) and g.top_ids.shape == (len(TEXTS), NEW, TOP_K)
    np.testing.assert_array_equal(g.prompt_len, [len(t.encode()) for t in TEXTS])
    for r, t in enumerate(TEXTS):
        assert ByteTokenizer().decode(g.prompt[r, : g.prompt_len[r]]) == t
    np.testing.assert_array_equal(g.tokens, ref)
    valid = _expected_valid(ref, model.eos_id)
    assert (~valid).any() and valid[:, -1].any()  # some rows end, some do not
    np.testing.assert_array_equal(g.valid, valid)
    # At τ → 0 the sampled token is the top-1, with log-prob ≈ 0.
    np.testing.assert_array_equal(g.top_ids[..., 0], ref)
    assert np.all(g.top_logp[..., 0] > -1e-3) and np.all(np.diff(g.top_logp, axis=-1) <= 0)
    assert g.temperature == pytest.approx(1e-4)
    assert distill.summarize(g) == {
        "rows": 6,
        "generated": int(valid.sum()),
        "ended": int((~valid[:, -1]).sum()),
    }
    # One compiled program per settings: a second call reuses it.
    before = distill_data._generate_program.cache_info().hits  # pylint: disable=protected-access
    distill.generate(
        model,
        TEXTS[:2],
        new_tokens=NEW,
        batch=BATCH,
        temperature=1e-4,
        top_k=TOP_K,
        bucket=BUCKET,
        log=_quiet,
    )
    assert distill_data._generate_program.cache_info().hits == before + 1  # pylint: disable=protected-access


def test_generate_top_k_log_probs_are_the_full_forwards(greedy):
    model, _ = greedy
    tau = 0.8
    g = distill.generate(
        model,
        TEXTS,
        new_tokens=NEW,
        batch=BATCH,
        temperature=tau,
        top_k=TOP_K,
        bucket=BUCKET,
        seed=3,
        log=_quiet,
    )
    seqs = np.zeros((len(TEXTS), BUCKET + NEW), np.int32)
    for r in range(len(TEXTS)):
        p = g.prompt_len[r]
        seqs[r, : p + NEW] = np.concatenate([g.prompt[r, :p], g.tokens[r]])
    logits = jax.jit(model.lm.logits_full)(model.params, jnp.asarray(seqs))
    logp = np.asarray(jax.nn.log_softmax(logits / tau, axis=-1))
    at = g.prompt_len[:, None] - 1 + np.arange(NEW)[None]  # position of token j
    lp = np.take_along_axis(logp, at[..., None], axis=1)  # [6, NEW, V]
    order = np.argsort(-lp, axis=-1, kind="stable")[..., :TOP_K]
    np.testing.assert_array_equal(g.top_ids, order)
    np.testing.assert_allclose(g.top_logp, np.take_along_axis(lp, order, -1), atol=1e-4)
    # The sampled tokens: drawn from that law (no token of negligible probability), and
    # not all the greedy ones.
    sampled = np.take_along_axis(lp, g.tokens[..., None], -1)[..., 0]
    assert sampled.min() > -12 and (g.tokens != lp.argmax(-1)).any()
    np.testing.assert_array_equal(g.valid, _expected_valid(g.tokens, model.eos_id))


def _toy(rows, width, new, seed):
    rng = np.random.default_rng(seed)
    plen = rng.integers(1, width + 1, rows).astype(np.int32)
    prompt = np.where(
        np.arange(width)[None] < plen[:, None], rng.integers(0, 256, (rows, width)), 0
    ).astype(np.int32)
    valid = np.arange(new)[None] < rng.integers(0, new + 1, rows)[:, None]
    return distill.Generated(
        prompt,
        plen,
        rng.integers(0, 256, (rows, new)).astype(np.int32),
        valid,
        rng.integers(0, 256, (rows, new, 3)).astype(np.int32),
        -rng.random((rows, new, 3)).astype(np.float32),
        0.7,
    )


def _assert_same(a, b):
    for f in dataclasses.fields(distill.Generated):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if f.name == "temperature":
            assert x == y and isinstance(y, float)
        else:
            assert x.dtype == y.dtype, f.name
            np.testing.assert_array_equal(x, y, err_msg=f.name)


def test_generated_round_trip(tmp_path):
    a, b = _toy(3, 5, 6, 0), _toy(4, 9, 6, 1)
    path = tmp_path / "gen.npz"
    a.save(path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gen.npz"]  # no temporary left
    _assert_same(a, distill.Generated.load(path))
    a.save(str(tmp_path / "again.npz"))  # str paths too
    _assert_same(a, distill.Generated.load(str(tmp_path / "again.npz")))
    cat = distill.Generated.concat([a, b])
    assert cat.prompt.shape == (7, 9) and (cat.prompt[:3, 5:] == 0).all()
    np.testing.assert_array_equal(cat.prompt[:3, :5], a.prompt)
    _assert_same(distill.Generated.concat([cat]), cat)
    seqs = cat.sequences()
    assert len(seqs) == 7 and cat.n_generated == a.n_generated + b.n_generated
    for r, part in enumerate([a] * 3 + [b] * 4):
        i = r if r < 3 else r - 3
        want = np.concatenate([part.prompt[i, : part.prompt_len[i]], part.tokens[i][part.valid[i]]])
        np.testing.assert_array_equal(seqs[r], want)
    cat.save(path)
    loaded = distill.Generated.load(path)
    _assert_same(cat, loaded)
    assert [s.tolist() for s in loaded.sequences()] == [s.tolist() for s in seqs]


# ----------------------------------------------------------------------------------------
# Training
# ----------------------------------------------------------------------------------------


def _recipe(**kw):
    """The drafter recipe for the byte verifier: its own shape (so the trained drafter is
    the SubsetVocabLM of tests/test_subset_vocab_engine.py's greedy test: one engine program)."""
    c = BYTE_CONFIG
    base = {
        "d_model": c.d_model,
        "n_layers": c.n_layers,
        "n_heads": c.n_heads,
        "n_kv_heads": c.n_kv_heads,
        "d_ff": c.d_ff,
        "kept": GREEDY_KEPT,
        "max_len": c.max_len,
        "steps": 40,
        "batch": 8,
        "learning_rate": 1e-2,
        "warmup": 4,
    }
    return distill.DrafterRecipe(**{**base, **kw})


def _soft_loss(lm, params, data):
    """The mean soft-target cross-entropy over every generated position, in NumPy (top-k
    renormalised; ids outside the subset are the "other" row)."""
    seqs = data.sequences()
    width = max(len(s) for s in seqs)
    toks = np.zeros((len(seqs), width), np.int32)
    for r, s in enumerate(seqs):
        toks[r, : len(s)] = s
    logq = np.asarray(
        jax.nn.log_softmax(lm.inner_logits_full(params, jnp.asarray(toks)), -1), np.float64
    )
    to_inner = np.asarray(params["to_inner"])
    total, n = 0.0, 0
    for r in range(len(seqs)):
        p0 = int(data.prompt_len[r])
        for j in np.nonzero(data.valid[r])[0]:
            w = np.exp(data.top_logp[r, j] - data.top_logp[r, j].max())
            w /= w.sum()
            total -= float(np.sum(w * logq[r, p0 - 1 + j, to_inner[data.top_ids[r, j]]]))
            n += 1
    return total / n


@pytest.fixture(scope="module")
def sampled(greedy):
    model, _ = greedy
    return distill.generate(
        model,
        TEXTS,
        new_tokens=NEW,
        batch=BATCH,
        temperature=1.0,
        top_k=TOP_K,
        bucket=BUCKET,
        seed=5,
        log=_quiet,
    )


def test_train_drafter_lowers_the_soft_loss(greedy, sampled):
    model, _ = greedy
    data = sampled
    lm, params, hist = distill.train_drafter(data, model, _recipe(), log=_quiet)
    # A SubsetVocabLM over the verifier's ids, its subset the most frequent ids.
    assert isinstance(lm, SubsetVocabLM) and lm.verifier_vocab == 256
    assert lm.n_kept == GREEDY_KEPT and lm.config.d_model == BYTE_CONFIG.d_model
    counts = np.bincount(np.concatenate(data.sequences()), minlength=256)
    keep = most_frequent_ids(counts, GREEDY_KEPT)
    np.testing.assert_array_equal(params["keep"], keep)
    assert hist["coverage"] == pytest.approx(counts[keep].sum() / counts.sum())
    assert hist["n_targets"] == data.n_generated and hist["n_rows"] == len(TEXTS)
    for a, p in zip(jax.tree.leaves(lm.abstract_params()), jax.tree.leaves(params)):
        assert (a.shape, a.dtype) == (p.shape, p.dtype)
    assert jax.tree.structure(lm.abstract_params()) == jax.tree.structure(params)
    losses = [l for _, l in hist["loss"]]
    assert [s for s, _ in hist["loss"]] == [0, 39] and np.isfinite(losses).all()
    # The loss on every target, before (a zero learning rate returns the initial params;
    # its first batch loss is the run's) and after training.
    lm0, params0, hist0 = distill.train_drafter(
        data, model, _recipe(steps=1, learning_rate=0.0), log=_quiet
    )
    assert lm0 == lm and hist0["loss"][0][1] == pytest.approx(hist["loss"][0][1], rel=1e-5)
    before, after = _soft_loss(lm0, params0, data), _soft_loss(lm, params, data)
    print(f"\nsoft loss {before:.3f} -> {after:.3f}; history {hist['loss']}")
    assert after < before - 0.5 and hist["loss"][-1][1] < hist["loss"][0][1] - 0.5, (
        before,
        after,
        hist["loss"],
    )
    # The params load into the engine: greedy speculative decoding with the drafter is the
    # verifier's greedy decoding.
    prompts = greedy_prompts(2)
    ar = greedy_reference(model.lm, model.params, prompts)
    c = check_greedy_equality(model.lm, model.params, lm, params, prompts, ar, temperature=1.0)
    assert c.proposed[:, 0].sum() > 0


def test_train_drafter_rejects_unknown_targets(greedy, sampled):
    model, _ = greedy
    with pytest.raises(ValueError, match="targets"):
        distill.train_drafter(sampled, model, _recipe(targets="logits"), log=_quiet)


@pytest.mark.slow
def test_train_drafter_hard_targets(greedy, sampled):
    model, _ = greedy
    _, _, hist = distill.train_drafter(
        sampled, model, _recipe(targets="hard", steps=60), log=_quiet
    )
    (_, first), (_, last) = hist["loss"][0], hist["loss"][-1]
    assert np.isfinite([first, last]).all() and last < first - 0.5, hist["loss"]


def test_pca_init_shapes():
    """The embedding init: [K + 1, d] with unit-variance coordinates, also when d exceeds
    the verifier's width or the number of kept rows (then padded with seeded noise)."""
    rng = np.random.default_rng(0)
    emb = rng.normal(size=(256, 32)).astype(np.float32)
    keep = np.sort(rng.choice(256, 20, replace=False))
    for d in (8, 32, 48):
        x = distill._pca_init(emb, keep, d, seed=1)  # pylint: disable=protected-access
        assert x.shape == (21, d) and x.dtype == np.float32 and np.isfinite(x).all()
        np.testing.assert_allclose(x.std(0), 1.0, rtol=1e-3)
    a = distill._pca_init(emb, keep, 48, seed=1)  # pylint: disable=protected-access
    np.testing.assert_array_equal(a, distill._pca_init(emb, keep, 48, seed=1))  # pylint: disable=protected-access


# ----------------------------------------------------------------------------------------
# Prompts: the train split only
# ----------------------------------------------------------------------------------------


def _keys(n_train, n_held, fmt):
    train, held, i = [], [], 0
    while len(train) < n_train or len(held) < n_held:
        k = fmt.format(i)
        (held if corpora.is_heldout(k) else train).append(k)
        i += 1
    return train[:n_train], held[:n_held]


def _code_doc(key):
    tag = key.replace("/", "_").replace(".", "_")
    body = "".join(
        f"def {tag}_{j}(x):\n    y = x + {j}\n    y = y * 2\n    y = y - 1\n    return y\n\n"
        for j in range(3)
    )
    return f"# file: {key}\n{body}def short_{tag}(x):\n    return x\n"


def _synthetic_corpora(monkeypatch):
    """Synthetic code and prose corpora with train and held-out documents, in place of the
    real ones: (code train keys, prose train keys, {domain: documents})."""
    code_train, code_held = _keys(4, 3, "pkg/mod{}.py")
    prose_train, prose_held = _keys(4, 3, "Book {}")
    docs = {
        "code": [(k, _code_doc(k)) for k in code_train + code_held],
        "prose": [
            (k, k + "\n" + "".join(f"{k} verse {j}\n" for j in range(9)) + "\n")
            for k in prose_train + prose_held
        ],
    }
    monkeypatch.setattr(corpora, "domain_documents", lambda name, cache=None: docs[name])
    return code_train, prose_train, docs


def test_domain_prompts_train_split_on_synthetic_corpora(monkeypatch):
    code_train, prose_train, _ = _synthetic_corpora(monkeypatch)
    code = distill.domain_prompts("code", 1000)

    def tags(keys):
        return {k.replace("/", "_").replace(".", "_") for k in keys}

    # Every qualifying function of every train document, and nothing else.
    want = {f"def {t}_{j}(x):\n    y = x + {j}\n" for t in tags(code_train) for j in range(3)}
    assert set(code) == want and len(code) == len(want)
    prose = distill.domain_prompts("prose", 1000)
    assert prose and all(p.split("\n")[0] in prose_train for p in prose)
    assert {p.split("\n")[0] for p in prose} == set(prose_train)
    # Deterministic for a seed; n caps the count.
    assert distill.domain_prompts("code", 5, seed=3) == distill.domain_prompts("code", 5, seed=3)
    assert len(distill.domain_prompts("code", 5)) == 5
    with pytest.raises(ValueError, match="domain"):
        distill.domain_prompts("poetry", 3)


def test_text_rows_continue_each_prompt_with_its_own_document(monkeypatch):
    """`distill_eagle.text_rows`: the prompts `domain_prompts` draws with the seed, in
    order, each in the chat template, then the first tokens of the text that follows it in
    its train document; prompts with nothing after them are left out; reasoning (no
    text after its questions) is refused."""
    import types  # pylint: disable=import-outside-toplevel

    from specjax.train.distill_eagle import text_rows  # pylint: disable=import-outside-toplevel

    _, _, docs = _synthetic_corpora(monkeypatch)
    byte_tok = types.SimpleNamespace(encode=lambda t: list(t.encode()))
    model = types.SimpleNamespace(tokenizer=byte_tok, chat=lambda p: f"<u>{p}</u>")
    for domain in ("code", "prose"):
        texts = [t for _, t in docs[domain]]
        prompts = distill.domain_prompts(domain, 9, seed=4)
        g = text_rows(model, domain, 9, reply_tokens=24, seed=4)
        last = {t.rstrip("\n").splitlines()[-1] for t in texts}  # nothing follows these
        kept = [p for p in prompts if p.splitlines()[-1] not in last]
        assert len(g.tokens) == len(kept) and np.isnan(g.temperature)
        for r, p in enumerate(kept):
            assert bytes(g.prompt[r, : g.prompt_len[r]].tolist()).decode() == f"<u>{p}</u>"
            reply = bytes(g.tokens[r][g.valid[r]].tolist()).decode()
            assert 0 < len(reply) <= 24 and g.valid[r].sum() == len(reply)
            # It follows the prompt's last line (a verse after its book's heading) in a document.
            assert any(p.splitlines(True)[-1] + reply in t for t in texts), (p, reply)
        if domain == "prose":  # some prompt was a book's last verse, with nothing after it
            assert len(kept) < len(prompts)
    with pytest.raises(ValueError, match="no text"):
        text_rows(model, "reasoning", 3, reply_tokens=8)


def test_domain_prompts_reasoning_train_split():
    prompts = distill.domain_prompts("reasoning", 200)
    assert len(prompts) == 200 == len(set(prompts))
    for p in prompts:
        assert p.startswith("Q: ") and p.endswith("\n")
        assert not corpora.is_heldout(p[3:-1]), p
    assert distill.domain_prompts("reasoning", 20, seed=1) == distill.domain_prompts(
        "reasoning", 20, seed=1
    )


def _require_prose_cache():
    dump = corpora.default_cache_dir() / "_src" / "kjv" / "kjv_dump.txt"
    if not dump.is_file():
        pytest.skip(f"prose corpus cache missing ({dump}); build it with `python -m specjax.data`")


def test_domain_prompts_prose_train_split():
    _require_prose_cache()
    prompts = distill.domain_prompts("prose", 100)
    train = dict(corpora.split_documents(corpora.domain_documents("prose"))[0])
    assert len(prompts) == 100
    for p in prompts:
        head, verse = p.split("\n", 1)
        assert not corpora.is_heldout(head) and head in train, head
        assert verse.endswith("\n") and "\n" + verse in train[head]


@pytest.mark.slow  # parses the whole standard library (~10 s)
def test_domain_prompts_code_train_split():
    if not (corpora.default_cache_dir() / "code").is_dir():
        pytest.skip(f"code corpus cache missing ({corpora.default_cache_dir() / 'code'})")
    prompts = distill.domain_prompts("code", 100)
    train = [doc for _, doc in corpora.split_documents(corpora.domain_documents("code"))[0]]
    assert len(prompts) == 100
    text = "\n".join(train)
    for p in prompts:
        assert p.lstrip().startswith(("def ", "async def ")) and p in text, p


@pytest.mark.slow  # CI time (make test ≤ 15 min on a cold clone); `make test-all` runs it
def test_reply_alpha_counts_the_reply_positions_only(greedy, sampled):
    model, _ = greedy
    lm, params, _ = distill.train_drafter(sampled, model, _recipe(steps=5), log=_quiet)
    got = distill.reply_alpha(model, lm, params, sampled, temperature=0.7, bucket=16)
    # By hand: each row alone, its reply positions (p0 - 1 + j predicts generated token j).
    a_sum = t_sum = 0.0
    n = 0
    for r, seq in enumerate(sampled.sequences()):
        x = jnp.asarray(seq[None])
        lv = np.asarray(model.lm.logits_full(model.params, x), np.float64)[0]
        ld = np.asarray(lm.logits_full(params, x), np.float64)[0]
        for t in range(int(sampled.prompt_len[r]) - 1, len(seq) - 1):
            p = np.exp((lv[t] - lv[t].max()) / 0.7)
            q = np.exp((ld[t] - ld[t].max()) / 0.7)
            a_sum += np.minimum(p / p.sum(), q / q.sum()).sum()
            t_sum += lv[t].argmax() == ld[t].argmax()
            n += 1
    assert got["positions"] == n == sampled.n_generated
    assert got["alpha"] == pytest.approx(a_sum / n, abs=1e-5)
    assert got["top1"] == pytest.approx(t_sum / n, abs=1e-9)
    assert 0.0 < got["alpha"] < 1.0
    with pytest.raises(ValueError, match="temperature=0"):
        distill.reply_alpha(model, lm, params, sampled, temperature=0)


def test_train_drafter_continues_from_a_drafter(greedy, sampled):
    model, _ = greedy
    lm, params, _ = distill.train_drafter(sampled, model, _recipe(steps=10), log=_quiet)
    # A zero learning rate keeps the given drafter exactly, subset and all.
    lm0, same, hist0 = distill.train_drafter(
        sampled, model, _recipe(steps=1, learning_rate=0.0), init=(lm, params), log=_quiet
    )
    assert lm0 == lm and hist0["coverage"] <= 1.0
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(same)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    # Continuing lowers the soft loss below where the given drafter stood.
    lm1, more, _ = distill.train_drafter(
        sampled, model, _recipe(steps=40), init=(lm, params), log=_quiet
    )
    np.testing.assert_array_equal(np.asarray(more["keep"]), np.asarray(params["keep"]))
    before, after = _soft_loss(lm, params, sampled), _soft_loss(lm1, more, sampled)
    print(f"\ncontinued: soft loss {before:.3f} -> {after:.3f}")
    assert after < before - 0.05, (before, after)
    other = SubsetVocabLM(lm.config, lm.verifier_vocab + 1)
    with pytest.raises(ValueError, match="init=SubsetVocabLM over 257"):
        distill.train_drafter(sampled, model, _recipe(steps=1), init=(other, params), log=_quiet)


@pytest.mark.parametrize("steps,warmup", [(1, 2), (2, 2), (3, 2), (7, 2), (40, 5), (2000, 50)])
def test_the_schedule_ends_at_a_tenth_on_its_last_step(steps, warmup):
    """`distill.lr_schedule` over ``steps`` steps (0 … steps - 1): it climbs from 0 through
    the warmup, never exceeds the peak, decays monotonically after it, and the last step
    runs at exactly a tenth of the peak (a time-budgeted run that stops at the schedule's
    length ends decayed, not a cosine segment short)."""
    recipe = types.SimpleNamespace(steps=steps, warmup=warmup, learning_rate=1e-3)
    sched = distill.lr_schedule(recipe)
    lr = np.array([float(sched(s)) for s in range(steps)])
    assert lr.max() <= 1e-3 * (1 + 1e-6)
    if steps >= 2:
        assert lr[-1] == pytest.approx(1e-4, rel=1e-6), lr[-3:]
        top = int(np.argmax(lr))
        assert (np.diff(lr[top:]) <= 1e-12).all()
    if steps > warmup + 1:
        assert lr[0] == 0.0 and lr[warmup] == pytest.approx(1e-3, rel=1e-6)
