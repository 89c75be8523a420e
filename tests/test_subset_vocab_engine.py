"""FR-Spec subset-vocabulary drafters through the engine (the model: test_subset_vocab.py).

2. Losslessness: χ² against the exact target law (tests/test_verify.py's harness and
   tolerance: N = 100,000 rows, α = 1e-3, cells with expected count < 5 pooled) with
   subset drafters over the bigram verifier of `specjax.testing`. The subsets leave out ids
   the verifier emits (the start token among them), so q = 0 on tokens of positive p and
   those tokens only come from residual / fresh samples.
3. Greedy equality (verifier τ = 0) through the engine on a tiny transformer verifier with
   a subset drafter cut from the verifier itself (high acceptance, and rejections where
   the verifier's argmax lies outside the subset); another subset of the same size reuses
   the compiled program.

Each drafter runs in both of its engine forms: the `SubsetVocabLM` with identity maps
(drafting over the verifier's ids) and its inner model with `drafting_maps` (drafting
in its own K + 1 ids, as deployments run it).
"""

from __future__ import annotations

import dataclasses
import functools
import zlib

import jax.numpy as jnp
import numpy as np
import pytest
from lossless_reference import reference_law
from test_verify import ALPHA, LENGTH, START, N, chi2_pvalue

from specjax import testing as suite
from specjax.engine import programs
from specjax.engine.autoregressive import autoregressive_generate
from specjax.engine.generate import row_keys_for, speculative_generate
from specjax.engine.spec import DrafterSpec, EngineConfig, drafting_maps, identity_maps
from specjax.models.api import TransformerLM
from specjax.models.subset_vocab import SubsetVocabLM, most_frequent_ids
from specjax.models.transformer import TransformerConfig
from specjax.verify import registry

# ----------------------------------------------------------------------------------------
# 2. Losslessness: χ² against the exact law
# ----------------------------------------------------------------------------------------

# The bigram verifier's ids 0..4: subset A leaves out START (1) and 4, subset B leaves out
# 0, 2 and 3; both have q = 0 on ids of positive p.
KEEP_A, KEEP_B = np.array([0, 2, 3], np.int32), np.array([1, 4], np.int32)


def _subset_drafter(keep, seed, sharpen):
    # As small as a transformer gets: at N = 100,000 rows its forwards are most of the run.
    cfg = TransformerConfig(
        vocab_size=len(keep) + 1, d_model=8, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=16, max_len=8
    )
    lm = SubsetVocabLM(cfg, suite.V)
    params = lm.init_params(seed, keep)
    params["inner"]["lm_head"] = params["inner"]["lm_head"] * sharpen  # a peaked, wrong q
    return lm, params


def engine_form(lm, params, form):
    """(lm, DrafterData) of a subset drafter in the engine form `form` (module docstring)."""
    if form == "own_ids":
        return drafting_maps(lm, params, lm.vocab_size)
    return lm, identity_maps(params, lm.vocab_size)


FORMS = ("identity", "own_ids")


def engine_prompt(data, prompt):
    """A prompt of verifier ids in the ids the drafter with DrafterData `data` reads."""
    if data.identity:
        return list(prompt)
    return [int(i) for i in np.asarray(data.retok)[np.asarray(prompt), 0]]


def _chi2_drafters(setup, both, form):
    """[subset A (τ 1), the suite's model drafter d0, and subset B (τ 0: one-hot q) when
    `both`, else the suite's partial-vocabulary drafter d2 (cross-vocabulary)]."""
    la, da = engine_form(*_subset_drafter(KEEP_A, 1, 5.0), form)
    specs = [DrafterSpec("subsetA", la, temperature=1.0), setup.drafters[0]]
    data = [da, setup.d_data[0]]
    if both:
        lb, db = engine_form(*_subset_drafter(KEEP_B, 2, 3.0), form)
        specs.append(DrafterSpec("subsetB", lb, temperature=0.0))
        data.append(db)
    else:
        specs.append(setup.drafters[2])
        data.append(setup.d_data[2])
    return tuple(specs), tuple(data)


