r"""Verification rules compared on SmolLM2 and its drafters: tokens per round, paired.

  python experiments/compare_rules.py                       # token_tree vs traversal, lookup+eagle
  python experiments/compare_rules.py --drafters=code,eagle --tau=0 --rules=token_tree,traversal

Runs each rule of ``--rules`` over the same plan prompts (the first ``--prompts_per_domain``
shipped held-out prompts of each domain), drafters (``--drafters``: distinct, one chain
each), γ, verifier τ and row keys (``--seeds``), and prints each rule's tokens per
round and its ratio to the first rule's with a 95% paired bootstrap interval over prompts
(`specjax.measure.rule_pairs`). A figure of the rules and the texts, not of this machine's
speed. Writes ``compare_rules.json`` under ``--out``.
"""

from __future__ import annotations

from pathlib import Path

from absl import flags

from specjax.data import load_prompts
from specjax.measure import rule_pairs
from specjax.runner import provenance
from specjax.runner import script_flags as sf
from specjax.runner.deployments.smollm2 import SMOLLM2_DRAFTERS, SMOLLM2_EXTRA, from_smollm2

FLAGS = flags.FLAGS
DOMAINS = ("code", "prose", "reasoning")
MAX_LEN = 1024


def define_flags():
    """The script's flags (defined only when it runs as a script)."""
    provenance.define_common_flags(out="runs/compare_rules")
    flags.DEFINE_list("drafters", ["lookup", "eagle"], "SmolLM2 drafters, one chain each")
    flags.DEFINE_list("rules", ["token_tree", "traversal"], "rules; ratios are to the first")
    flags.DEFINE_list("domains", list(DOMAINS), "plan-prompt domains")
    flags.DEFINE_integer("prompts_per_domain", 8, "first N shipped prompts of each domain")
    flags.DEFINE_list("seeds", ["0"], "row-key seeds: one pass over the prompts each")
    flags.DEFINE_integer("gamma", 3, "draft tokens per chain and round")
    flags.DEFINE_float("tau", 1.0, "the verifier's temperature")
    flags.DEFINE_integer("new_tokens", 64, "tokens per row")
    flags.DEFINE_integer("batch", 8, "rows per call")
    flags.DEFINE_string("dtype", "bfloat16", "the verifier's and drafters' dtype")


def validate() -> None:
    """Every flag, before anything is loaded or written: one line naming the flag."""
    known = (*SMOLLM2_DRAFTERS, *SMOLLM2_EXTRA)
    sf.names("--drafters", FLAGS.drafters, known)
    chains = len(FLAGS.drafters)
    sf.check(FLAGS.rules, "--rules", "", "one or more rules")
    for r in FLAGS.rules:
        sf.rule("--rules", r, chains)
    sf.check(
        len(set(FLAGS.rules)) == len(FLAGS.rules),
        "--rules",
        ",".join(FLAGS.rules),
        "distinct rules",
    )
    sf.names("--domains", FLAGS.domains, DOMAINS)
    sf.integer("--prompts_per_domain", FLAGS.prompts_per_domain, 1, 24)
    sf.integers("--seeds", FLAGS.seeds, 0)
    sf.integer("--gamma", FLAGS.gamma, 1, 16)
    sf.number("--tau", FLAGS.tau, 0.0, 100.0)
    sf.integer("--new_tokens", FLAGS.new_tokens, 1, MAX_LEN // 2)
    sf.integer("--batch", FLAGS.batch, 1, 4096)
    sf.dtype("--dtype", FLAGS.dtype)


def main(argv):
    del argv
    prov = provenance.provenance()
    names = list(FLAGS.drafters)
    dep = from_smollm2(names, dtype=FLAGS.dtype, max_len=MAX_LEN, out_first=True)
    texts = []
    for dom in FLAGS.domains:
        texts += [p["prompt"] for p in load_prompts([dom])][: FLAGS.prompts_per_domain]
    res = rule_pairs.compare(
        dep,
        texts,
        list(FLAGS.rules),
        gamma=FLAGS.gamma,
        tau=FLAGS.tau,
        new_tokens=FLAGS.new_tokens,
        batch=FLAGS.batch,
        seeds=[int(s) for s in FLAGS.seeds],
    )
    first = FLAGS.rules[0]
    for rule, r in res.items():
        lo, hi = r["ratio_ci"]
        print(
            f"{'+'.join(names)} γ {FLAGS.gamma} τ {FLAGS.tau:g} {rule:18} tokens/round "
            f"{r['tokens_per_round']:.3f} ({r['tokens']:.0f} tokens, {r['rounds']:.0f} rounds)"
            f"  ÷ {first}: {r['ratio_to_first']:.3f} [{lo:.3f}, {hi:.3f}]",
            flush=True,
        )
    flags_rec = {
        k: FLAGS[k].value
        for k in (
            "drafters",
            "rules",
            "domains",
            "prompts_per_domain",
            "seeds",
            "gamma",
            "tau",
            "new_tokens",
            "batch",
            "dtype",
        )
    }
    path = provenance.write_json(
        Path(FLAGS.out) / "compare_rules.json",
        {"rules": res, "prompts": len(texts), "flags": flags_rec},
        prov,
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    define_flags()
    sf.run(main, validate, "compare_rules")
