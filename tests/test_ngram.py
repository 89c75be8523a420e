"""Prompt-lookup (n-gram) drafting (`specjax.models.ngram`): the matcher, its cache, and the
engine with it as a drafter.

1. The matcher against a plain-Python reference on random ragged histories (longest
   suffix first, most recent occurrence, fallback to the last token), through the cache's
   forward / advance / rollback / compact, and past capacity.
2. Losslessness: χ² against the exact target law (tests/test_verify.py's harness and
   tolerance: N = 100,000 rows, α = 1e-3, cells with expected count < 5 pooled) under every
   rule in `RULES`, the n-gram drafter alone (rule 1) and beside a model drafter (multi-chain
   rules). Prompts are random histories ending with the start token, so the drafter's
   proposals (a deterministic function of the whole history) differ from row to row while
   the bigram verifier's law of the next tokens is the exact law after the start token.
3. Greedy equality (verifier τ = 0) on a tiny transformer, and the plan runner with a
   policy at τ = 0 on the synthetic deployment plus the n-gram drafter.
4. No retrace: one compiled forward / engine program serves different histories.
"""

from __future__ import annotations

import dataclasses
import types
import zlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from lossless_reference import reference_law
from test_verify import ALPHA, LENGTH, START, N, chi2_pvalue

from specjax import testing as suite
from specjax.engine import programs
from specjax.engine.autoregressive import autoregressive_generate
from specjax.engine.deployment import LOOKUP, assemble, from_zoo, prompt_lookup_drafter
from specjax.engine.generate import row_keys_for, speculative_generate
from specjax.engine.spec import DrafterSpec, EngineConfig, identity_maps
from specjax.models.api import causal_block_mask, count_params
from specjax.models.ngram import NEG, PromptLookupLM, lookup_predictions
from specjax.verify import registry
from specjax.verify.distributions import sampling_probs

# ----------------------------------------------------------------------------------------
# 1. The matcher against a plain-Python reference
# ----------------------------------------------------------------------------------------


def ref_predict(ctx: list[int], max_n: int, min_n: int) -> int:
    """The token after the most recent earlier occurrence of the longest suffix of `ctx`
    (max_n down to min_n tokens), else ctx[-1]."""
    e = len(ctx) - 1
    for n in range(max_n, min_n - 1, -1):
        if n > e + 1:
            continue
        suffix = ctx[e - n + 1 :]
        for j in range(e - 1, n - 2, -1):  # most recent first; j + 1 <= e
            if ctx[j - n + 1 : j + 1] == suffix:
                return ctx[j + 1]
    return ctx[e]


def test_reference_by_hand():
    assert ref_predict([1, 2, 3, 1, 2], 3, 1) == 3  # "1 2" → 3
    assert ref_predict([1, 2, 9, 2, 5, 1, 2], 3, 1) == 9  # longest ("1 2") beats recent ("2")
    assert ref_predict([1, 2, 9, 2, 5, 1, 2], 1, 1) == 5  # "2": the most recent, at 3
    assert ref_predict([4, 7], 3, 1) == 7  # no match: repeat the last
    assert ref_predict([3, 3, 3], 3, 1) == 3  # overlapping occurrences
    assert ref_predict([1, 2, 5, 2], 3, 2) == 2  # min_ngram 2: "5 2" absent


def _forward(lm):
    return jax.jit(
        lambda cache, tokens: lm.forward(
            {},
            cache,
            tokens,
            jnp.zeros_like(tokens),
            causal_block_mask(tokens.shape[0], tokens.shape[1]),
        )
    )


def _check_block(lm, logits, history, block):
    """The logits after every block token against the reference (history: the committed
    tokens of each row, block: i32[B, T])."""
    pred = np.asarray(jnp.argmax(logits, -1))
    for b in range(block.shape[0]):
        for t in range(block.shape[1]):
            ctx = list(history[b]) + [int(x) for x in block[b, : t + 1]]
            assert pred[b, t] == ref_predict(ctx, lm.max_ngram, lm.min_ngram), (b, t, ctx)


def _committed(cache) -> list[list[int]]:
    toks, ln = np.asarray(cache.tokens), np.asarray(cache.length)
    return [list(map(int, toks[b, : ln[b]])) for b in range(toks.shape[0])]


