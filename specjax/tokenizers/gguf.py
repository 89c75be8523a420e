"""GGUF tokenizers and chat templates, rebuilt from a GGUF file's metadata.

A GGUF file (llama.cpp's format; `specjax.models.gguf` reads it) carries its tokenizer as
``tokenizer.ggml.*`` metadata and its chat template as ``tokenizer.chat_template``. This
module turns that metadata dict into an `HFTokenizer` and renders the template; it reads
no file (``specjax.models.gguf.gguf_tokenizer`` takes a path).

Tokenizer. ``tokenizer.ggml.model = 'gpt2'`` (byte-level BPE) is rebuilt from
``tokenizer.ggml.tokens`` + ``merges`` with the pre-tokenizer ``tokenizer.ggml.pre``
names (`PRE_TOKENIZERS`); ``'llama'`` (SentencePiece BPE, llama.cpp's SPM tokenizer) from
tokens + scores as BPE merges ranked by score, with byte fallback and llama.cpp's space
prefix. Control tokens (``token_type`` 3) are special tokens, user-defined ones (4)
added tokens; ``tokenizer.ggml.add_bos_token`` becomes the BOS of `prompt_prefix`. The
result is an `HFTokenizer` (byte-exact).

SentencePiece conventions (`SENTENCEPIECE`, the model family's choice: its
``ModelFamily.gguf_sentencepiece``): ``'llama'`` is llama.cpp's SPM tokenizer (merges ranked by
score); ``'gemma'`` is how transformers rebuilds a Gemma file's vocabulary (Gemma's scores do
not follow its merge order, the token order does: merges ranked by id; tokens made of
spaces are spelled with ``▁``; no space prefix), so its ids equal transformers' for the
same file.

Chat template. ``tokenizer.chat_template`` is a Jinja template (as in HF
``tokenizer_config.json``), rendered by `render_chat` in a sandbox the way transformers
does.

Every problem (no tokenizer in the metadata, an unsupported model or pre-tokenizer, a
template that fails) raises one `ConfigError` line naming the file and the field.
"""

from __future__ import annotations

from specjax.errors import ConfigError

__all__ = [
    'PRE_TOKENIZERS',
    'SENTENCEPIECE',
    'tokenizer_spec',
    'tokenizer_from_metadata',
    'render_chat',
]

#: SentencePiece conventions of a ``tokenizer.ggml.model = 'llama'`` vocabulary.
SENTENCEPIECE = ('llama', 'gemma')

# The pre-tokenizers of llama.cpp's ``tokenizer.ggml.pre`` names, in HF tokenizers' terms.
_GPT2_SPLIT = {
    'type': 'ByteLevel',
    'add_prefix_space': False,
    'trim_offsets': True,
    'use_regex': True,
}
_BYTES_ONLY = {
    'type': 'ByteLevel',
    'add_prefix_space': False,
    'trim_offsets': False,
    'use_regex': False,
}
_LLAMA3_RE = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}"
    r"\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_RE = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}"
    r"\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def _split(regex: str) -> dict:
    return {'type': 'Split', 'pattern': {'Regex': regex}, 'behavior': 'Isolated', 'invert': False}


#: ``tokenizer.ggml.pre`` -> HF pre-tokenizer (byte-level BPE vocabularies).
PRE_TOKENIZERS = {
    'default': _GPT2_SPLIT,
    'gpt-2': _GPT2_SPLIT,
    'gpt2': _GPT2_SPLIT,
    'smollm': {
        'type': 'Sequence',
        'pretokenizers': [{'type': 'Digits', 'individual_digits': True}, _GPT2_SPLIT],
    },
    'llama-bpe': {'type': 'Sequence', 'pretokenizers': [_split(_LLAMA3_RE), _BYTES_ONLY]},
    'llama3': {'type': 'Sequence', 'pretokenizers': [_split(_LLAMA3_RE), _BYTES_ONLY]},
    'qwen2': {'type': 'Sequence', 'pretokenizers': [_split(_QWEN2_RE), _BYTES_ONLY]},
}


def _fail(msg: str) -> ConfigError:
    return ConfigError(' '.join(msg.split()))


