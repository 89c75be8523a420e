"""Deployments of Hugging Face checkpoints by local path (``deployment = 'hf'`` configs).

A config names a verifier folder and drafter folders (each ``config.json`` +
safetensors + ``tokenizer.json``, of any supported family: Llama, Qwen2, Mistral)::

    c.deployment = 'hf'
    c.verifier = '/models/llama-3.1-70b'
    c.drafters = {'code': {'path': '/models/qwen2.5-coder-1.5b', 'temperature': 1.0}, ...}
    c.mesh = {'data': 1, 'model': 8}; c.rules = 'fsdp_tp'

`validate_hf` checks every folder as the loader will read it, without reading a weight;
`load_hf_deployment` loads them (streaming into shards when a mesh is set) and builds
the `Deployment` (`specjax.engine.deployment.build_deployment`): identity maps for drafters
whose tokenizer equals the verifier's, token-level-intersection maps (through token bytes,
`specjax.tokenizers.hf`) otherwise. Validation loads no model: a cell's context budget is
bounded from ``max_len`` (else the verifier's config.json) alone (`HFKind.context`).
`memory_table` gives per-device estimates from the ``config.json`` files alone.
"""

from __future__ import annotations

import functools
import json
import math
from pathlib import Path

import jax
from absl import logging
from ml_collections import ConfigDict

from specjax.engine.deployment import Deployment, build_deployment
from specjax.errors import ConfigError, check
from specjax.models.hf import check_hf_model, config_from_hf, estimate_bytes, load_hf_model
from specjax.models.hf_config import context_length, read_config_json
from specjax.runner.deployments.kind import MAX_LEN, DeploymentKind, register
from specjax.runtime import sharding as shd

__all__ = [
    'HF_DTYPES',
    'HF_FIELDS',
    'HFKind',
    'drafter_names',
    'load_hf_deployment',
    'memory_table',
    'validate_hf',
]

#: Fields of a ``deployment = 'hf'`` config.
HF_FIELDS = ('verifier', 'drafters', 'pad_vocab', 'bos', 'max_len', 'dtype', 'mesh', 'rules')
HF_DTYPES = ('float32', 'bfloat16', 'float16')


def drafter_names(config) -> list[str]:
    return list((config.get('drafters') or {}).keys())


def validate_hf(config) -> None:
    """Checks the hf fields (paths exist and hold a config.json) before anything loads."""
    v = config.get('verifier')
    check(
        isinstance(v, str) and (Path(v) / 'config.json').is_file(),
        'verifier',
        v,
        'a local Hugging Face folder holding config.json (pass --config.verifier=PATH)',
    )
    drafters = config.get('drafters') or {}
    check(
        hasattr(drafters, 'items') and len(drafters) >= 1,
        'drafters',
        dict(drafters) if hasattr(drafters, 'items') else drafters,
        'one or more named drafters (name -> {path, temperature, cost})',
    )
    for name, d in drafters.items():
        check(hasattr(d, 'get'), f'drafters.{name}', d, 'a dict with path, temperature, cost')
        p = d.get('path')
        check(
            isinstance(p, str) and (Path(p) / 'config.json').is_file(),
            f'drafters.{name}.path',
            p,
            'a local Hugging Face folder holding config.json '
            f'(pass --config.drafters.{name}.path=PATH)',
        )
        t = d.get('temperature', 1.0)
        check(
            isinstance(t, (int, float)) and not isinstance(t, bool) and math.isfinite(t) and t >= 0,
            f'drafters.{name}.temperature',
            t,
            'a finite number >= 0',
        )
        c = d.get('cost')
        check(
            c is None
            or (
                isinstance(c, (int, float))
                and not isinstance(c, bool)
                and math.isfinite(c)
                and c >= 0
            ),
            f'drafters.{name}.cost',
            c,
            'None (the parameter count over the verifier\'s) or a finite number >= 0',
        )
    bos = config.get('bos', True)
    check(isinstance(bos, bool), 'bos', bos, 'true or false')
    mesh = config.get('mesh') or {}
    check(hasattr(mesh, 'get'), 'mesh', mesh, 'a dict {data, model}')
    for axis in ('data', 'model'):
        n = mesh.get(axis, 1)
        check(
            isinstance(n, int) and not isinstance(n, bool) and 1 <= n <= 4096,
            f'mesh.{axis}',
            n,
            'an integer >= 1 and <= 4096',
        )
    try:
        shd.resolve_rules(config.get('rules') or 'tp')
    except ValueError as e:
        raise ConfigError.invalid(
            'rules', config.get('rules'), f'one of {sorted(shd.RULE_SETS)}'
        ) from e
    _check_folders(config)