@pytest.mark.parametrize("vocab,max_n,min_n", [(3, 3, 1), (4, 2, 2), (20, 4, 2), (5, 1, 1)])
def test_matcher_against_reference(vocab, max_n, min_n):
    rng = np.random.default_rng(vocab * 100 + max_n * 10 + min_n)
    lm = PromptLookupLM(vocab, 64, max_ngram=max_n, min_ngram=min_n)
    fwd = _forward(lm)
    b, cap = 6, 40
    cache = lm.init_cache(b, cap)
    history = [[] for _ in range(b)]
    for step in range(6):
        block = rng.integers(0, vocab, (b, 5 if step else 12)).astype(np.int32)
        logits, cache = fwd(cache, jnp.asarray(block))
        assert logits.dtype == jnp.float32 and logits.shape == (b, block.shape[1], vocab)
        _check_block(lm, logits, history, block)
        # Ragged commits: each row keeps its own number of the block's tokens.
        keep = rng.integers(0, block.shape[1] + 1, b).astype(np.int32)
        cache = lm.advance(cache, jnp.asarray(keep))
        history = [h + list(block[i, : keep[i]]) for i, h in enumerate(history)]
        assert _committed(cache) == history
        if step == 3:  # rollback to a random shorter length per row
            new = np.array([rng.integers(0, len(h) + 1) for h in history], np.int32)
            cache = lm.rollback(cache, jnp.asarray(new))
            history = [h[:n] for h, n in zip(history, new)]
            assert _committed(cache) == history


def test_compact_moves_the_accepted_path():
    rng = np.random.default_rng(5)
    lm = PromptLookupLM(4, 64, max_ngram=3)
    fwd = _forward(lm)
    b = 8
    cache = lm.init_cache(b, 32)
    prompt = rng.integers(0, 4, (b, 6)).astype(np.int32)
    _, cache = fwd(cache, jnp.asarray(prompt))
    lens = rng.integers(1, 7, b).astype(np.int32)
    cache = lm.advance(cache, jnp.asarray(lens))
    history = [list(prompt[i, : lens[i]]) for i in range(b)]
    tree = rng.integers(0, 4, (b, 7)).astype(np.int32)  # a block scored as a tree
    _, cache = fwd(cache, jnp.asarray(tree))
    src = np.stack([rng.permutation(7)[:4] for _ in range(b)]).astype(np.int32)
    n = rng.integers(0, 5, b).astype(np.int32)
    cache = lm.compact(cache, jnp.asarray(src), jnp.asarray(n))
    history = [h + [int(tree[i, s]) for s in src[i, : n[i]]] for i, h in enumerate(history)]
    assert _committed(cache) == history
    block = rng.integers(0, 4, (b, 3)).astype(np.int32)
    logits, _ = fwd(cache, jnp.asarray(block))
    _check_block(lm, logits, history, block)


def test_overflow_drops_writes_but_predicts_exactly():
    lm = PromptLookupLM(3, 16, max_ngram=2)
    fwd = _forward(lm)
    rng = np.random.default_rng(1)
    first = rng.integers(0, 3, (2, 6)).astype(np.int32)
    cache = lm.advance(fwd(lm.init_cache(2, 8), jnp.asarray(first))[1], 6)
    block = rng.integers(0, 3, (2, 5)).astype(np.int32)  # slots 6..10 of 8
    logits, cache2 = fwd(cache, jnp.asarray(block))
    _check_block(lm, logits, [list(r) for r in first], block)
    np.testing.assert_array_equal(cache2.tokens[:, :6], first)
    np.testing.assert_array_equal(cache2.tokens[:, 6:], block[:, :2])
    assert np.asarray(lm.advance(cache2, 5).length).tolist() == [8, 8]  # capped


def test_logits_are_one_hot_at_every_temperature():
    lm = PromptLookupLM(7, 32)
    toks = jnp.asarray(np.random.default_rng(2).integers(0, 7, (3, 9)), jnp.int32)
    logits, _ = _forward(lm)(lm.init_cache(3, 16), toks)
    pred = jnp.argmax(logits, -1)
    onehot = jax.nn.one_hot(pred, 7)
    np.testing.assert_array_equal(logits, jnp.where(onehot > 0, 0.0, NEG))
    taus = (0.0, 0.3, 1.0, 2.0, 1e3)
    qs = jax.jit(
        lambda x: jnp.stack(
            [sampling_probs(x, t) for t in taus] + [sampling_probs(x, 1.0, top_k=2, top_p=0.5)]
        )
    )(logits)
    for q in qs:  # every temperature, and top-k / top-p: the same one-hot
        np.testing.assert_array_equal(q, onehot)
    # The matcher on its own: queries at any positions of a sequence.
    seq = jnp.asarray([[1, 2, 3, 1, 2, 4, 1, 2]], jnp.int32)
    out = lookup_predictions(seq, jnp.asarray([[0, 4, 7]]), 3, 1)
    assert out.tolist() == [[1, 3, 4]]