def tokenizer_spec(meta: dict, where: str, sentencepiece: str = 'llama') -> dict:
    """A ``tokenizer.json`` (HF tokenizers) rebuilt from ``tokenizer.ggml.*`` metadata
    (``sentencepiece``: the convention of a SentencePiece vocabulary, `SENTENCEPIECE`)."""
    if sentencepiece not in SENTENCEPIECE:
        raise _fail(f'{where}: sentencepiece={sentencepiece!r} (allowed: {SENTENCEPIECE})')
    model, tokens, types = _vocabulary(meta, where)
    if model == 'gpt2':
        return _gpt2_spec(meta, where, tokens, _added_tokens(tokens, types))
    if model == 'llama' and sentencepiece == 'gemma':
        return _gemma_spec(meta, where, tokens, types)
    if model == 'llama':
        return _llama_spec(meta, where, tokens, types, _added_tokens(tokens, types))
    raise _fail(
        f"{where}: metadata tokenizer.ggml.model={model!r} is not supported "
        f"(allowed: 'gpt2', 'llama')"
    )


def _vocabulary(meta: dict, where: str) -> tuple[str, list[str], list[int]]:
    """The metadata's tokenizer model, its tokens and one token type per token, checked."""
    model = meta.get('tokenizer.ggml.model')
    tokens = meta.get('tokenizer.ggml.tokens')
    if model is None or tokens is None:
        missing = 'tokenizer.ggml.model' if model is None else 'tokenizer.ggml.tokens'
        raise _fail(
            f'{where}: metadata {missing} is missing (no tokenizer in the file; '
            f'allowed: a file with tokenizer.ggml.model and tokenizer.ggml.tokens)'
        )
    tokens = [str(t) for t in tokens]
    types = list(meta.get('tokenizer.ggml.token_type') or [1] * len(tokens))
    if len(types) != len(tokens):
        raise _fail(
            f'{where}: metadata tokenizer.ggml.token_type has {len(types)} entries '
            f'for {len(tokens)} tokens (allowed: one per token)'
        )
    return model, tokens, types


def _added_tokens(tokens: list[str], types: list[int], keep=None) -> list[dict]:
    """The ``added_tokens`` entries: control tokens (type 3, special) and user-defined (4)
    (``keep``: a predicate on the id, None: all)."""
    return [
        {
            'id': i,
            'content': t,
            'single_word': False,
            'lstrip': False,
            'rstrip': False,
            'normalized': False,
            'special': types[i] == 3,
        }
        for i, t in enumerate(tokens)
        if types[i] in (3, 4) and (keep is None or keep(i))
    ]


def _gpt2_spec(meta: dict, where: str, tokens: list[str], added: list[dict]) -> dict:
    """The ``tokenizer.json`` of a ``gpt2`` (byte-level BPE) vocabulary."""
    merges = meta.get('tokenizer.ggml.merges')
    if merges is None:
        raise _fail(
            f'{where}: metadata tokenizer.ggml.merges is missing (a gpt2 BPE '
            f'vocabulary needs its merges)'
        )
    pre = meta.get('tokenizer.ggml.pre', 'default')
    if pre not in PRE_TOKENIZERS:
        raise _fail(
            f'{where}: metadata tokenizer.ggml.pre={pre!r} is not supported '
            f'(allowed: {", ".join(map(repr, PRE_TOKENIZERS))})'
        )
    return {
        'version': '1.0',
        'truncation': None,
        'padding': None,
        'added_tokens': added,
        'normalizer': None,
        'pre_tokenizer': PRE_TOKENIZERS[pre],
        'post_processor': _bos_processor(meta, tokens, default=False),
        'decoder': {
            'type': 'ByteLevel',
            'add_prefix_space': True,
            'trim_offsets': True,
            'use_regex': True,
        },
        'model': {
            'type': 'BPE',
            'dropout': None,
            'unk_token': None,
            'continuing_subword_prefix': None,
            'end_of_word_suffix': None,
            'fuse_unk': False,
            'byte_fallback': False,
            'ignore_merges': False,
            'vocab': {t: i for i, t in enumerate(tokens)},
            'merges': [str(m) for m in merges],
        },
    }