def _models(config) -> list[tuple[str, str]]:
    """(config field, folder) of the verifier and each drafter."""
    return [('verifier', config.get('verifier'))] + [
        (f'drafters.{n}.path', d.get('path')) for n, d in (config.get('drafters') or {}).items()
    ]


def _check_folders(config) -> None:
    """Every folder as `load_hf_model` will read it, without reading a weight
    (`specjax.models.hf.check_hf_model`: config.json, architecture, heads, rope, shards
    present and complete, tokenizer), ``max_len`` within every model's context, and the
    mesh buildable on this machine's devices with every model's parameters placeable on
    it. Each problem is one `ConfigError` naming the config field."""
    max_len = config.get('max_len')
    check(
        max_len is None
        or (isinstance(max_len, int) and not isinstance(max_len, bool) and max_len >= 1),
        'max_len',
        max_len,
        'None (each model\'s own context, at most 4096) or an integer >= 1',
    )
    checked = []
    for field, path in _models(config):
        try:
            ckpt, _ = check_hf_model(
                path,
                pad_vocab=bool(config.get('pad_vocab')),
                max_len=max_len,
                dtype=config.get('dtype') or 'float32',
            )
        except ConfigError as e:
            raise ConfigError.invalid(
                field, path, f'a Hugging Face folder specjax can load; {e}'
            ) from None
        context = context_length(ckpt.hf)
        check(
            max_len is None or context is None or max_len <= context,
            'max_len',
            max_len,
            f'at most every model\'s context ({field} {path}: max_position_embeddings={context})',
        )
        checked.append((field, path, ckpt))
    mesh = _mesh(config)
    if mesh is None:
        return
    model = int(mesh.shape['model'])
    heads = checked[0][2].config.n_heads
    check(
        heads % model == 0,
        'mesh.model',
        model,
        f'a divisor of the verifier\'s {heads} query heads (tensor parallelism splits them '
        f'over the model axis; verifier {checked[0][1]}: num_attention_heads={heads}): '
        f'one of {", ".join(str(d) for d in _divisors(heads))}',
    )
    for field, path, ckpt in checked:
        try:
            shd.param_shardings(ckpt.lm, mesh, config.get('rules') or 'tp')
        except (ValueError, TypeError) as e:
            m = dict(config.get('mesh') or {})
            raise ConfigError.invalid(
                'mesh',
                m,
                f'a mesh {field} ({path}) can be placed on by rules '
                f'{config.get("rules") or "tp"!r} ({" ".join(str(e).split())[:200]})',
            ) from None


def _mesh(config):
    mesh = config.get('mesh') or {}
    data, model = int(mesh.get('data', 1)), int(mesh.get('model', 1))
    if data * model == 1:
        return None
    n_dev = jax.device_count()
    check(
        n_dev % (data * model) == 0,
        'mesh',
        dict(mesh),
        f'data × model ({data} × {model} = {data * model}) dividing this machine\'s {n_dev} '
        f'devices: one of {", ".join(str(d) for d in _divisors(n_dev))}',
    )
    try:
        return shd.make_mesh(data, model)
    except (ValueError, RuntimeError) as e:
        raise ConfigError.invalid(
            'mesh',
            dict(mesh),
            f'data × model at most this machine\'s {n_dev} devices '
            f'({" ".join(str(e).split())[:200]})',
        ) from None


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def load_hf_deployment(config):
    """The deployment a ``deployment = 'hf'`` config describes (cached per config)."""
    key = json.dumps(
        {
            k: (config.get(k).to_dict() if hasattr(config.get(k), 'to_dict') else config.get(k))
            for k in (
                'verifier',
                'drafters',
                'mesh',
                'rules',
                'max_len',
                'dtype',
                'pad_vocab',
                'bos',
            )
        },
        sort_keys=True,
        default=str,
    )
    return _load(key)


