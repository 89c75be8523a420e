"""Tiny Hugging Face folders built locally (no hub): tokenizers in both conventions and
random Llama / Qwen2 / Mistral checkpoints saved by `transformers` itself."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import tokenizers
from tokenizers import (
    AddedToken,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
    trainers,
)

from specjax.data import shipped

_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def corpus() -> list[str]:
    """A few hundred lines of the shipped held-out text (code, prose, reasoning)."""
    lines = []
    for domain in ("code", "prose", "reasoning"):
        lines += shipped.load_heldout(domain).splitlines(keepends=True)[:300]
    return lines


def byte_level_tokenizer(vocab_size: int = 300) -> tokenizers.Tokenizer:
    """Qwen2 / Llama 3 style: NFC, a regex split, ByteLevel without regex, BPE."""
    tok = tokenizers.Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(tokenizers.Regex(_SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[AddedToken("<|endoftext|>", special=True, normalized=False)],
        show_progress=False,
    )
    tok.train_from_iterator(corpus(), trainer=trainer)
    return tok


def sentencepiece_tokenizer(vocab_size: int = 400) -> tokenizers.Tokenizer:
    """Llama 2 / Mistral style: ``▁`` for spaces with a dummy prefix, byte fallback
    (``<0x00>``..``<0xFF>`` at ids 3..258), specials ``<unk> <s> </s>``."""
    trainer_tok = tokenizers.Tokenizer(models.BPE(unk_token="<unk>"))
    trainer_tok.normalizer = normalizers.Replace(" ", "▁")
    trainer_tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    n_pieces = vocab_size - 3 - 256
    trainer = trainers.BpeTrainer(
        vocab_size=n_pieces, limit_alphabet=60, show_progress=False, special_tokens=[]
    )
    trainer_tok.train_from_iterator(corpus(), trainer=trainer)
    spec = json.loads(trainer_tok.to_str())
    learned = sorted(spec["model"]["vocab"].items(), key=lambda kv: kv[1])
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    vocab.update({f"<0x{b:02X}>": 3 + b for b in range(256)})
    for piece, _ in learned:
        vocab.setdefault(piece, len(vocab))
    merges = [
        tuple(m) if isinstance(m, list) else tuple(m.split(" ", 1)) for m in spec["model"]["merges"]
    ]
    tok = tokenizers.Tokenizer(
        models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", byte_fallback=True, fuse_unk=True)
    )
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence(
        [
            decoders.Replace("▁", " "),
            decoders.ByteFallback(),
            decoders.Fuse(),
            decoders.Strip(" ", 1, 0),
        ]
    )
    tok.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t in ("<unk>", "<s>", "</s>")]
    )
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    return tok


FAMILY_CLASSES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM"),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
    "mistral": ("MistralConfig", "MistralForCausalLM"),
}


def hf_model(
    family: str,
    vocab_size: int,
    *,
    d: int = 32,
    layers: int = 2,
    heads: int = 4,
    kv_heads: int = 2,
    ff: int = 64,
    seed: int = 0,
    std: float = 0.3,
    **extra,
):
    """A random transformers model of ``family`` (weights ~ N(0, std), biases included)."""
    import torch
    import transformers

    extra = copy.deepcopy(extra)  # transformers writes into a `rope_scaling` dict it is given
    cfg_cls, model_cls = (getattr(transformers, n) for n in FAMILY_CLASSES[family])
    cfg = cfg_cls(
        vocab_size=vocab_size,
        hidden_size=d,
        intermediate_size=ff,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=extra.pop("max_position_embeddings", 128),
        rms_norm_eps=1e-5,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
        **extra,
    )
    torch.manual_seed(seed)
    model = model_cls(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
            else:
                p.normal_(0.0, std)
    return model


def save_folder(path, model, tokenizer: tokenizers.Tokenizer | None = None, **save_kwargs) -> Path:
    """``save_pretrained`` plus ``tokenizer.json``; returns the folder."""
    path = Path(path)
    model.save_pretrained(path, **save_kwargs)
    if tokenizer is not None:
        tokenizer.save(str(path / "tokenizer.json"))
    return path
