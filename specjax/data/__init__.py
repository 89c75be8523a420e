"""Data: the code / prose / reasoning corpora, the reasoning generator, and the held-out
texts and plan prompts shipped with the package."""

from specjax.data.corpora import (
    DOMAINS,
    CorpusUnavailableError,
    build_domain,
    default_cache_dir,
    load_domain,
)
from specjax.data.reasoning import (
    REASONING_SPECIAL_TOKENS,
    THINK_CLOSE,
    THINK_OPEN,
    generate_problems,
    generate_reasoning,
)
from specjax.data.shipped import load_heldout, load_prompts

__all__ = [
    "DOMAINS",
    "REASONING_SPECIAL_TOKENS",
    "THINK_CLOSE",
    "THINK_OPEN",
    "CorpusUnavailableError",
    "build_domain",
    "default_cache_dir",
    "generate_problems",
    "generate_reasoning",
    "load_domain",
    "load_heldout",
    "load_prompts",
]