def test_validation_and_empty_params():
    with pytest.raises(ValueError, match="min_ngram"):
        PromptLookupLM(5, 8, max_ngram=2, min_ngram=3)
    with pytest.raises(ValueError, match="max_ngram"):
        PromptLookupLM(5, 8, max_ngram=0)
    with pytest.raises(ValueError, match="capacity"):
        PromptLookupLM(5, 8).init_cache(1, 9)
    lm = PromptLookupLM(5, 8)
    assert hash(lm) == hash(PromptLookupLM(5, 8)) and lm == PromptLookupLM(5, 8)
    assert lm.init_params() == {} and count_params({}) == 0
    assert lm.init_cache(2).tokens.shape == (2, 8)


# ----------------------------------------------------------------------------------------
# 2. Losslessness: χ² against the exact law, every rule
# ----------------------------------------------------------------------------------------


def _lookup_drafters(setup):
    """[lookup (n ≤ 3), the model drafter d0 (the verifier's ids), lookup (n = 1, τ = 0)]."""
    v = suite.V
    specs = (
        DrafterSpec("lookup", PromptLookupLM(v, 64), temperature=1.0),
        setup.drafters[0],
        DrafterSpec("lookup1", PromptLookupLM(v, 64, max_ngram=1), temperature=0.0),
    )
    data = (identity_maps({}, v), setup.d_data[0], identity_maps({}, v))
    return specs, data


def _histories(rng, n):
    """n random prompts of 1–10 tokens over the verifier's ids, each ending with START."""
    lens = rng.integers(1, 11, n)
    body = rng.integers(0, suite.V, (n, 10))
    return [list(map(int, body[i, : lens[i] - 1])) + [START] for i in range(n)]


def _lookup_run(rule, slots_n, seed, n=N):
    setup = suite.make_setup("random", seed=31)
    specs, data = _lookup_drafters(setup)
    rng = np.random.default_rng(seed)
    prompts = _histories(rng, n)
    # Rule 1: each row verifies one of the two lookup drafters; otherwise every row's block
    # holds the lookup chain, the model drafter's and the unigram lookup's.
    slots = np.where(np.arange(n) % 2 == 0, 0, 2)[:, None] if slots_n == 1 else None
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
        [prompts] * 3,
        row_keys_for(seed, n),
        slots=slots,
    )
    plen = np.array([len(p) for p in prompts])
    assert (res.length - res.start == LENGTH).all()
    seqs = np.take_along_axis(res.tokens, plen[:, None] + np.arange(LENGTH)[None, :], axis=1)
    return setup, res, seqs


# Rule 1 and the token tree run in `make test`; the others (~20 s of compilation each) in
# `make test-all`.
_FAST = ("rejection", "token_tree")
_RULES_SLOTS = [(r.name, 1 if r.one_chain else 3) for r in registry.all_rules()]


@pytest.mark.parametrize(
    "rule,slots_n",
    [(r, s) if r in _FAST else pytest.param(r, s, marks=pytest.mark.slow) for r, s in _RULES_SLOTS],
)
def test_lookup_drafter_is_lossless(rule, slots_n):
    setup, res, seqs = _lookup_run(rule, slots_n, seed=zlib.crc32(f"lookup/{rule}".encode()))
    p_value = chi2_pvalue(seqs, reference_law(setup.v_table, 1.0, START, LENGTH))
    c = res.counters
    print(
        f"\nlookup {rule}: χ² p = {p_value:.3g}; accepted per drafter "
        f"{c.accepted.sum(0).tolist()} of {c.proposed.sum(0).tolist()}"
    )
    assert p_value >= ALPHA, f"lookup drafter, {rule}: χ² rejects (p = {p_value:.3g})"
    # The lookup drafters' proposals were verified and some accepted.
    assert c.proposed[:, 0].sum() > 0 and c.accepted[:, 0].sum() > 0
    assert c.accepted[:, 2].sum() > 0