def _llama_spec(
    meta: dict, where: str, tokens: list[str], types: list[int], added: list[dict]
) -> dict:
    """The ``tokenizer.json`` of a ``llama`` (SentencePiece BPE) vocabulary."""
    scores = meta.get('tokenizer.ggml.scores')
    if scores is None or len(scores) != len(tokens):
        raise _fail(
            f'{where}: metadata tokenizer.ggml.scores is missing or not one per '
            f'token (a SentencePiece vocabulary needs its scores)'
        )
    unk = _unknown(meta, where, tokens)
    space = [{'type': 'Replace', 'pattern': {'String': ' '}, 'content': '▁'}]
    prefix = bool(meta.get('tokenizer.ggml.add_space_prefix', True))
    if prefix:
        space.insert(0, {'type': 'Prepend', 'prepend': '▁'})
    return {
        'version': '1.0',
        'truncation': None,
        'padding': None,
        'added_tokens': added,
        # llama.cpp prepends a space to every text fragment (after each special token
        # too) and spells spaces as ▁: HF's "legacy" Llama normalizer, per fragment.
        'normalizer': {'type': 'Sequence', 'normalizers': space},
        'pre_tokenizer': None,
        'post_processor': _bos_processor(meta, tokens, default=True),
        'decoder': _spm_decoder(prefix),
        'model': _spm_model(tokens, tokens[unk], _spm_merges(tokens, scores, types)),
    }


def _spm_decoder(prefix: bool) -> dict:
    steps = [
        {'type': 'Replace', 'pattern': {'String': '▁'}, 'content': ' '},
        {'type': 'ByteFallback'},
        {'type': 'Fuse'},
    ]
    if prefix:  # the space prefix added at encoding
        steps.append({'type': 'Strip', 'content': ' ', 'start': 1, 'stop': 0})
    return {'type': 'Sequence', 'decoders': steps}


def _spm_model(tokens: list[str], unk: str, merges: list) -> dict:
    return {
        'type': 'BPE',
        'dropout': None,
        'unk_token': unk,
        'continuing_subword_prefix': None,
        'end_of_word_suffix': None,
        'fuse_unk': True,
        'byte_fallback': True,
        'ignore_merges': False,
        'vocab': {t: i for i, t in enumerate(tokens)},
        'merges': merges,
    }


def _unknown(meta: dict, where: str, tokens: list[str]) -> int:
    unk = int(meta.get('tokenizer.ggml.unknown_token_id', 0))
    if not 0 <= unk < len(tokens):
        raise _fail(
            f'{where}: metadata tokenizer.ggml.unknown_token_id={unk} is not a '
            f'token id (allowed: 0..{len(tokens) - 1})'
        )
    return unk


def _gemma_spec(meta: dict, where: str, tokens: list[str], types: list[int]) -> dict:
    """The ``tokenizer.json`` transformers builds for a Gemma file's SentencePiece
    vocabulary (``GemmaTokenizer`` from ``integrations/gguf``): runs of spaces spelled with
    ``▁``, merges from every split of every piece ranked by the piece's id (then the
    longer left half, as ``generate_merges`` sorts), spaces as ``▁`` with no prefix, byte
    fallback, control tokens special and user-defined ones added (except the respelled
    runs of spaces, which are ordinary pieces there)."""
    unk = _unknown(meta, where, tokens)
    spelt = ['▁' * len(t) if ' ' in t and not t.strip() else t for t in tokens]
    added = _added_tokens(spelt, types, keep=lambda i: spelt[i] == tokens[i])
    return {
        'version': '1.0',
        'truncation': None,
        'padding': None,
        'added_tokens': added,
        'normalizer': {
            'type': 'Sequence',
            'normalizers': [{'type': 'Replace', 'pattern': {'String': ' '}, 'content': '▁'}],
        },
        'pre_tokenizer': None,
        'post_processor': _bos_processor(meta, spelt, default=True),
        'decoder': _spm_decoder(False),
        'model': _spm_model(spelt, spelt[unk], _id_ranked_merges(spelt)),
    }


def _id_ranked_merges(tokens: list[str]) -> list[list[str]]:
    """transformers' ``generate_merges(vocab, {token: -id})``: every split ``(a, b)`` of
    every piece with both halves in the vocabulary, ranked by the piece's id (a later
    duplicate's), then by the longer left half, then by the longer right half; splits of
    one piece in the order of their halves' ids."""
    vocab = {t: i for i, t in enumerate(tokens)}
    merges = []
    for piece, rank in vocab.items():
        local = [
            (piece[:k], piece[k:])
            for k in range(1, len(piece))
            if piece[:k] in vocab and piece[k:] in vocab
        ]
        local.sort(key=lambda ab: (vocab[ab[0]], vocab[ab[1]]))
        merges.extend((a, b, -rank) for a, b in local)
    merges.sort(key=lambda m: (m[2], len(m[0]), len(m[1])), reverse=True)
    return [[a, b] for a, b, _ in merges]


