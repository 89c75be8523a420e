"""The KL ceiling (switch 4) from 0.1 to 3 nats: which sharing sets exist at each ceiling,
and what joint acceptance, fallback and throughput they give.

  python -m specjax.main --config=configs/sweep_kl_ceiling.py:runlocal --workdir=runs/kl_ceiling_local
  python -m specjax.main --config=configs/sweep_kl_ceiling.py:published --workdir=runs/sweep_kl_ceiling
  python -m specjax.main --config=configs/sweep_kl_ceiling.py --workdir=runs/kl_ceiling_full
  python -m specjax.main --config=configs/sweep_kl_ceiling.py:real --workdir=runs/sweep_kl_ceiling_real

Drafters whose pairwise KL (on their common support, measured on a prefix) exceeds the
ceiling do not share a prefix, so the ceiling decides which sharing sets a step runs. Two
policies carry the ceiling: ``all_on_kl<c>`` (every invariant on; prefix partitioning
already parts the tokenizer groups, so the ceiling can only split a group) and
``naive_plus_kl_ceiling_kl<c>`` (naive plus the ceiling alone: all three drafters share one
prefix unless the ceiling parts them), each at c ∈ {0.1, 0.2, 0.35, 0.5, 1, 2, 3} nats
(0.35 is the field report's, spelled without the suffix), beside the same policies with the
ceiling off (``all_on_minus_kl_ceiling``, ``naive``): 16 cells. Every row records the ceiling
it ran with (``kl_ceiling``), the KL it measured (``kl_max``, ``kl_mean``), and each branch's
drafters (``branch_records``): the report's "Sharing sets" table lists, per policy, the sets
that ran and the largest, with joint acceptance and the fallback rate.

Sizes (how long each published run took, and on which machine, is on its page):

* default: 24 plans per domain × 4 steps × ≤ 32 tokens (not published).
* ``published`` (`make sweeps`, docs/results/sweep_kl_ceiling.md): 2 plans per
  domain × 4 steps × ≤ 32 tokens (all 16 cells): the seed reproduction's runlocal shapes, so
  the programs it compiled are reused from the persistent cache.
* ``real`` (`make sweeps-real`, docs/results/sweep_kl_ceiling_real.md): SmolLM2-135M-Instruct
  with code, prose and reasoning; 1 plan per domain × 1 step × ≤ 16 tokens, all 16 cells;
  it compiles the programs of the sets that occur (at most the 3 singles, the code+prose
  pair, the triple and naive's block). At these sizes no ceiling of the grid let two
  drafters share a prefix on the real deployment (max pairwise KL 4.3 nats; code and prose
  share with the ceiling off).
* ``runlocal`` (tests): 2 plans per domain × 2 steps, ceilings 0.1 and 3 on both policies.
"""

import ml_collections

from specjax.configs.common import parse_config_arg, plans_defaults, real_sweep
from specjax.policy.names import canonical_name

#: The issue's ceilings, in nats.
CEILINGS = (0.1, 0.2, 0.35, 0.5, 1.0, 2.0, 3.0)
#: The policies with the ceiling on, as ``<base>_kl<c>``, and each with the ceiling off.
BASES = {"all_on": "all_on_minus_kl_ceiling", "naive_plus_kl_ceiling": "naive"}


def _policies(ceilings) -> list:
    out = []
    for base, off in BASES.items():
        out += [canonical_name(f"{base}_kl{c}") for c in ceilings] + [off]
    return out


def defaults() -> ml_collections.ConfigDict:
    c = plans_defaults()  # shared fields, each commented (specjax/configs/common.py)
    c.grid.gamma = [4]  # γ
    c.grid.pairing = [("code", "prose", "reasoning")]  # the seed's three drafters
    c.grid.policy = _policies(CEILINGS)  # 7 ceilings × 2 policies, and both with it off
    return c


def published(c: ml_collections.ConfigDict) -> None:
    """The size of docs/results/sweep_kl_ceiling.md (`make sweeps`)."""
    c.plans_per_domain = 2
    c.plan_steps = 4


def real(c: ml_collections.ConfigDict) -> None:
    """The real verifier, SmolLM2-135M-Instruct (`make sweeps-real`)."""
    real_sweep(c)  # smollm2, 1 plan per domain × 1 step × ≤ 16 tokens
    c.grid.gamma = [3]


def runlocal(c: ml_collections.ConfigDict) -> None:
    c.plans_per_domain = 2
    c.plan_steps = 2
    c.grid.policy = _policies((0.1, 3.0))


def get_config(arg=None):
    return parse_config_arg(
        arg, defaults(), {"runlocal": runlocal, "published": published, "real": real}
    )