@functools.lru_cache(maxsize=2)
def _load(key: str):
    c = json.loads(key)
    mesh = _mesh(ConfigDict(c))
    kw = dict(
        max_len=c.get('max_len'),
        dtype=c.get('dtype') or 'float32',
        pad_vocab=bool(c.get('pad_vocab')),
        mesh=mesh,
        rules=c.get('rules') or 'tp',
    )
    for row in memory_table(ConfigDict(c), batch=1):
        logging.info(
            'hf %s (%s): per device %.3f GiB params + %.3f GiB KV cache per row',
            row['model'],
            row['family'],
            row['params'] / 2**30,
            row['kv_cache'] / 2**30,
        )
    verifier = load_hf_model(c['verifier'], **kw)
    drafters = []
    for name, d in c['drafters'].items():
        m = load_hf_model(d['path'], **kw)
        drafters.append((name, m, float(d.get('temperature', 1.0)), d.get('cost')))
    bos = c.get('bos')
    return build_deployment(verifier, drafters, bos=True if bos is None else bool(bos))


def memory_table(config, batch: int = 1) -> list[dict]:
    """Per-device bytes (params, KV cache at ``max_len``) of each model of the config, on
    its mesh and rules, from the ``config.json`` files alone (no weights read)."""
    mesh = dict(config.get('mesh') or {})
    mesh_shape = {'data': int(mesh.get('data', 1)), 'model': int(mesh.get('model', 1))}
    rows = []
    models = [('verifier', config.verifier)] + [
        (n, d['path']) for n, d in (config.get('drafters') or {}).items()
    ]
    for name, path in models:
        hf_cfg = read_config_json(Path(path) / 'config.json')
        cfg, family = config_from_hf(
            hf_cfg, max_len=config.get('max_len'), dtype=config.get('dtype') or 'float32'
        )
        est = estimate_bytes(
            cfg, batch=batch, mesh_shape=mesh_shape, rules=config.get('rules') or 'tp'
        )
        rows.append({'model': name, 'family': family, 'path': str(path), **est})
    return rows


class HFKind(DeploymentKind):
    """Hugging Face folders by local path (`configs/real_models.py`): validated from their
    files without reading a weight, loaded once per config."""

    name = 'hf'
    fields = HF_FIELDS
    pretrained = True
    summary = 'Hugging Face folders by local path (Llama, Qwen2, Mistral)'

    def check_values(self, config) -> None:
        value = config.get('max_len')
        check(
            value is None
            or (isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= MAX_LEN),
            'max_len',
            value,
            f'None (each model\'s own context) or an integer >= 1 and <= {MAX_LEN}',
        )
        check(
            config.get('dtype') in (None, *HF_DTYPES), 'dtype', config.get('dtype'), list(HF_DTYPES)
        )
        for field in ('pad_vocab', 'bos'):
            value = config.get(field, True)
            check(isinstance(value, bool), field, value, 'true or false')
        self.check_fields(config)

    def validate(self, config) -> tuple[dict | None, set[str]]:
        validate_hf(config)
        return None, set(drafter_names(config))

    def full(self, config) -> Deployment:
        return load_hf_deployment(config)

    def load(self, config, pairing=None, weights: bool = True) -> Deployment | None:
        # Validation loads no model: the context is bounded from the config files alone.
        return super().load(config, pairing) if weights else None

    def drafter_names(self, config) -> list[str]:
        return drafter_names(config)

    def describe_verifier(self, config: dict, inputs: dict) -> str:
        v = config.get('verifier')
        return v if isinstance(v, str) else super().describe_verifier(config, inputs)

    def context(self, config) -> int:
        """``max_len``, else the verifier's own context (its config.json)."""
        max_len = config.get('max_len')
        if max_len is not None:
            return max_len
        path = Path(config.verifier) / 'config.json'
        try:
            return config_from_hf(json.loads(path.read_text()), where=str(path))[0].max_len
        except (OSError, ValueError, TypeError, KeyError) as e:
            raise ConfigError.invalid(
                'verifier',
                config.verifier,
                f'a Hugging Face folder whose config.json reads ({" ".join(str(e).split())[:200]})',
            ) from None


register(HFKind())
