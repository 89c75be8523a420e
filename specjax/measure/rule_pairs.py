"""Verification rules compared on the same setup, paired by prompt: tokens per round.

A multi-draft rule's claim is that it commits more tokens per verifier call than another
rule from the same kind of drafts. On a real verifier that is measured by running each rule
over the same prompts, drafters, γ, verifier temperature and row keys, and comparing the
tokens committed per round (block efficiency, SPEC §7) — a figure of the rule and the texts,
not of the machine's speed. At τ > 0 the rules consume the same keys differently, so their
sample paths part after the first round where they differ: a prompt (all its seeds together)
is the unit, and the interval of the ratio is a paired bootstrap over prompts
(`specjax.metrics.bootstrap_ci`: each resample pools the chosen prompts' tokens and rounds
for both rules).

`experiments/compare_rules.py` runs it on SmolLM2 and its drafters.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from specjax import metrics
from specjax.engine.generate import row_keys_for, speculative_generate
from specjax.engine.spec import EngineConfig
from specjax.verify import registry

__all__ = ['calls', 'compare', 'rule_rows']


def calls(dep, texts: Sequence[str], cfg: EngineConfig, *, batch: int, seeds, stream: str):
    """Runs ``cfg`` over ``texts`` in calls of ``batch`` rows (the last padded), once per
    seed (row keys `row_keys_for(seed, len(texts), stream)`); yields ``(lo, n, rows,
    result)``: the call's first text, its real rows, the texts' indices and its
    `GenerateResult`."""
    v = [dep.encode(t) for t in texts]
    d = [[enc(t) for t in texts] for enc in dep.drafter_encode]
    for seed in seeds:
        keys = row_keys_for(int(seed), len(v), stream=stream)
        for lo in range(0, len(v), batch):
            rows = [min(i, len(v) - 1) for i in range(lo, lo + batch)]
            r = speculative_generate(
                cfg,
                dep.verifier,
                dep.v_params,
                dep.drafters,
                dep.d_data,
                [v[i] for i in rows],
                [[x[i] for i in rows] for x in d],
                keys[rows],
                slots=None if cfg.n_slots == 1 else np.tile(np.arange(cfg.n_slots), (len(rows), 1)),
                bucket=64,
            )
            yield lo, min(batch, len(v) - lo), rows, r


def rule_rows(
    dep,
    texts: Sequence[str],
    *,
    rule: str,
    gamma: int,
    tau: float,
    new_tokens: int,
    batch: int,
    seeds: Sequence[int],
    stream: str = 'compare_rules',
) -> tuple[np.ndarray, np.ndarray]:
    """(tokens, rounds), f64[len(texts)] each: every drafter of ``dep`` a chain of the
    row (one slot each), summed over ``seeds``, under ``rule``."""
    n_slots = 1 if registry.get(rule).one_chain else len(dep.drafters)
    cfg = EngineConfig(
        gamma=gamma,
        max_new_tokens=new_tokens,
        verifier_temperature=tau,
        rule=rule,
        n_slots=n_slots,
    )
    tokens, rounds = np.zeros(len(texts)), np.zeros(len(texts))
    for lo, n, _, r in calls(dep, texts, cfg, batch=batch, seeds=seeds, stream=stream):
        tokens[lo : lo + n] += np.asarray(r.length - r.start)[:n]
        rounds[lo : lo + n] += np.asarray(r.counters.rounds)[:n]
    return tokens, rounds


def compare(dep, texts: Sequence[str], rules: Sequence[str], **kw) -> dict:
    """Each rule's tokens per round over ``texts`` and its ratio to the first rule's with
    a 95% paired bootstrap interval over the prompts (``kw``: `rule_rows`' settings)."""
    runs = {rule: rule_rows(dep, texts, rule=rule, **kw) for rule in rules}
    base_t, base_r = runs[rules[0]]
    out = {}
    for rule, (t, r) in runs.items():

        def ratio(idx, t=t, r=r):
            return metrics.ratio_of_sums(t, r, idx) / metrics.ratio_of_sums(base_t, base_r, idx)

        lo, hi = metrics.bootstrap_ci(len(texts), ratio, n_resamples=2000)
        out[rule] = dict(
            tokens=float(t.sum()),
            rounds=float(r.sum()),
            tokens_per_round=metrics.ratio_of_sums(t, r),
            ratio_to_first=ratio(None),
            ratio_ci=[lo, hi],
            per_prompt_tokens=t.tolist(),
            per_prompt_rounds=r.tolist(),
        )
    return out
