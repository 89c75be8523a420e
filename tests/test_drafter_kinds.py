"""The drafter kinds (`specjax.models.drafter_kinds`): what the engine asks of a drafter's
model instead of inspecting it.

1. The registry: every shipped model class is bound to its kind (q support, features, weights),
   a model of the LM API without a kind of its own drafts as a transformer, a wrapper that
   forwards its attributes keeps its inner model's kind, names are checked.
2. The recipe of ARCHITECTURE.md's "Adding a drafter kind", proved in this file alone: a toy
   kind (`EchoLM`, a point mass at the token it was just fed, no weights) registered here
   drafts through the engine — its maps from its kind (`drafting_maps`), its point mass
   taken from its kind (q width 1), its verifier check run before the call — and greedy
   speculative decoding with it equals the verifier's own greedy decoding.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import struct

from specjax import testing as suite
from specjax.engine.autoregressive import autoregressive_generate
from specjax.engine.drafting import q_width
from specjax.engine.features import feature_layout
from specjax.engine.generate import row_keys_for, speculative_generate
from specjax.engine.spec import DrafterSpec, EngineConfig, drafting_maps
from specjax.errors import ConfigError
from specjax.measure.price_programs import FreeLM
from specjax.models import drafter_kind, drafter_kinds
from specjax.models.api import TransformerLM
from specjax.models.cache import block_rows
from specjax.models.drafter_kind import DrafterKind, QSupport, register
from specjax.models.eagle import EagleLM, eagle_config
from specjax.models.ngram import PromptLookupLM
from specjax.models.subset_vocab import SubsetVocabLM
from specjax.models.synthetic import BigramLM
from specjax.models.transformer import TransformerConfig

# ----------------------------------------------------------------------------------------
# 1. The registry
# ----------------------------------------------------------------------------------------


def _models():
    cfg = TransformerConfig(
        vocab_size=32, d_model=16, n_layers=2, n_heads=2, n_kv_heads=1, d_ff=32, max_len=32
    )
    return {
        'transformer': TransformerLM(cfg),
        'lookup': PromptLookupLM(32, 32),
        'subset': SubsetVocabLM(dataclasses.replace(cfg, vocab_size=9), 32),
        'eagle': EagleLM(eagle_config(cfg, 8), 32, (0, 2)),
    }


def test_every_shipped_model_class_carries_its_kind():
    models = _models()
    assert set(drafter_kinds.names()) == set(models)
    for name, lm in models.items():
        kind = drafter_kinds.kind_of(lm)
        assert kind is drafter_kinds.get(name) and kind.name == name
        assert isinstance(lm, kind.lm_type)
        assert kind.example is not None
    facts = {
        n: (k.q_support, k.reads_features, k.has_weights)
        for n, k in ((n, drafter_kinds.get(n)) for n in models)
    }
    assert facts == {
        'transformer': (QSupport.DENSE, False, True),
        'lookup': (QSupport.POINT_MASS, False, False),
        'subset': (QSupport.SUBSET, False, True),
        'eagle': (QSupport.HEAD, True, True),
    }
    assert drafter_kinds.get('lookup').point_mass and not drafter_kinds.get('eagle').point_mass
    assert drafter_kinds.get('eagle').verifier_layers(models['eagle']) == (0, 2)


def test_a_model_without_a_kind_drafts_as_a_transformer_and_wrappers_keep_theirs():
    assert drafter_kinds.kind_of(BigramLM(5)) is drafter_kinds.DEFAULT
    assert drafter_kinds.DEFAULT.name == 'transformer'
    for lm in _models().values():  # the round's price programs wrap drafters in FreeLM
        assert drafter_kinds.kind_of(FreeLM(lm, 0)) is drafter_kinds.kind_of(lm)


def test_a_free_verifier_gives_states_of_the_real_shapes_without_a_forward():
    """A round with feature drafters asks the verifier for its states: a round's price
    program (`FreeLM`) gets states of the real shapes without the verifier's forward, which
    is priced apart (its ``verify`` key), not a second time inside the round's price."""
    import jax
    import jax.numpy as jnp

    from specjax.models.api import causal_block_mask

    lm = _models()['transformer']
    params, cache = lm.init_params(0), lm.init_cache(2, 16)
    tok = jnp.ones((2, 4), jnp.int32)
    pos = jnp.broadcast_to(jnp.arange(4), (2, 4))
    mask = causal_block_mask(2, 4)
    free = FreeLM(lm, 3)
    for layers in (None, (0, 2)):
        real = jax.eval_shape(
            lambda p: lm.forward_hidden(p, cache, tok, pos, mask, layers=layers), params
        )
        got = free.forward_hidden(params, cache, tok, pos, mask, layers=layers)
        assert [x.shape for x in got[:2]] == [x.shape for x in real[:2]]
        program = jax.make_jaxpr(
            lambda p: free.forward_hidden(p, cache, tok, pos, mask, layers=layers)[:2]
        )(params)
        assert 'dot_general' not in str(program)
    real = jax.make_jaxpr(lambda p: lm.forward_hidden(p, cache, tok, pos, mask)[:2])(params)
    assert 'dot_general' in str(real)  # the check can fail