def _spm_merges(tokens: list[str], scores, types: list[int]) -> list[list[str]]:
    """BPE merges equivalent to llama.cpp's SentencePiece tokenizer (``llm_tokenizer_spm``).

    That tokenizer starts from characters and repeatedly joins the adjacent pair whose
    concatenation is a vocabulary piece with the highest score (SentencePiece's BPE: the
    score is minus the merge rank). As HF merges: every split ``(a, b)`` of a piece with
    both halves in the vocabulary, ranked by the piece's score (ties: id, then split).
    Control, unknown and byte tokens (types 2, 3, 6) are never the result of a merge.
    A Unigram model over the same scores segments differently (Viterbi over sums of
    scores) and is not what these files were tokenized with.
    """
    ids = {}
    for i, t in enumerate(tokens):
        ids.setdefault(t, i)
    ranked = []
    for i, t in enumerate(tokens):
        if types[i] in (2, 3, 6) or ids[t] != i:
            continue
        for k in range(1, len(t)):
            if t[:k] in ids and t[k:] in ids:
                ranked.append((-float(scores[i]), i, k))
    ranked.sort()
    return [[tokens[i][:k], tokens[i][k:]] for _, i, k in ranked]


def _bos_processor(meta: dict, tokens: list[str], default: bool) -> dict | None:
    """HF post-processor adding BOS when the file says llama.cpp adds it
    (``tokenizer.ggml.add_bos_token``; default: SentencePiece files yes, BPE files no), so
    `HFTokenizer.prompt_prefix` is the BOS the model was trained with."""
    bos = meta.get('tokenizer.ggml.bos_token_id')
    if (
        not meta.get('tokenizer.ggml.add_bos_token', default)
        or bos is None
        or not 0 <= int(bos) < len(tokens)
    ):
        return None
    t = tokens[int(bos)]
    return {
        'type': 'TemplateProcessing',
        'single': [
            {'SpecialToken': {'id': t, 'type_id': 0}},
            {'Sequence': {'id': 'A', 'type_id': 0}},
        ],
        'pair': [
            {'SpecialToken': {'id': t, 'type_id': 0}},
            {'Sequence': {'id': 'A', 'type_id': 0}},
            {'Sequence': {'id': 'B', 'type_id': 1}},
        ],
        'special_tokens': {t: {'id': t, 'ids': [int(bos)], 'tokens': [t]}},
    }


def tokenizer_from_metadata(
    meta: dict, where: str, name: str, pad_to: int | None = None, sentencepiece: str = 'llama'
):
    """The `HFTokenizer` of a GGUF file's metadata (`where` names the file in errors;
    `pad_to`: as `HFTokenizer`'s, the model's embedding rows; `sentencepiece`: the
    convention of a SentencePiece vocabulary, `SENTENCEPIECE`)."""
    from specjax.tokenizers.hf import HFTokenizer  # pylint: disable=import-outside-toplevel

    spec = tokenizer_spec(meta, where, sentencepiece)
    try:
        return HFTokenizer(spec, name=name, pad_to=pad_to)
    except ConfigError as e:
        raise _fail(f'{where}: {e}') from None


def render_chat(
    template: str, messages: list[dict], *, add_generation_prompt: bool = True, **extra
) -> str:
    """Renders a chat template (Jinja, as in HF ``tokenizer_config.json``) the way
    transformers does: sandboxed, ``trim_blocks`` and ``lstrip_blocks``, loop controls
    (``break`` / ``continue``), ``raise_exception``, ``strftime_now`` and a ``tojson``
    filter that keeps non-ASCII text; ``extra`` (``bos_token``, ...) are template
    variables."""
    try:
        from jinja2.sandbox import ImmutableSandboxedEnvironment  # pylint: disable=import-outside-toplevel
    except ImportError:
        raise _fail("chat templates need the 'jinja2' package (pip install jinja2)") from None
    import datetime  # pylint: disable=import-outside-toplevel
    import json  # pylint: disable=import-outside-toplevel

    def raise_exception(message):
        raise _fail(f'chat template: {message}')

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(
            x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
        )

    def strftime_now(fmt):
        return datetime.datetime.now().strftime(fmt)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=['jinja2.ext.loopcontrols']
    )
    env.filters['tojson'] = tojson
    env.globals['raise_exception'] = raise_exception
    env.globals['strftime_now'] = strftime_now
    try:
        return env.from_string(template).render(
            messages=messages, add_generation_prompt=add_generation_prompt, **extra
        )
    except ConfigError:
        raise
    except Exception as e:  # jinja2 syntax / undefined errors
        raise _fail(f'chat template: {type(e).__name__}: {e}') from None
