"""Synthetic exact table LMs (``deployment = 'synthetic'``): the test deployment
(`specjax.testing.make_deployment`, four drafters over a four-symbol alphabet), its own short
prompts in one domain, and its own bound on plans per domain.
"""

from __future__ import annotations

from collections.abc import Sequence

from specjax import testing
from specjax.engine.deployment import Deployment
from specjax.runner.deployments.kind import DeploymentKind, register

__all__ = ["MAX_PLANS_PER_DOMAIN", "SYNTHETIC_PROMPTS", "SyntheticKind"]

SYNTHETIC_PROMPTS = ["ab", "cda", "b", "dd", "acb", "c", "bad", "da"]
#: The most plans per domain a synthetic config may ask (its prompts repeat).
MAX_PLANS_PER_DOMAIN = 64


class SyntheticKind(DeploymentKind):
    """`specjax.testing`'s random tables with a fourth drafter (seed 0)."""

    name = "synthetic"
    # A real config switched to the tables by an override keeps its fields, ignored.
    refuses_other_fields = False
    summary = "exact synthetic table LMs (tests, smoke runs)"

    def validate(self, config) -> tuple[dict | None, set[str]]:
        return None, set(self.full(config).names)

    def full(self, config) -> Deployment:
        dep, _ = testing.make_deployment("random", seed=0, fourth=True)
        return dep

    def plans_limit(self, config) -> tuple[int, str]:
        return MAX_PLANS_PER_DOMAIN, "the synthetic deployment's limit"

    def plan_prompts(self, config) -> tuple[list[str], list[str]]:
        n = int(config.plans_per_domain)
        prompts = (SYNTHETIC_PROMPTS * (3 * n // len(SYNTHETIC_PROMPTS) + 1))[: 3 * n]
        return prompts, [f"s{i}" for i in range(len(prompts))]

    def plan_domains(self, config, ids: Sequence[str]) -> list[str]:
        return ["d0"] * len(ids)


register(SyntheticKind())
