"""Joint vs per-drafter acceptance for same- and cross-tokenizer drafter pairings.

  python -m specjax.main --config=configs/sweep_tokenizer_pairings.py:runlocal --workdir=runs/pairings_local
  python -m specjax.main --config=configs/sweep_tokenizer_pairings.py:published --workdir=runs/sweep_tokenizer_pairings
  python -m specjax.main --config=configs/sweep_tokenizer_pairings.py --workdir=runs/pairings_full
  python -m specjax.main --config=configs/sweep_tokenizer_pairings.py:real --workdir=runs/sweep_tokenizer_pairings_real

Tokenizer groups. On the zoo, code and prose share the verifier's tokenizer, reasoning has
its own, prose512 (an extra drafter of the zoo) a third, and ``lookup`` (prompt lookup: a
history cache over the committed tokens, q one-hot, cost 0) drafts in the verifier's ids. The
grid: each drafter alone, every pair and the triple of code / prose / reasoning, the pairs of
lookup with each of them, prose512 with a same-group and a cross-group partner, and a
three-tokenizer triple (15 pairings) × policy ∈ {naive, all_on}: 30 cells.

Sizes (how long each published run took, and on which machine, is on its page):

* default: 24 plans per domain × 4 steps × ≤ 32 tokens (not published).
* ``published`` (`make sweeps`, docs/results/sweep_tokenizer_pairings.md): 2 plans per
  domain × 4 steps × ≤ 32 tokens (the whole grid): the seed reproduction's runlocal shapes, so
  the programs it compiled are reused from the persistent cache; each new pairing compiles
  its own programs in its first cell.
* ``real`` (`make sweeps-real`, docs/results/sweep_tokenizer_pairings_real.md):
  SmolLM2-135M-Instruct with its drafters code and prose (distilled, the verifier's
  tokenizer), reasoning (own tokenizer) and lookup: every pair of the four, the triple code /
  prose / reasoning and the four together (8 pairings × 2 policies = 16 cells), 1 plan per
  domain × 1 step × ≤ 16 tokens; each pairing compiles its own programs.
* ``runlocal`` (tests): 2 plans per domain × 2 steps, three pairings.
"""

import ml_collections

from specjax.configs.common import parse_config_arg, plans_defaults, real_sweep

#: The three drafters of the seed's deployment (zoo and real), and prompt lookup.
SEED_DRAFTERS = ("code", "prose", "reasoning")
LOOKUP = "lookup"


def _pairs(names) -> list:
    return [(a, b) for i, a in enumerate(names) for b in names[i + 1 :]]


def defaults() -> ml_collections.ConfigDict:
    c = plans_defaults()  # shared fields, each commented (specjax/configs/common.py)
    c.grid.pairing = (
        [(d,) for d in SEED_DRAFTERS + ("prose512", LOOKUP)]  # each alone
        + _pairs(SEED_DRAFTERS)  # same-group (code, prose) and cross-group pairs
        + [(d, LOOKUP) for d in SEED_DRAFTERS]  # prompt lookup beside each
        + [("prose", "prose512"), ("code", "prose512")]  # a third tokenizer
        + [SEED_DRAFTERS, ("code", "reasoning", "prose512")]  # the triple; three tokenizers
    )
    c.grid.policy = ["naive", "all_on"]  # policy names
    return c


def published(c: ml_collections.ConfigDict) -> None:
    """The size of docs/results/sweep_tokenizer_pairings.md (`make sweeps`)."""
    c.plans_per_domain = 2
    c.plan_steps = 4


def real(c: ml_collections.ConfigDict) -> None:
    """The real verifier, SmolLM2-135M-Instruct (`make sweeps-real`)."""
    real_sweep(c)  # smollm2, 1 plan per domain × 1 step × ≤ 16 tokens
    c.grid.pairing = _pairs(SEED_DRAFTERS + (LOOKUP,)) + [
        SEED_DRAFTERS,
        SEED_DRAFTERS + (LOOKUP,),
    ]


def runlocal(c: ml_collections.ConfigDict) -> None:
    c.plans_per_domain = 2
    c.plan_steps = 2
    c.grid.pairing = [("code", "prose"), ("code", "lookup"), ("code", "reasoning", "prose512")]


def get_config(arg=None):
    return parse_config_arg(
        arg, defaults(), {"runlocal": runlocal, "published": published, "real": real}
    )
