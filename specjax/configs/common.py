"""What the config files (``configs/*.py``) share: `plans_defaults`, the fields of every
`plans` config, and `parse_config_arg`, their ``get_config`` argument.

Importing it imports no JAX, no engine, no policy and no runner (tests/test_layers.py checks
it), so loading a config is cheap; `specjax.runner.cli` applies ``--config.key=value`` flags
with its `apply_override`.

The argument of a config file's ``get_config`` holds variants and ``key=value`` overrides:
``--config=configs/seed_reproduction.py:runlocal,gamma=2,grid.seed=[0,1]`` calls
``get_config("runlocal,gamma=2,grid.seed=[0,1]")``; a config file passes that string on::

    from specjax.configs.common import parse_config_arg, plans_defaults

    def defaults():
        c = plans_defaults()   # then the config's own fields and grid
        ...

    def get_config(arg=None):
        return parse_config_arg(arg, defaults(), {"runlocal": runlocal})

The argument is a comma-separated list (commas inside ``[]``, ``()``, ``{}`` or quotes do
not split). Bare names select variants — functions that edit the config, e.g. a small
``runlocal`` — applied first, in the order given. ``key=value`` items then override
fields (dotted paths for nested ConfigDicts), coerced to the type of the field they
replace:

* bool: ``true/false``, ``1/0``, ``yes/no``, ``on/off``;
* int, float, str: as written (a quoted string is unquoted);
* list / tuple: a Python literal; bare words are strings (``[naive,all_on]``), and a
  single value becomes a one-element list (``grid.gamma=4`` pins the γ axis);
* ConfigDict: a dict literal, replacing the whole sub-config (``grid={}``);
* a field whose value is None: a Python literal if it parses, else the string.

An unknown field, an unknown variant or a value of the wrong type is a `ConfigError`
that names the field, the value and what is allowed. The ``--config.key=value`` flags of
ml_collections work as well; this form exists so that one string describes a run.
"""

from __future__ import annotations

import ast
import difflib
from typing import Any, Callable, Mapping

import ml_collections

from specjax.errors import ConfigError
from specjax.field_report import ACCEPTANCE_FLOOR, DEPTH_CEILING, TRUNCATION_OVERHEAD_RATIO

__all__ = [
    "plans_defaults",
    "parse_config_arg",
    "split_arg",
    "apply_override",
    "parse_literal",
    "real_seed_runlocal",
    "real_sweep",
]

Variant = Callable[[ml_collections.ConfigDict], "ml_collections.ConfigDict | None"]

_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}


