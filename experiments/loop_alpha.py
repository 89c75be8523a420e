r"""Drafters' acceptance in the loop on SmolLM2, per domain and draft step, over many paths.

  python experiments/loop_alpha.py                                    # the shipped eagle
  python experiments/loop_alpha.py --drafters eagle,ft=runs/eagle3/eagle_ftC.npz \
      --prompts_per_domain 24 --seeds 0,1

Teacher-forced α (`train_eagle.py --stage=eval`) compares drafters on the same few verifier
replies; in the loop each drafter walks its own sample paths (a rejection resamples), so a
choice between drafters needs the loop's own acceptance over many prompts and seeds. For
every drafter in ``--drafters`` (a SmolLM2 drafter name — code, prose, lookup, eagle — or
``label=FILE``, a feature drafter file from train_eagle.py) and every domain, this runs
speculative decoding (rule 1, or each rule of ``--rules``; γ ``--gamma``, verifier τ
``--tau``, ``--new_tokens`` per row, batch ``--batch``) over the first
``--prompts_per_domain`` shipped (held-out) plan prompts once per seed in ``--seeds``, and
reports from the in-graph counters (`Counters`):

  * ``step_alpha``: the drafter's conditional acceptance at draft step 1..γ (accepted ÷
    reached, its chain tested alone), with a standard error over rows (each row one path);
  * ``tokens_per_round`` (with a standard error over rows) and ``rounds``: where a rule
    commits more than rule 1 from the same drafts (``block_verification``), here it shows;
  * ``kept_per_round`` and ``kept_per_round_rule1``: the drafts each round's block was
    expected to keep under the rule and under rule 1 (the same blocks), and
    ``kept_gain_over_rule1`` their ratio − 1 with its standard error over rows: the rule's
    gain without the noise of the accept draws or of the paths.

With ``--predict`` (feature drafters, rule 1, τ 1) each row also carries the figures
`specjax.measure.loop_law` predicts on the loop's own committed paths from the drafter's
teacher-forced acceptance there (``predicted_step_alpha``, ``predicted_tokens_per_round``,
standard errors over paths): given the paths, the loop's counters should match them at
step 1 up to the accept draws' noise (deeper steps are teacher-forced approximately).

Prints a table and writes ``loop_alpha.json`` under --out. About 1 minute per drafter,
domain and seed at the defaults on 2 cores (bf16 ``[out, in]``).
"""

from __future__ import annotations

import itertools
from pathlib import Path

from absl import flags

from specjax.measure.acceptance import loop_acceptance as measure
from specjax.runner import provenance
from specjax.runner import script_flags as sf
from specjax.runner.deployments.smollm2 import FEATURE_DRAFTERS
from specjax.verify import registry

FLAGS = flags.FLAGS
DOMAINS = ("code", "prose", "reasoning")
#: The verifier's context (`main` loads it with this max_len).
MAX_LEN = 1024
#: The one-chain rules (`--rules`).
_ONE_CHAIN = tuple(r.name for r in registry.all_rules() if r.one_chain)


def define_flags():
    """The script's flags (defined only when it runs as a script)."""
    provenance.define_common_flags(out="runs/loop_alpha")
    flags.DEFINE_list(
        "drafters", ["eagle"], "SmolLM2 drafter names, or label=FILE (a feature drafter file)"
    )
    flags.DEFINE_list("domains", ["code", "prose", "reasoning"], "plan-prompt domains")
    flags.DEFINE_integer(
        "prompts_per_domain", 16, "first N shipped prompts of each domain", lower_bound=1
    )
    flags.DEFINE_list("seeds", ["0"], "row-key seeds: one pass over the prompts each")
    flags.DEFINE_integer("gamma", 3, "draft tokens per round", lower_bound=1)
    flags.DEFINE_float("tau", 1.0, "the verifier's temperature", lower_bound=0.0)
    flags.DEFINE_integer("new_tokens", 64, "tokens per row", lower_bound=1)
    flags.DEFINE_integer("batch", 8, "rows per call", lower_bound=1)
    flags.DEFINE_string("dtype", "bfloat16", "the verifier's and drafters' dtype")
    flags.DEFINE_bool(
        "predict",
        False,
        "feature drafters under rule 1 at τ 1: also predict the per-step α and tokens per "
        "round from the drafter's teacher-forced acceptance on the loop's own paths "
        "(`specjax.measure.loop_law`; the verifier's features over them, one prefill): the law's "
        "check of the loop",
    )
    flags.DEFINE_list(
        "rules",
        ["rejection"],
        "one-chain verification rules, each measured on the same prompts and seeds: "
        "rejection (rule 1) and/or block_verification",
    )