def _chi2_run(rule, slots_n, seed, both=False, n=N, form="identity"):
    setup = suite.make_setup("random", seed=41)
    specs, data = _chi2_drafters(setup, both, form)
    prompts = [[START]] * n
    dp = suite.drafter_prompts([START])
    # A subset drafter's prompt is in its engine form's ids (the own-ids form reads inner ids).
    third = engine_prompt(data[2], dp[0]) if both else dp[2]
    d_prompts = [[engine_prompt(data[0], dp[0])] * n, [dp[0]] * n, [third] * n]
    # Rule 1: every row verifies subset A's chain; otherwise each row's block holds the
    # three chains.
    slots = np.zeros((n, 1), np.int32) if slots_n == 1 else None
    cfg = EngineConfig(
        gamma=2, rule=rule, verifier_temperature=1.0, n_slots=slots_n, max_new_tokens=LENGTH
    )
    res = speculative_generate(
        cfg,
        setup.verifier,
        setup.v_params,
        specs,
        data,
        prompts,
        d_prompts,
        row_keys_for(seed, n),
        slots=slots,
    )
    assert (res.length - res.start == LENGTH).all()
    return setup, res, res.tokens[:, 1 : 1 + LENGTH]


def _check_chi2(rule, setup, res, seqs, subset_slots):
    exact = reference_law(setup.v_table, 1.0, START, LENGTH)
    # The verifier emits ids outside subset A (so residual sampling is exercised).
    assert exact.sum(axis=(1, 2))[np.setdiff1d(np.arange(suite.V), KEEP_A)].min() > 0.01
    p_value = chi2_pvalue(seqs, exact)
    c = res.counters
    print(
        f"\nsubset {rule}: χ² p = {p_value:.3g}; accepted per drafter "
        f"{c.accepted.sum(0).tolist()} of {c.proposed.sum(0).tolist()}, rejected "
        f"{c.rejected.sum(0).tolist()}"
    )
    assert p_value >= ALPHA, f"subset drafter, {rule}: χ² rejects (p = {p_value:.3g})"
    # The subset drafters drafted, and had drafts both accepted and rejected...
    for k in subset_slots:
        assert c.rejected[:, k].sum() > 0 and c.accepted[:, k].sum() < c.proposed[:, k].sum()
        if rule == "coupled_block" and len(subset_slots) == 2:
            # ...except where the coupled shared block needs every chain to hold the
            # verifier's token: the two subsets are disjoint, so no draft is ever accepted.
            assert c.accepted.sum() == 0
        else:
            assert c.accepted[:, k].sum() > 0


_FAST = ("rejection", "token_tree")
_RULES_SLOTS = [(r.name, 1 if r.one_chain else 3) for r in registry.all_rules()]


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize(
    "rule,slots_n",
    [(r, s) if r in _FAST else pytest.param(r, s, marks=pytest.mark.slow) for r, s in _RULES_SLOTS],
)
def test_subset_drafter_is_lossless(rule, slots_n, form):
    seed = zlib.crc32(f"subset/{rule}/{form}".encode())
    setup, res, seqs = _chi2_run(rule, slots_n, seed=seed, form=form)
    _check_chi2(rule, setup, res, seqs, (0,))


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize(
    "rule",
    [
        r if r == "token_tree" else pytest.param(r, marks=pytest.mark.slow)
        for r in registry.names()
        if not registry.get(r).one_chain
    ],
)
def test_two_subset_drafters_are_lossless(rule, form):
    """Two subsets in one block: A sampled at τ 1, B greedy (a one-hot q on {1, 4})."""
    seed = zlib.crc32(f"subset2/{rule}/{form}".encode())
    setup, res, seqs = _chi2_run(rule, 3, seed=seed, both=True, form=form)
    _check_chi2(rule, setup, res, seqs, (0, 2))


# ----------------------------------------------------------------------------------------
# 3. Greedy equality on a tiny transformer verifier
# ----------------------------------------------------------------------------------------

# A tiny transformer verifier over bytes (tied embeddings, unscaled inputs: the config a
# distilled drafter's inner model gets from `specjax.train.distill.train_drafter`). Its subset
# drafters with K = GREEDY_KEPT share one engine program with the distilled drafter of
# tests/test_distill.py (same SubsetVocabLM, same engine config and shapes).
BYTE_CONFIG = TransformerConfig(
    vocab_size=256,
    d_model=32,
    n_layers=2,
    n_heads=4,
    n_kv_heads=2,
    d_ff=64,
    max_len=64,
    tie_embeddings=True,
    embed_input_scale=False,
)
GREEDY_KEPT, GREEDY_ROWS, GREEDY_NEW = 20, 8, 16


@functools.lru_cache(maxsize=1)
def byte_verifier():
    """(TransformerLM, params) of the tiny byte verifier (fixed seed; built once)."""
    lm = TransformerLM(BYTE_CONFIG)
    return lm, lm.init_params(7)