def plans_defaults():
    """The fields every `plans` config shares (each config sets its own grid); the `plans`
    experiment (`specjax.runner.plans_validation`) accepts these fields and no others (besides
    the runner's and the hf deployment's; the smollm2 deployment reads two of those, `dtype`
    and `max_len`)."""
    c = ml_collections.ConfigDict()
    c.experiment = "plans"  # the registered experiment (specjax/runner/experiments.py)
    c.deployment = "zoo"  # 'zoo' (shipped tiny models), 'synthetic' (exact tables), 'hf'
    #                       (Hugging Face folders) or 'smollm2' (the real verifier, SPEC §10)
    c.zoo_path = None  # zoo folder; None: $SPECJAX_ZOO, else the shipped specjax/zoo
    c.plans_per_domain = 24  # plan prompts per domain (code, prose, reasoning), mixed
    c.prompt_domains = ()  # the shipped prompt sets mixed; () = code, prose, reasoning; add
    #                        'edit' (steps that copy their context, specjax/data/edit.py)
    c.plan_steps = 4  # steps per plan
    c.max_step_tokens = 32  # token budget of one step
    c.consensus = "seed"  # step decision: 'seed' (execute_parallel_plan) or 'quorum'
    c.consensus_threshold = 0.5  # quorum rule: support needed to commit without fallback
    c.boundary = ml_collections.ConfigDict()  # the decision boundary (SPEC §6), the seed's
    c.boundary.acceptance_floor = ACCEPTANCE_FLOOR  # s_b below it: collapse
    c.boundary.depth_ceiling = DEPTH_CEILING  # d_b above it: collapse
    c.boundary.truncation_overhead_ratio = TRUNCATION_OVERHEAD_RATIO  # s_b − i_b must exceed it
    c.share_verifier_call = True  # cost model: a plan's branches share one verifier call
    c.auto_score = "own"  # policy 'auto': 'own' (drafters that ran) or 'teacher_forced' (all)
    c.auto_explore = 0.15  # score 'own': chance a step re-measures a dropped drafter
    c.auto_gammas = ()  # policy 'auto': γ a lone drafter may run at; () = 2, 4, 6, 8 ≤ widest γ
    c.machine_prices = True  # measure this machine's seconds per forward: predicted ÷ wall
    c.consensus_cost = 1.0  # modelled cost of a consensus round (verifier calls)
    c.bucket = 64  # prompt widths rounded up to a multiple (no retrace)
    c.report = True  # write report.md and plots/ after the cells
    c.seed_table = False  # also write the seed's table (seed_reproduction only)
    c.grid = ml_collections.ConfigDict()
    c.grid.gamma = [4]  # γ, drafts per chain per round
    c.grid.verifier_temperature = [1.0]  # τ of the verifier (0 = greedy)
    c.grid.rule = ["coupled"]  # 'coupled': branches share Gumbel noise, so they agree
    #                                   and the committed step is the verifier's own sample;
    #                                   'default': independent noise, switch 2 picks the rule
    c.grid.drafter_temperature = [
        None
    ]  # None = each drafter's default (code 1.0, prose 1.0, reasoning 1.3)
    c.grid.drafter_gamma = [
        None
    ]  # None = grid.gamma for all; or one γ_i per drafter (one-chain rows)
    c.grid.pairing = [("code", "prose", "reasoning")]  # which drafters take part
    c.grid.seed = [0]  # PRNG seed
    return c


def parse_config_arg(
    arg: str | None,
    defaults: ml_collections.ConfigDict,
    variants: Mapping[str, Variant] | None = None,
) -> ml_collections.ConfigDict:
    """Applies the variants and overrides of `arg` to `defaults` and returns the config.

    Args:
      arg: what follows ``:`` in ``--config=file.py:...`` (None or "" for the defaults).
      defaults: the config file's full config; edited in place and returned.
      variants: name -> function editing the config in place (or returning a new one).

    Raises:
      ConfigError: an unknown variant or field, or a value of the wrong type.
    """
    variants = dict(variants or {})
    config = defaults
    names, overrides = [], []
    for item in split_arg(arg or ""):
        if "=" in item:
            key, raw = item.split("=", 1)
            key = key.strip()
            if not key:
                raise ConfigError.invalid("config argument", item, "name or key=value items")
            overrides.append((key, raw.strip()))
        else:
            names.append(item)
    for name in names:
        if name not in variants:
            raise ConfigError.invalid(
                "config variant",
                name,
                sorted(variants) or "none (this config file defines no variants)",
            )
        result = variants[name](config)
        if result is not None:
            config = result
    for key, raw in overrides:
        apply_override(config, key, raw)
    return config


def split_arg(arg: str) -> list[str]:
    """Splits on top-level commas (not inside brackets or quotes); drops empty items."""
    items, depth, quote, start = [], 0, None, 0
    for i, ch in enumerate(arg):
        if quote:
            if ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            items.append(arg[start:i])
            start = i + 1
    items.append(arg[start:])
    if quote or depth != 0:
        raise ConfigError.invalid("config argument", arg, "balanced brackets and quotes")
    return [s.strip() for s in items if s.strip()]