def _parse(entry: str) -> tuple[str, str, str]:
    """(label, drafter name, file or '') of one --drafters entry."""
    from specjax.errors import ConfigError  # pylint: disable=import-outside-toplevel
    from specjax.runner.deployments.smollm2 import (  # pylint: disable=import-outside-toplevel
        SMOLLM2_DRAFTERS,
        SMOLLM2_EXTRA,
    )

    label, _, path = entry.partition("=")
    if path:
        if not label or not Path(path).is_file():
            raise ConfigError.invalid("--drafters", entry, "label=FILE with FILE an existing file")
        sf.drafter_file("--drafters", path, feature=True, shown=entry)
        return label, "eagle", path
    known = (*SMOLLM2_DRAFTERS, *SMOLLM2_EXTRA)
    if entry not in known:
        raise ConfigError.invalid(
            "--drafters", entry, f"a SmolLM2 drafter name ({', '.join(known)}) or label=FILE"
        )
    return entry, entry, ""


def validate() -> None:
    """Every flag, before anything is printed, loaded or written (`sf.run`): a
    `ConfigError` naming the flag, its value and what is allowed."""
    from specjax.errors import ConfigError  # pylint: disable=import-outside-toplevel

    sf.check(FLAGS.drafters, "--drafters", "", "one or more drafters")
    entries = [_parse(e) for e in FLAGS.drafters]
    labels = [label for label, _, _ in entries]
    sf.check(
        len(set(labels)) == len(labels),
        "--drafters",
        ",".join(FLAGS.drafters),
        "entries with distinct labels",
    )
    sf.names("--domains", FLAGS.domains, DOMAINS)
    sf.integers("--seeds", FLAGS.seeds, 0)
    sf.integer("--prompts_per_domain", FLAGS.prompts_per_domain, 1, 24)
    sf.integer("--gamma", FLAGS.gamma, 1, 64)
    sf.number("--tau", FLAGS.tau, 0.0, 100.0)
    sf.integer("--new_tokens", FLAGS.new_tokens, 1, MAX_LEN // 2)
    sf.integer("--batch", FLAGS.batch, 1, 4096)
    sf.dtype("--dtype", FLAGS.dtype)
    if FLAGS.predict and FLAGS.tau != 1.0:
        raise ConfigError.invalid("--tau", FLAGS.tau, "1.0 with --predict")
    if FLAGS.predict and any(name not in FEATURE_DRAFTERS for _, name, _ in entries):
        raise ConfigError.invalid(
            "--drafters", ",".join(FLAGS.drafters), "feature drafters only with --predict"
        )


def predict(dep, paths, gamma: int) -> dict:
    """`specjax.measure.loop_law`'s per-step α and tokens per round (standard errors over paths)
    for ``dep``'s feature drafter on ``paths`` ((prompt ids, committed ids) per row): the
    verifier's features over each path, the drafter teacher forced on them at τ 1."""
    import types  # pylint: disable=import-outside-toplevel

    from specjax.measure import loop_law  # pylint: disable=import-outside-toplevel
    from specjax.train import distill  # pylint: disable=import-outside-toplevel
    from specjax.train import distill_eagle as de  # pylint: disable=import-outside-toplevel

    gen = distill.Generated.from_pairs(paths, 1.0)
    model = types.SimpleNamespace(lm=dep.verifier, params=dep.v_params)
    feats = de.verifier_features(model, gen, log=lambda s: None)
    lm, params = dep.drafters[0].lm, dep.d_data[0].params
    pos = de.feature_alpha_positions(lm, params, feats, steps=min(gamma, 3))
    r = loop_law.loop_alpha(pos["alpha"], pos["accept"], pos["mask"], gamma)
    return {
        "predicted_step_alpha": r["step_alpha"].tolist(),
        "predicted_step_alpha_se": r["step_alpha_se"].tolist(),
        "predicted_tokens_per_round": r["tokens_per_round"],
        "predicted_tokens_per_round_se": r["tokens_per_round_se"],
        "forced_alpha": r["forced_alpha"].tolist(),
    }


def main(argv):
    del argv
    from specjax.data import load_prompts  # pylint: disable=import-outside-toplevel
    from specjax.runner.deployments.smollm2 import from_smollm2  # pylint: disable=import-outside-toplevel

    prov = provenance.provenance()
    entries = [_parse(e) for e in FLAGS.drafters]  # checked by `validate`
    seeds = [int(s) for s in FLAGS.seeds]
    rows = []
    for label, name, path in entries:
        dep = from_smollm2(
            [name],
            dtype=FLAGS.dtype,
            max_len=MAX_LEN,
            out_first=True,
            drafters={name: path} if path else None,
        )
        for dom, rule in itertools.product(FLAGS.domains, FLAGS.rules):
            texts = [p["prompt"] for p in load_prompts([dom])][: FLAGS.prompts_per_domain]
            r = measure(
                dep,
                texts,
                gamma=FLAGS.gamma,
                tau=FLAGS.tau,
                new_tokens=FLAGS.new_tokens,
                batch=FLAGS.batch,
                seeds=seeds,
                rule=rule,
            )
            paths = r.pop("paths")
            r.pop("texts")
            if FLAGS.predict and registry.get(rule).rule1:
                r.update(predict(dep, paths, FLAGS.gamma))
                print(
                    f"{label:12} {dom:9} predicted on the same paths: step α "
                    + " ".join(
                        f"{a:.3f}±{s:.3f}"
                        for a, s in zip(r["predicted_step_alpha"], r["predicted_step_alpha_se"])
                    )
                    + f"  tokens/round {r['predicted_tokens_per_round']:.3f}"
                    f"±{r['predicted_tokens_per_round_se']:.3f}",
                    flush=True,
                )
            rows.append(
                dict(drafter=label, file=path, domain=dom, rule=rule, prompts=len(texts), **r)
            )
            steps = " ".join(
                f"{a:.3f}±{s:.3f}" for a, s in zip(r["step_alpha"], r["step_alpha_se"])
            )
            print(
                f"{label:12} {dom:9} {rule:18} step α {steps}  tokens/round "
                f"{r['tokens_per_round']:.3f}±{r['tokens_per_round_se']:.3f}  expected kept "
                f"{r['kept_per_round']:.3f} vs rule 1 {r['kept_per_round_rule1']:.3f} on the "
                f"same blocks ({r['kept_gain_over_rule1']:+.2%}±{r['kept_gain_se']:.2%}) "
                f"({r['rows']} paths, {r['rounds']} rounds)",
                flush=True,
            )
    flags_rec = {
        k: FLAGS[k].value
        for k in (
            "drafters",
            "domains",
            "prompts_per_domain",
            "seeds",
            "gamma",
            "tau",
            "new_tokens",
            "batch",
            "dtype",
            "rules",
            "predict",
        )
    }
    path = provenance.write_json(
        Path(FLAGS.out) / "loop_alpha.json", {"rows": rows, "flags": flags_rec}, prov
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    define_flags()
    flags.register_validator(
        "rules",
        lambda v: bool(v) and all(r in _ONE_CHAIN for r in v),
        f"--rules: one or more of {', '.join(_ONE_CHAIN)}",
    )
    sf.run(main, validate, "loop_alpha")
