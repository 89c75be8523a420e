"""The real deployment: distilled-drafter files, their HF export, and greedy equality on
SmolLM2-135M-Instruct with every kind of drafter it deploys.

1. `specjax.models.real_zoo`: save/load round trip (bf16 stored as raw bits), one-line
   errors for a missing or inconsistent file; `export_hf` gives an HF Llama whose logits
   at the kept ids are the drafter's.
2. Greedy equality on the real verifier (slow: compiling 30 unrolled layers): verifier
   τ = 0, speculative output identical to autoregressive for a distilled-style subset
   drafter (random weights: its proposals are mostly rejected, which exercises the
   residual path), the prompt-lookup drafter and the cross-vocabulary reasoning drafter
   (the zoo's, its own tokenizer), under rule 1 and the token tree of all three.
"""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax.errors import ConfigError
from specjax.models import real_zoo
from specjax.models.subset_vocab import SubsetVocabLM
from specjax.models.transformer import TransformerConfig

V = 96


def _tiny_subset(seed=0, kept=40):
    cfg = TransformerConfig(
        vocab_size=kept + 1,
        d_model=32,
        n_layers=1,
        n_heads=2,
        n_kv_heads=1,
        d_ff=64,
        max_len=64,
        tie_embeddings=True,
        embed_input_scale=False,
    )
    lm = SubsetVocabLM(cfg, V)
    keep = np.sort(np.random.default_rng(seed).choice(V, kept, replace=False))
    return lm, lm.init_params(seed, keep)


def test_save_load_round_trip_in_bf16(tmp_path):
    lm, params = _tiny_subset()
    path = real_zoo.save_drafter(tmp_path / 'd.npz', lm, params, {'note': 'x'}, dtype='bfloat16')
    lm2, params2, info = real_zoo.load_drafter(path)
    assert lm2 == lm and info['note'] == 'x'
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(params2)):
        if a.dtype.kind == 'f':  # rounded once to bf16, widened back exactly
            np.testing.assert_array_equal(
                np.asarray(a.astype(jnp.bfloat16).astype(jnp.float32)), np.asarray(b)
            )
        else:
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    tokens = jnp.asarray(np.arange(12).reshape(2, 6) % V, jnp.int32)
    assert lm2.logits_full(params2, tokens).shape == (2, 6, V)


def test_load_errors_are_one_line(tmp_path):
    with pytest.raises(ConfigError, match='missing') as e:
        real_zoo.load_drafter(tmp_path / 'nope.npz')
    assert '\n' not in str(e.value)
    lm, params = _tiny_subset()
    path = real_zoo.save_drafter(tmp_path / 'd.npz', lm, params, {})
    meta = json.loads(path.with_suffix('.json').read_text())
    meta['config']['d_model'] = 64
    path.with_suffix('.json').write_text(json.dumps(meta))
    with pytest.raises(ConfigError, match='do not match its config') as e:
        real_zoo.load_drafter(path)
    assert '\n' not in str(e.value)