def test_names_are_checked():
    with pytest.raises(ConfigError, match=r"drafter kind: got 'medusa'; allowed: one of .*eagle"):
        drafter_kinds.get('medusa')
    assert drafter_kinds.find('medusa') is None and drafter_kinds.find(None) is None
    with pytest.raises(ValueError, match='already registered'):
        register(DrafterKind(name='lookup', lm_type=BigramLM))
    with pytest.raises(ValueError, match='already has the drafter kind'):
        register(DrafterKind(name='lookup2', lm_type=PromptLookupLM))
    with pytest.raises(TypeError, match='q_support'):
        register(DrafterKind(name='x', lm_type=type('X', (), {}), q_support='dense'))


def test_feature_layout_asks_the_kinds():
    m = _models()
    v = m['transformer']
    request, picks = feature_layout(v, [m['lookup'], m['eagle'], m['transformer']])
    assert request == (0, 2) and picks == [None, (0, 1), None]
    assert feature_layout(v, [m['lookup'], m['subset']]) == (False, [None, None])


# ----------------------------------------------------------------------------------------
# 2. A drafter kind added in a test file: the recipe, through the engine
# ----------------------------------------------------------------------------------------


@struct.dataclass
class EchoCache:
    """length: i32[B] (the model reads nothing it was fed before the block)."""

    length: jax.Array


@dataclasses.dataclass(frozen=True)
class EchoLM:
    """A drafter that proposes the token it was just fed again (one-hot logits, no weights):
    its law is a point mass, so its kind says so and the engine drafts its argmax."""

    vocab_size: int
    max_len: int

    def init_params(self, rng=None) -> dict:
        del rng
        return {}

    def init_cache(self, batch: int, capacity: int | None = None) -> EchoCache:
        del capacity
        return EchoCache(length=jnp.zeros((batch,), jnp.int32))

    def advance(self, cache, n):
        n = jnp.broadcast_to(jnp.asarray(n, jnp.int32), cache.length.shape)
        return cache.replace(length=cache.length + n)

    def rollback(self, cache, new_length):
        new_length = jnp.broadcast_to(jnp.asarray(new_length, jnp.int32), cache.length.shape)
        return cache.replace(length=jnp.clip(new_length, 0, cache.length))

    def compact(self, cache, src, n):
        del src
        return self.advance(cache, n)

    def forward(self, params, cache, tokens, positions, block_mask, logits_at=None):
        del params, positions, block_mask
        if logits_at is not None:
            tokens = block_rows(tokens, logits_at)
        hot = jax.nn.one_hot(tokens, self.vocab_size, dtype=jnp.float32)
        return jnp.where(hot > 0, 0.0, -1e9), cache


def _echo_check_verifier(lm, verifier, name: str) -> None:
    if lm.max_len > verifier.max_len:
        raise ConfigError(
            f'drafter {name!r} max_len: got {lm.max_len}; allowed: at most the '
            f"verifier's {verifier.max_len}"
        )


@pytest.fixture
def echo(monkeypatch):
    """The toy kind, registered for this test only (the registry restored after it)."""
    monkeypatch.setattr(drafter_kind, '_KINDS', dict(drafter_kind.registered()))
    kind = register(
        DrafterKind(
            name='echo',
            lm_type=EchoLM,
            q_support=QSupport.POINT_MASS,
            has_weights=False,
            check_verifier=_echo_check_verifier,
            summary='the token just fed, again',
        )
    )
    yield kind
    del EchoLM.drafter_kind  # `register` bound it to the class


def test_a_kind_registered_in_a_test_file_drafts_through_the_engine(echo):
    verifier, v_params, _, _ = suite.tiny_transformers(vocab=32, max_len=64)
    lm = EchoLM(32, 64)
    assert drafter_kinds.kind_of(lm) is echo and 'echo' in drafter_kinds.names()
    d_lm, data = drafting_maps(lm, lm.init_params(), 32)  # as its kind drafts: as it is
    assert d_lm is lm and data.identity and data.support is None
    spec = DrafterSpec('echo', lm, temperature=1.0)
    assert q_width(spec.static, data) == 1  # the engine took the point mass from its kind

    rng = np.random.default_rng(0)
    prompts = [list(map(int, rng.integers(0, 32, 5 + i))) for i in range(4)]
    n, new = len(prompts), 12
    cfg = EngineConfig(gamma=3, rule='rejection', verifier_temperature=0.0, max_new_tokens=new)
    res = speculative_generate(
        cfg, verifier, v_params, [spec], [data], prompts, [prompts], row_keys_for(3, n)
    )
    ar = autoregressive_generate(
        verifier, v_params, prompts, row_keys_for(4, n), temperature=0.0, max_new_tokens=new
    )
    for i, p in enumerate(prompts):
        np.testing.assert_array_equal(res.tokens[i, : len(p) + new], ar.tokens[i, : len(p) + new])
    assert res.counters.proposed.sum() > 0

    # Its check against the verifier runs before any program (a one-line ConfigError).
    too_long = DrafterSpec('echo', EchoLM(32, 128), temperature=1.0)
    with pytest.raises(ConfigError, match=r"drafter 'echo' max_len: got 128"):
        speculative_generate(
            cfg, verifier, v_params, [too_long], [data], prompts, [prompts], row_keys_for(3, n)
        )