def apply_override(config: ml_collections.ConfigDict, key: str, raw: str) -> None:
    """Sets the dotted field `key` of `config` from the string `raw` (see module doc)."""
    parts = key.split(".")
    node = config
    for depth, part in enumerate(parts):
        if not isinstance(node, ml_collections.ConfigDict) or part not in node:
            parent = ".".join(parts[:depth])
            raise _unknown_field(key, raw, node, parent)
        if depth < len(parts) - 1:
            node = node[part]
    last = parts[-1]
    value = _coerce(key, raw, node[last], _field_type(node, last))
    try:
        node[last] = value
    except (TypeError, ValueError) as e:
        raise ConfigError.invalid(key, raw, f"a value of the field's type ({e})") from None


def parse_literal(raw: str) -> Any:
    """A Python literal; bare words (also inside brackets) are strings."""
    text = raw.strip()
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        pass
    if len(text) >= 2 and (text[0], text[-1]) in (("[", "]"), ("(", ")")):
        items = [parse_literal(s) for s in split_arg(text[1:-1])]
        return items if text[0] == "[" else tuple(items)
    return text


def _field_type(node: ml_collections.ConfigDict, name: str) -> type:
    try:
        return node.get_type(name)
    except (AttributeError, KeyError, TypeError):
        return type(node[name])


def _coerce(key: str, raw: str, current: Any, field_type: type) -> Any:
    if field_type is bool:
        word = raw.strip().lower()
        if word in _TRUE:
            return True
        if word in _FALSE:
            return False
        raise ConfigError.invalid(key, raw, "a bool: true/false, 1/0, yes/no, on/off")
    if field_type is int:
        value = parse_literal(raw)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer() and "e" in raw.lower():
            return int(value)  # 1e3
        raise ConfigError.invalid(key, raw, "an integer")
    if field_type is float:
        try:
            return float(raw)
        except ValueError:
            raise ConfigError.invalid(key, raw, "a number") from None
    if field_type is str:
        value = parse_literal(raw)
        return value if isinstance(value, str) else raw.strip()
    if field_type in (list, tuple):
        value = parse_literal(raw)
        if not isinstance(value, (list, tuple)):
            value = [value]
        return field_type(value)
    if isinstance(field_type, type) and issubclass(field_type, ml_collections.ConfigDict):
        value = parse_literal(raw)
        if not isinstance(value, dict):
            raise ConfigError.invalid(key, raw, "a dict literal, e.g. {'gamma': [2, 4]}")
        return ml_collections.ConfigDict(value)
    if current is None or field_type is type(None):
        return parse_literal(raw)
    try:
        return field_type(raw)
    except Exception:  # pylint: disable=broad-except
        raise ConfigError.invalid(key, raw, f"a value of type {field_type.__name__}") from None


def _unknown_field(key: str, raw: str, node: Any, parent: str) -> ConfigError:
    if isinstance(node, ml_collections.ConfigDict):
        names = [f"{parent}.{k}" if parent else k for k in node.keys()]
    else:
        names = []
    close = difflib.get_close_matches(key, names, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    where = (
        f"{parent!r} is not a ConfigDict"
        if not isinstance(node, ml_collections.ConfigDict)
        else "no such config field"
    )
    allowed = ", ".join(names) if names else "none"
    return ConfigError(
        f"{key}={raw}: {where}{hint}; fields here: {allowed}", field=key, value=raw, allowed=names
    )


def real_sweep(c) -> None:
    """The sweeps' ``real`` size (`make sweeps-real`): the real verifier, SmolLM2-135M-Instruct
    with its drafters (runner/deployments/smollm2.py), one plan per domain, one step of ≤ 16
    tokens; each sweep config sets its own grid on top."""
    c.deployment = "smollm2"
    c.dtype = "float32"
    c.max_len = 512
    c.plans_per_domain = 1
    c.plan_steps = 1
    c.max_step_tokens = 16


def real_seed_runlocal(c) -> None:
    """The seed reproduction's ``runlocal`` size on a real verifier (SmolLM2's and Gemma 3's
    configs): one plan per domain, 2 steps of ≤ 24 tokens, a 512-token context, γ 3, one
    seed."""
    c.plans_per_domain = 1
    c.plan_steps = 2
    c.max_step_tokens = 24
    c.max_len = 512
    c.grid.gamma = [3]
    c.grid.seed = [0]