def test_export_hf_logits_at_kept_ids(tmp_path):
    from specjax.models.hf import load_hf  # pylint: disable=import-outside-toplevel

    lm, params = _tiny_subset(seed=3)
    path = real_zoo.export_hf(tmp_path / 'hf', lm, params)
    hf_lm, hf_params, family = load_hf(path)
    assert family == 'llama' and hf_lm.vocab_size == V
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, V, (2, 9)), jnp.int32)
    ours = np.asarray(lm.logits_full(params, tokens))
    theirs = np.asarray(hf_lm.logits_full(hf_params, tokens))
    keep = np.asarray(params['keep'])
    np.testing.assert_allclose(theirs[..., keep], ours[..., keep], rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------------------
# Greedy equality on the real verifier
# ----------------------------------------------------------------------------------------


@pytest.fixture(scope='module')
def smol():
    from specjax.models import gguf  # pylint: disable=import-outside-toplevel

    try:
        return gguf.smollm2(max_len=512)
    except ConfigError as e:
        pytest.skip(f'SmolLM2 wheel not installed: {e}')


def check_greedy_cases(dep, texts, cases, new):
    """Greedy speculative decoding (verifier τ 0, γ 3) of `texts` through the deployment
    `dep` for each (drafter names, rule) of `cases` equals its autoregressive decoding;
    returns each case's counters."""
    from specjax.engine.autoregressive import (  # pylint: disable=import-outside-toplevel
        autoregressive_generate,
    )
    from specjax.engine.generate import (  # pylint: disable=import-outside-toplevel
        row_keys_for,
        speculative_generate,
    )
    from specjax.engine.spec import EngineConfig  # pylint: disable=import-outside-toplevel

    v_prompts = [dep.encode(t) for t in texts]
    b = len(texts)
    ar = autoregressive_generate(
        dep.verifier,
        dep.v_params,
        v_prompts,
        row_keys_for(0, b),
        temperature=0.0,
        max_new_tokens=new,
        bucket=64,
    )
    counters = []
    for names, rule in cases:
        sub = dep.subset(names)
        res = speculative_generate(
            EngineConfig(
                gamma=3, rule=rule, verifier_temperature=0.0, n_slots=len(names), max_new_tokens=new
            ),
            dep.verifier,
            dep.v_params,
            sub.drafters,
            sub.d_data,
            v_prompts,
            [[e(t) for t in texts] for e in sub.drafter_encode],
            row_keys_for(1, b),
            bucket=64,
        )
        for i, p in enumerate(v_prompts):
            got = res.tokens[i, len(p) : res.length[i]][:new]
            want = ar.tokens[i, len(p) : ar.length[i]][:new]
            n = min(len(got), len(want))
            assert n > 0
            np.testing.assert_array_equal(got[:n], want[:n], err_msg=f'{names} {rule} row {i}')
        counters.append(res.counters)
    return counters


@pytest.mark.slow
def test_greedy_equality_on_smollm2_with_every_drafter_kind(smol, tmp_path):
    from specjax.models.subset_vocab import most_frequent_ids  # pylint: disable=import-outside-toplevel
    from specjax.runner.deployments.smollm2 import from_smollm2  # pylint: disable=import-outside-toplevel

    cfg = TransformerConfig(
        vocab_size=257,
        d_model=64,
        n_layers=1,
        n_heads=2,
        n_kv_heads=1,
        d_ff=128,
        max_len=512,
        tie_embeddings=True,
        embed_input_scale=False,
    )
    lm = SubsetVocabLM(cfg, smol.lm.vocab_size)
    counts = np.zeros(smol.lm.vocab_size)
    for text in ('def f(x):\n    return x + 1\n', 'In the beginning God created'):
        np.add.at(counts, smol.tokenizer.encode(text), 1.0)
    params = lm.init_params(0, most_frequent_ids(counts, 256))
    real_zoo.save_drafter(tmp_path / 'drafter_code.npz', lm, params, {})
    dep = from_smollm2(
        ['code', 'lookup', 'reasoning'],
        verifier=smol,
        drafters={'code': str(tmp_path / 'drafter_code.npz')},
    )
    texts = [
        'def add(a, b):\n    """Return a + b.\n',
        'Genesis 1\nIn the beginning',
        'Q: What is 12 + 30?\n',
    ]
    cases = [
        (['code'], 'rejection'),
        (['lookup'], 'rejection'),
        (['reasoning'], 'rejection'),
        (['reasoning'], 'block_verification'),
        (['code', 'lookup', 'reasoning'], 'token_tree'),
    ]
    check_greedy_cases(dep, texts, cases, new=24)


def test_untied_head_layout_gives_identical_logits(smol):
    """`untie_head` stores the tied table's transpose as lm_head: the same logits, bit for bit."""
    from specjax.models import gguf  # pylint: disable=import-outside-toplevel

    untied = gguf.smollm2(max_len=64, untie_head=True)
    assert not untied.lm.config.tie_embeddings and untied.params['lm_head'].shape == (576, 49152)
    ids = jnp.asarray([smol.tokenizer.encode(smol.chat('Name three colours.'))])
    np.testing.assert_array_equal(
        np.asarray(smol.lm.logits_full(smol.params, ids)),
        np.asarray(untied.lm.logits_full(untied.params, ids)),
    )


@pytest.mark.slow
def test_out_first_layout_on_smollm2_same_logits_and_greedy_speculation_equals_ar(smol):
    """The ``[out, in]`` weight order (`out_first`) on the real file: f32 logits within the
    parity bound of the default order's, and in bf16 (the layout the speed pages run)
    greedy speculative decoding (prompt lookup, rule 1; and a lookup + reasoning token
    tree) gives the bf16 verifier's own greedy tokens."""
    from specjax.models import gguf  # pylint: disable=import-outside-toplevel
    from specjax.runner.deployments.smollm2 import from_smollm2  # pylint: disable=import-outside-toplevel

    of32 = gguf.smollm2(max_len=64, untie_head=True, out_first=True)
    assert of32.lm.config.out_first and of32.params['lm_head'].shape == (49152, 576)
    ids = jnp.asarray([smol.tokenizer.encode(smol.chat('Name three colours.'))])
    np.testing.assert_allclose(
        np.asarray(of32.lm.logits_full(of32.params, ids)),
        np.asarray(smol.lm.logits_full(smol.params, ids)),
        rtol=0,
        atol=1e-4,
    )
    del of32
    dep = from_smollm2(['lookup', 'reasoning'], dtype='bfloat16', max_len=512, out_first=True)
    texts = ['def add(a, b):\n    """Return a + b.\n', 'Q: What is 12 + 30?\n']
    check_greedy_cases(
        dep, texts, [(['lookup'], 'rejection'), (['lookup', 'reasoning'], 'token_tree')], new=24
    )
