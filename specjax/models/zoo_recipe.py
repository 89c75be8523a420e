"""The shipped tiny zoo's recipe (SPEC §8; built by experiments/train_zoo.py): its domains,
how much of each it is trained on, its three tokenizers (and their training:
`build_tokenizers`), its five models (role, tokenizer, token shares, config, training
settings, τ, seed) and the deployment's drafter order.
"""

from __future__ import annotations

DOMAINS = ('code', 'prose', 'reasoning')
SEED = 0
#: Bytes of each domain's train split used for the models (a prefix cut at a newline).
TRAIN_BYTES = 3_000_000
#: Bytes of each domain's train split used to train the tokenizers.
TOKENIZER_BYTES = 1_500_000
#: Prose and code bytes added to the reasoning tokenizer's corpus (it drafts mixed traffic).
REASONING_TOKENIZER_OTHER_BYTES = 300_000

#: Longest verifier token, in bytes (None = uncapped). The shipped zoo is uncapped: its
#: verifier learns code-indentation tokens of up to ~20 spaces, which the prose and
#: reasoning tokenizers spell one space at a time (M = 19 in `retokenization_table`). The
#: engine bounds the block that feeds such a drafter instead (engine/decode.py:
#: consume_width). A cap of 6 gives M <= 5 at a small cost in compression (bytes/token on
#: held-out prose 2.68 -> 2.63); it changes the tokenizer, so it needs a retrained zoo.
VERIFIER_MAX_TOKEN_BYTES = None

TOKENIZERS = {
    # name: (vocab size, {domain: bytes}, special tokens, longest token in bytes or None)
    'verifier': (1024, {d: TOKENIZER_BYTES for d in DOMAINS}, (), VERIFIER_MAX_TOKEN_BYTES),
    'reasoning': (
        768,
        {
            'reasoning': TOKENIZER_BYTES,
            'prose': REASONING_TOKENIZER_OTHER_BYTES,
            'code': REASONING_TOKENIZER_OTHER_BYTES,
        },
        'REASONING',
        None,
    ),
    'prose512': (512, {'prose': TOKENIZER_BYTES}, (), None),
}


def _mix(own: str, **others: float) -> dict[str, float]:
    """Token shares of a drafter trained on the mixed traffic with emphasis on ``own``
    (``others``: the other domains' shares; the rest is ``own``'s)."""
    shares = {d: others.get(d, 0.2) for d in DOMAINS if d != own}
    shares[own] = round(1.0 - sum(shares.values()), 6)
    return {d: shares[d] for d in DOMAINS}


MODELS = {
    # name: role, tokenizer, token shares per domain, config (vocab_size filled in),
    # training, default τ, seed.
    'verifier': dict(
        role='verifier',
        tokenizer='verifier',
        domains={d: 1 / 3 for d in DOMAINS},
        config=dict(
            d_model=256, n_layers=4, n_heads=4, n_kv_heads=2, d_ff=688, tie_embeddings=False
        ),
        train=dict(steps=600, batch_size=8, seq_len=256, learning_rate=2e-3, warmup_steps=50),
        temperature=1.0,
        seed=1,
    ),
    'code': dict(
        role='drafter',
        tokenizer='verifier',
        domains=_mix('code', reasoning=0.02),
        config=dict(d_model=64, n_layers=2, n_heads=2, n_kv_heads=1, d_ff=176, tie_embeddings=True),
        train=dict(steps=800, batch_size=16, seq_len=256, learning_rate=4e-3, warmup_steps=40),
        temperature=1.0,
        seed=2,
    ),
    'prose': dict(
        role='drafter',
        tokenizer='verifier',
        domains=_mix('prose', reasoning=0.02),
        config=dict(
            d_model=128, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=352, tie_embeddings=True
        ),
        train=dict(steps=500, batch_size=16, seq_len=256, learning_rate=3e-3, warmup_steps=40),
        temperature=1.0,
        seed=3,
    ),
    'reasoning': dict(
        role='drafter',
        tokenizer='reasoning',
        domains=_mix('reasoning'),
        config=dict(
            d_model=128, n_layers=4, n_heads=4, n_kv_heads=2, d_ff=352, tie_embeddings=True
        ),
        train=dict(steps=400, batch_size=16, seq_len=256, learning_rate=3e-3, warmup_steps=40),
        temperature=1.3,
        seed=4,
    ),
    'prose512': dict(
        role='drafter',
        tokenizer='prose512',
        domains={'prose': 1.0},
        config=dict(
            d_model=128, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=352, tie_embeddings=True
        ),
        train=dict(steps=400, batch_size=16, seq_len=256, learning_rate=3e-3, warmup_steps=40),
        temperature=1.0,
        seed=5,
    ),
}
MAX_LEN = 512
DRAFTERS = ('code', 'prose', 'reasoning')  # the seed's deployment, in priority order
EXTRA_DRAFTERS = ('prose512',)  # loadable by name (tokenizer-pairing sweep)
ACCEPTANCE_WINDOW = 128  # verifier tokens of context per held-out window


def scaled_steps(train: dict, scale: float) -> dict:
    """``train`` with its step count scaled by ``scale`` (at least 10 steps; warm-up at most
    a quarter of them): `--budget_scale` of a small build."""
    steps = max(10, int(round(train['steps'] * scale)))
    return dict(train, steps=steps, warmup_steps=min(train['warmup_steps'], steps // 4))


def prefix_at_newline(text: str, nbytes: int) -> str:
    """The longest prefix of ``text`` of at most ``nbytes`` UTF-8 bytes ending at a newline
    (all of it if it is shorter)."""
    data = text.encode('utf-8')
    if len(data) <= nbytes:
        return text
    return data[: data.rfind(b'\n', 0, nbytes) + 1].decode('utf-8')


def _lines(text: str) -> list[str]:
    return text.splitlines(keepends=True)


def train_bpe_capped(
    texts,
    vocab_size: int,
    special_tokens=(),
    name: str = 'bpe',
    max_token_length: int | None = None,
):
    """`specjax.tokenizers.train_bpe` plus HF's ``max_token_length`` (no token longer than
    that many byte-level symbols, i.e. bytes); None: exactly `train_bpe`."""
    from specjax.tokenizers import train_bpe

    if max_token_length is None:
        return train_bpe(texts, vocab_size, special_tokens=special_tokens, name=name)
    from tokenizers import AddedToken, pre_tokenizers, trainers

    from specjax.tokenizers.bpe import BPETokenizer, new_byte_level_bpe

    hf = new_byte_level_bpe()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=0,
        special_tokens=[AddedToken(s, special=True, normalized=False) for s in special_tokens],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
        max_token_length=max_token_length,
    )
    hf.train_from_iterator(texts, trainer=trainer)
    return BPETokenizer(hf, name=name)


def build_tokenizers(corpora: dict[str, str]):
    from specjax.data import REASONING_SPECIAL_TOKENS

    out, info = {}, {}
    for name, (vocab, sources, specials, max_len) in TOKENIZERS.items():
        texts = []
        for dom, nbytes in sources.items():
            texts += _lines(prefix_at_newline(corpora[dom], nbytes))
        specials = REASONING_SPECIAL_TOKENS if specials == 'REASONING' else specials
        out[name] = train_bpe_capped(
            texts, vocab, special_tokens=specials, name=name, max_token_length=max_len
        )
        if out[name].vocab_size != vocab:
            raise RuntimeError(f'tokenizer {name}: got {out[name].vocab_size} ids, wanted {vocab}')
        info[name] = dict(trained_on_bytes=dict(sources), max_token_bytes=max_len)
    return out, info
