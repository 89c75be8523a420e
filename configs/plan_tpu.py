"""The TPU deployment planner's configs (`python -m specjax.tpu.plan`, `make plan-tpu`).

  python -m specjax.tpu.plan --config=configs/plan_tpu.py:smollm2 --workdir=runs/plan_tpu
  python -m specjax.tpu.plan --config=configs/plan_tpu.py:field_report --workdir=runs/plan_tpu
  python -m specjax.tpu.plan --config=configs/plan_tpu.py:smollm2 \
      --config=configs/plan_tpu.py:field_report --workdir=runs/plan_tpu --norun \
      --page=docs/results/tpu_plan.md

``smollm2``: the real verifier, SmolLM2-135M-Instruct, on one v5e chip, with the shipped
drafter kinds at their shapes. ``field_report``: the field report's own deployment — a
Llama-3.1-70B verifier with a 1.5B code drafter of another tokenizer (Qwen2.5-Coder-1.5B
shapes, 151,936 ids), a 3B prose drafter of the verifier's tokenizer (Llama-3.2-3B) and a
7B reasoning drafter of a third tokenizer (Mistral-7B, 32,768 ids) — on a v5e-16 and a
v5p-8. Every program is compiled with XLA:TPU on this host (no TPU): a SmolLM2-sized
program takes 10–50 s to compile on 2 cores, a 70B step 60–110 s.

α (the drafters' own, independent of the hardware) comes from runs named beside each
value: for SmolLM2 the headline benchmark page (docs/results/real_speed_headline.md,
τ = 1, γ 3); for the field report's deployment the field report's own per-drafter
acceptance (`specjax.field_report.FIELD_REPORT_ACCEPTANCE`: no 70B has run here).
"""

import ml_collections

from specjax.field_report import FIELD_REPORT_ACCEPTANCE, FIELD_REPORT_COSTS


def _base():
    c = ml_collections.ConfigDict()
    c.dtype = 'bfloat16'
    c.max_len = 4096
    c.capacity = 4096  # the KV cache every step is compiled with (fits are judged at it)
    c.rule_sets = ['tp', 'fsdp_tp', 'fsdp']
    c.recommend = 'tp'
    c.ks = [1, 2, 3, 4, 5, 6, 7, 8, 9]  # at the smallest batch, under the recommended rules
    c.ks_other = [1, 4, 8]
    c.other_batches = [8]
    c.drafter_batches = [1]
    c.gamma = 3
    c.prompt_len = 64
    c.new_tokens = 64
    c.generate_batch = 1
    c.state_programs = True
    c.state_rule = 'token_tree'
    return c


def get_config(name: str = 'smollm2'):
    c = _base()
    c.name = name
    if name == 'smollm2':
        c.title = 'SmolLM2-135M-Instruct on one v5e chip (and a v5p-8)'
        c.description = (
            'The real verifier (bf16) and the drafter kinds specjax ships for it, at their '
            'shapes: a subset-vocabulary drafter (4 layers, d 256, 4,096 kept ids, as '
            'zoo_smollm2/code), the EAGLE feature drafter (one layer over the verifier\'s '
            'features, 4,096 head ids), prompt lookup, and a drafter of another tokenizer '
            '(4 layers, d 256, 32,768 ids: the cross-vocabulary path).'
        )
        c.verifier = 'smollm2-135m'
        c.slices = ['v5e-1', 'v5p-8']
        c.rule_sets = ['tp']
        c.batches = [1, 8, 32]
        c.ks_other = [1, 2, 4, 8]
        c.other_batches = [8, 32]
        c.drafters = {
            'subset': {'kind': 'subset'},
            'eagle': {'kind': 'eagle'},
            'lookup': {'kind': 'lookup'},
            'cross': {'kind': 'cross'},
        }
        c.alphas = {
            'eagle': (0.45, 'real_speed_headline, τ 1'),
            'lookup': (0.12, 'real_speed_headline, τ 1, in lookup+eagle'),
        }
        c.generates = [
            ('rejection', 'subset'),
            ('rejection', 'eagle'),
            ('rejection', 'lookup'),
            ('rejection', 'cross'),
            ('block_verification', 'eagle'),
            ('coupled', 'subset'),
            ('token_tree', 'lookup+eagle'),
            ('shared_block', 'subset+cross'),
            ('coupled_block', 'subset+eagle'),
        ]
        c.state_drafters = 'lookup+eagle'
        c.served_drafters = 'subset+eagle+cross'  # every drafter with weights
    elif name == 'field_report':
        c.title = "The field report's deployment: Llama-3.1-70B with 1.5B / 3B / 7B drafters"
        c.description = (
            'Verifier Llama-3.1-70B (128,256 ids, 8 KV heads); drafters code = '
            'Qwen2.5-Coder-1.5B shapes (its own 151,936-id tokenizer: the cross-vocabulary '
            'path), prose = Llama-3.2-3B (the verifier\'s tokenizer), reasoning = Mistral-7B '
            'shapes (32,768 ids: a third tokenizer). bf16 weights and cache.'
        )
        c.verifier = 'llama-3.1-70b'
        c.slices = ['v5p-8', 'v5e-16']
        c.batches = [1, 8, 32]
        c.ks = [1, 2, 4, 8]
        c.ks_other = [1, 4]
        c.other_batches = [8]
        c.drafters = {
            'code': {'kind': 'cross', 'model': 'qwen2.5-coder-1.5b'},
            'prose': {'kind': 'transformer', 'model': 'llama-3.2-3b'},
            'reasoning': {'kind': 'cross', 'model': 'mistral-7b'},
            # The other kinds at the verifier's shapes: an EAGLE head (one layer of the
            # verifier's width), a subset-vocabulary drafter and prompt lookup.
            'eagle': {'kind': 'eagle'},
            'subset': {'kind': 'subset'},
            'lookup': {'kind': 'lookup'},
        }
        c.alphas = {
            n: (a, 'field report, per-drafter acceptance')
            for n, a in FIELD_REPORT_ACCEPTANCE.items()
        }
        c.seed_costs = dict(FIELD_REPORT_COSTS)  # the seed table's c_i: params ratios
        # The seed table at TPU prices: this run's per-plan counts (`make reproduce`).
        c.seed_run = 'runs/seed_reproduction'
        c.generates = [
            ('rejection', 'prose'),
            ('token_tree', 'code+prose+reasoning'),
            ('rejection', 'code'),
            ('rejection', 'eagle'),
            ('rejection', 'subset'),
            ('rejection', 'lookup'),
            ('block_verification', 'prose'),
            ('coupled', 'prose'),
            ('shared_block', 'prose+reasoning'),
            ('coupled_block', 'prose+eagle'),
        ]
        c.state_drafters = 'code+prose+reasoning'
        c.served_drafters = 'code+prose+reasoning+eagle+subset'  # every drafter with weights
    else:
        raise ValueError(f"plan_tpu config: got {name!r}; allowed: 'smollm2', 'field_report'")
    return c