# ----------------------------------------------------------------------------------------
# 3. Greedy equality on a tiny transformer; the plan runner with a policy
# ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny():
    verifier, v_params, specs, data = suite.tiny_transformers(vocab=32, max_len=64)
    lookup = DrafterSpec("lookup", PromptLookupLM(32, 64), temperature=1.0)
    return verifier, v_params, (lookup,) + specs, (identity_maps({}, 32),) + data


def _tiny_prompts(seed, n=8):
    rng = np.random.default_rng(seed)
    # Short repeated motifs, so that lookups hit, and ragged lengths.
    out = []
    for i in range(n):
        motif = list(map(int, rng.integers(0, 32, 3)))
        out.append((motif * 4)[: 6 + i % 5])
    return out


# Rule 1 with the lookup drafter alone runs in `make test`; the token tree of the lookup
# drafter and a transformer drafter (~30 s of compilation) in `make test-all`.
@pytest.mark.parametrize(
    "rule,drafters",
    [("rejection", (0,)), pytest.param("token_tree", (0, 1), marks=pytest.mark.slow)],
)
def test_greedy_equals_autoregressive_on_a_tiny_transformer(tiny, rule, drafters):
    verifier, v_params, specs, data = tiny
    specs, data = [specs[k] for k in drafters], [data[k] for k in drafters]
    n, new, s_n = 8, 20, len(drafters)
    cfg = EngineConfig(
        gamma=3, rule=rule, verifier_temperature=0.0, n_slots=s_n, max_new_tokens=new
    )
    for seed in (0, 1):  # the second batch: other histories, the same program
        prompts = _tiny_prompts(seed, n)
        before = programs.compiled_programs()
        spec = speculative_generate(
            cfg,
            verifier,
            v_params,
            specs,
            data,
            prompts,
            [prompts] * s_n,
            row_keys_for(3, n),
            min_width=16,
            drafter_min_width=[16] * s_n,
        )
        if seed:
            assert programs.compiled_programs() == before, "a new history retraced"
        ar = autoregressive_generate(
            verifier, v_params, prompts, row_keys_for(4, n), temperature=0.0, max_new_tokens=new
        )
        for i, p in enumerate(prompts):
            np.testing.assert_array_equal(
                spec.tokens[i, : len(p) + new], ar.tokens[i, : len(p) + new]
            )
        # The lookup drafter's proposals were accepted (rows of repeated motifs).
        assert spec.counters.accepted[:, 0].sum() > 0


def _lookup_deployment():
    """The synthetic deployment plus the lookup drafter (index 3, the verifier's group)."""
    dep, _ = suite.make_deployment("random", seed=7)
    lm = PromptLookupLM(suite.V, 1 << 10)
    return dataclasses.replace(
        dep,
        drafters=dep.drafters + (DrafterSpec(LOOKUP, lm, temperature=1.0, cost=0.0),),
        d_data=dep.d_data + (identity_maps({}, suite.V),),
        groups=dep.groups + ("verifier",),
        drafter_encode=dep.drafter_encode + (dep.encode,),
    )


def test_plan_runner_with_a_lookup_drafter_is_greedy_exact():
    """A policy over the synthetic deployment plus the lookup drafter (the verifier's
    tokenizer group) commits the verifier's greedy text: carried histories, catch-up of a
    drafter that sat out a step, prefill at first use."""
    from specjax.policy.plan import run_plans  # pylint: disable=import-outside-toplevel
    from specjax.policy.plan_config import PlanConfig  # pylint: disable=import-outside-toplevel
    from specjax.policy.switches import Policy  # pylint: disable=import-outside-toplevel

    dep = _lookup_deployment()
    cfg = PlanConfig(gamma=3, verifier_temperature=0.0, plan_steps=2, max_step_tokens=6, bucket=16)
    prompts = ["abab", "c", "ddad", "bcbc"]
    ref, _ = run_plans(dep, cfg, prompts)
    texts, _ = run_plans(dep, cfg, prompts, policy=Policy.all_on())
    assert texts == ref


