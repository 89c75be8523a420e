"""Model families (`ModelFamily`, `specjax.models.families.base`), one module each,
registered by importing them here: a new family is one new module and its name on the
line below."""

from specjax.models.families import gemma3, llama, mistral, qwen2  # noqa: F401  (registration)
from specjax.models.families.base import (  # noqa: F401
    ModelFamily,
    all_families,
    for_gguf,
    for_hf,
    get,
    gguf_architectures,
    hf_architectures,
    names,
    register,
)