def subset_of(v_lm: TransformerLM, v_params, keep):
    """A SubsetVocabLM cut from a transformer verifier: its layers, its embedding / head
    rows of `keep`, and the mean of the other rows as the "other" row. Its argmax is the
    verifier's wherever that lies in `keep` and the context lies inside `keep`."""
    keep = np.asarray(keep)
    cfg = v_lm.config
    lm = SubsetVocabLM(dataclasses.replace(cfg, vocab_size=len(keep) + 1), cfg.vocab_size)
    rest = np.ones(cfg.vocab_size, bool)
    rest[keep] = False
    params = lm.init_params(0, keep)
    inner = dict(v_params)
    embed = np.asarray(v_params["embed"])
    inner["embed"] = jnp.asarray(np.concatenate([embed[keep], embed[rest].mean(0)[None]]))
    if not cfg.tie_embeddings:
        head = np.asarray(v_params["lm_head"])
        inner["lm_head"] = jnp.asarray(
            np.concatenate([head[:, keep], head[:, rest].mean(1)[:, None]], 1)
        )
    params["inner"] = inner
    return lm, params


def greedy_prompts(seed, vocab=256, n=GREEDY_ROWS):
    """n ragged prompts of 2..9 random ids."""
    rng = np.random.default_rng(seed)
    return [list(map(int, rng.integers(0, vocab, 2 + i % 8))) for i in range(n)]


def greedy_reference(verifier, v_params, prompts, new=GREEDY_NEW):
    """The verifier's greedy decoding (the engine's autoregressive baseline)."""
    return autoregressive_generate(
        verifier,
        v_params,
        prompts,
        row_keys_for(4, len(prompts)),
        temperature=0.0,
        max_new_tokens=new,
        min_width=16,
    )


def check_greedy_equality(
    verifier,
    v_params,
    d_lm,
    d_params,
    prompts,
    ar,
    temperature=0.0,
    new=GREEDY_NEW,
    form="identity",
):
    """Speculative decoding at verifier τ = 0 (rule 1, γ = 3) with the drafter (in engine
    form `form`) equals the autoregressive result `ar`; returns the engine's counters."""
    d_lm, d_data = engine_form(d_lm, d_params, form)
    n = len(prompts)
    cfg = EngineConfig(
        gamma=3, rule="rejection", verifier_temperature=0.0, n_slots=1, max_new_tokens=new
    )
    spec = speculative_generate(
        cfg,
        verifier,
        v_params,
        [DrafterSpec("subset", d_lm, temperature=temperature)],
        [d_data],
        prompts,
        [[engine_prompt(d_data, p) for p in prompts]],
        row_keys_for(3, n),
        min_width=16,
        drafter_min_width=[16],
    )
    for i, p in enumerate(prompts):
        np.testing.assert_array_equal(spec.tokens[i, : len(p) + new], ar.tokens[i, : len(p) + new])
    return spec.counters


@pytest.mark.parametrize("form", FORMS)
def test_greedy_equals_autoregressive_on_a_tiny_transformer(form):
    """The subset is nearly the K ids the verifier writes most (FR-Spec's choice), so many
    drafts are accepted and the rest (argmax outside the subset) rejected."""
    verifier, v_params = byte_verifier()
    counts = []
    for seed in (0, 1):  # a second batch and subset of the same size: the same program
        prompts = greedy_prompts(seed)
        ar = greedy_reference(verifier, v_params, prompts)
        written = np.concatenate([ar.new_tokens(i) for i in range(len(prompts))])
        freq = np.bincount(written, minlength=256)
        # The most written ids but the 2nd and the 5th: their rows' drafts are rejected.
        ranked = most_frequent_ids(freq, GREEDY_KEPT + 2)
        ranked = ranked[np.lexsort((ranked, -freq[ranked]))]
        keep = np.sort(np.delete(ranked, [1, 4]))
        assert 0 < freq[keep].sum() < len(written)
        lm, params = subset_of(verifier, v_params, keep)
        before = programs.compiled_programs()
        c = check_greedy_equality(
            verifier,
            v_params,
            lm,
            params,
            prompts,
            ar,
            temperature=0.0 if seed == 0 else 0.8,
            form=form,
        )
        if seed:
            assert programs.compiled_programs() == before, "a new subset retraced"
        counts.append((int(c.accepted[:, 0].sum()), int(c.rejected[:, 0].sum())))
    print("\naccepted / rejected per batch:", counts)
    assert all(a > 0 and r > 0 for a, r in counts), counts