@pytest.mark.slow  # the single-drafter baseline's programs (~30 s of compilation)
def test_plan_runner_lookup_baseline_is_greedy_exact():
    from specjax.policy.plan import run_plans  # pylint: disable=import-outside-toplevel
    from specjax.policy.plan_config import PlanConfig  # pylint: disable=import-outside-toplevel

    dep = _lookup_deployment()
    cfg = PlanConfig(gamma=3, verifier_temperature=0.0, plan_steps=2, max_step_tokens=6, bucket=16)
    prompts = ["abab", "c", "ddad", "bcbc"]
    ref, _ = run_plans(dep, cfg, prompts)
    solo, _ = run_plans(dep, cfg, prompts, single=3)  # the lookup drafter alone
    assert solo == ref


# ----------------------------------------------------------------------------------------
# 4. No retrace; the deployment helpers
# ----------------------------------------------------------------------------------------


def test_one_compiled_forward_serves_every_history():
    lm = PromptLookupLM(6, 32)
    fwd = jax.jit(lambda cache, tokens: lm.forward({}, cache, tokens, None, None))
    rng = np.random.default_rng(4)
    cache = lm.init_cache(4, 24)
    for _ in range(4):
        block = jnp.asarray(rng.integers(0, 6, (4, 3)), jnp.int32)
        _, cache = fwd(cache, block)
        cache = lm.advance(cache, jnp.asarray(rng.integers(0, 4, 4), jnp.int32))
    assert fwd._cache_size() == 1  # pylint: disable=protected-access


def test_deployment_helpers():
    from specjax.models.api import TransformerLM  # pylint: disable=import-outside-toplevel
    from specjax.models.transformer import TransformerConfig  # pylint: disable=import-outside-toplevel
    from specjax.tokenizers import ByteTokenizer  # pylint: disable=import-outside-toplevel

    tok = ByteTokenizer()
    v = TransformerLM(
        TransformerConfig(
            vocab_size=256, d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=32, max_len=48
        )
    )
    entry = prompt_lookup_drafter(v, tok, max_ngram=4)
    name, lm, params, t, temp, cost = entry
    assert (name, params, t, temp, cost) == (LOOKUP, {}, tok, 1.0, 0.0)
    assert (lm.vocab_size, lm.max_len, lm.max_ngram) == (256, 48, 4)
    dep = assemble(v, {}, tok, [entry])
    assert dep.names == (LOOKUP,) and dep.d_data[0].identity
    # from_zoo: 'lookup' beside the zoo's drafters (a stand-in zoo with none loaded).
    zoo = types.SimpleNamespace(
        names=(),
        verifier=types.SimpleNamespace(lm=v, params={}, tokenizer=tok),
        drafter=lambda n: pytest.fail(f"zoo.drafter({n!r}) called"),
    )
    dep = from_zoo(zoo, names=[LOOKUP], temperatures={LOOKUP: 0.0}, costs=[0.001])
    assert dep.names == (LOOKUP,) and isinstance(dep.drafters[0].lm, PromptLookupLM)
    assert dep.drafters[0].temperature == 0.0 and dep.drafters[0].cost == 0.001
    assert dep.drafter_encode[0]("ab") == dep.encode("ab")


def test_from_zoo_with_lookup():
    from specjax.models.zoo import load_zoo  # pylint: disable=import-outside-toplevel

    zoo = load_zoo()
    first = zoo.names[0]
    dep = from_zoo(zoo, names=[LOOKUP, first])
    assert dep.names == (LOOKUP, first)
    lm = dep.drafters[0].lm
    assert isinstance(lm, PromptLookupLM) and lm.vocab_size == zoo.verifier.lm.vocab_size
    assert dep.d_data[0].identity and dep.d_data[0].params == {}
    assert dep.drafters[0].cost == 0.0 and dep.drafters[1].cost == zoo.drafter(first).cost
    assert dep.groups[0] == zoo.verifier.tokenizer.fingerprint()


def test_logits_full_equals_token_by_token_forward():
    lm = PromptLookupLM(50, 64)
    t = jnp.asarray(np.random.default_rng(0).integers(0, 5, (3, 24)), jnp.int32)
    cache, steps = lm.init_cache(3, 32), []
    for i in range(t.shape[1]):
        lg, cache = lm.forward({}, cache, t[:, i : i + 1], None, None)
        cache = lm.advance(cache, jnp.ones(3, jnp.int32))
        steps.append(np.asarray(lg[:, 0]))
    np.testing.assert_array_equal(np.asarray(lm.logits_full({}, t)), np.stack(steps, 1))
