r"""Each drafter's acceptance against a real deployment's verifier, in the loop and teacher
forced, at verifier τ 1 and 0 — the cross-family deployment's α (issue 50, item 3).

  python experiments/drafter_acceptance.py                       # gemma3: smollm2, lookup
  python experiments/drafter_acceptance.py --deployment smollm2 --drafters code,prose,lookup,eagle

For each verifier temperature of ``--taus`` and each drafter of ``--drafters`` (names of the
``--deployment`` kind's drafters), speculative decoding with that drafter alone (rule 1, γ
``--gamma``; at τ 0 the drafter drafts greedily) over the first ``--prompts_per_domain``
shipped plan prompts of each domain, once per seed: the loop's per-step α (its chain tested
alone) and tokens per round (`specjax.measure.acceptance.loop_acceptance`). Then every
drafter teacher forced on the same committed text — the first drafter's loop paths, the
verifier's own samples (every rule is lossless) —: Σ min(p, q) at τ 1, the argmax agreement
at τ 0, and the share of the drafter's own probability on ids the verifier spells
identically (for a drafter of another tokenizer: what the token-level intersection keeps of
its proposals; 1 for the verifier's tokenizer) (`teacher_forced`). Standard errors are over
rows (paths). Also the vocabularies' overlap: how many of the drafter's ids have a verifier
id of identical bytes.

Prints a table and writes ``drafter_acceptance.json`` under --out. ~15 min on 2 idle cores
at the defaults for gemma3 (bf16).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from absl import flags

from specjax.runner import provenance
from specjax.runner import script_flags as sf

FLAGS = flags.FLAGS
DOMAINS = ("code", "prose", "reasoning")


def define_flags():
    """The script's flags (defined only when it runs as a script)."""
    provenance.define_common_flags(out="runs/drafter_acceptance")
    flags.DEFINE_string("deployment", "gemma3", "a real deployment kind: gemma3 or smollm2")
    flags.DEFINE_list("drafters", [], "the kind's drafter names (default: all of them)")
    flags.DEFINE_string("dtype", "bfloat16", "the verifier's and drafters' dtype")
    flags.DEFINE_integer("max_len", 1024, "the verifier's context", lower_bound=64)
    flags.DEFINE_list("domains", list(DOMAINS), "plan-prompt domains")
    flags.DEFINE_integer("prompts_per_domain", 8, "first N shipped prompts of each domain")
    flags.DEFINE_list("seeds", ["0"], "row-key seeds: one pass over the prompts each")
    flags.DEFINE_integer("gamma", 3, "draft tokens per round", lower_bound=1)
    flags.DEFINE_list("taus", ["1.0", "0.0"], "verifier temperatures")
    flags.DEFINE_integer("new_tokens", 64, "tokens per row", lower_bound=1)
    flags.DEFINE_integer("batch", 4, "rows per call", lower_bound=1)


#: The real deployment kinds this script builds (their drafters are named by the kind).
KINDS = ("gemma3", "smollm2")


def _config():
    from specjax.configs.common import plans_defaults  # pylint: disable=import-outside-toplevel

    c = plans_defaults()
    c.deployment, c.dtype, c.max_len = FLAGS.deployment, FLAGS.dtype, FLAGS.max_len
    c.grid.pairing = [tuple(FLAGS.drafters)] if FLAGS.drafters else []
    return c


def _kind():
    from specjax.runner import deployments  # pylint: disable=import-outside-toplevel

    return deployments.get(FLAGS.deployment, "--deployment")


def validate() -> None:
    """Every flag, before anything is printed, loaded or written (`sf.run`)."""
    sf.names("--deployment", [FLAGS.deployment], KINDS)
    kind = _kind()
    cfg = _config()
    kind.check_values(cfg)
    _, names = kind.validate(cfg)
    sf.names("--drafters", FLAGS.drafters, tuple(sorted(names)), empty=True)
    sf.check(
        len(set(FLAGS.drafters)) == len(FLAGS.drafters),
        "--drafters",
        ",".join(FLAGS.drafters),
        "distinct names",
    )
    sf.names("--domains", FLAGS.domains, DOMAINS)
    sf.integers("--seeds", FLAGS.seeds, 0)
    sf.integer("--prompts_per_domain", FLAGS.prompts_per_domain, 1, 24)
    sf.integer("--gamma", FLAGS.gamma, 1, 16)
    for t in FLAGS.taus:
        sf.number("--taus", t, 0.0, 100.0)
    sf.integer("--new_tokens", FLAGS.new_tokens, 1, FLAGS.max_len // 2)
    sf.integer("--batch", FLAGS.batch, 1, 256)
    sf.dtype("--dtype", FLAGS.dtype)


def _overlap(dep, k: int) -> tuple[int, int]:
    to_v = np.asarray(dep.d_data[k].to_verifier)
    return int((to_v >= 0).sum()), int(to_v.size)


def main(argv):
    del argv
    from specjax.data import load_prompts  # pylint: disable=import-outside-toplevel
    from specjax.measure import acceptance  # pylint: disable=import-outside-toplevel

    prov = provenance.provenance()
    kind, cfg = _kind(), _config()
    full = kind.load(cfg, FLAGS.drafters or None)
    names = [d.name for d in full.drafters]
    seeds = [int(s) for s in FLAGS.seeds]
    texts = [
        p["prompt"]
        for dom in FLAGS.domains
        for p in load_prompts([dom])[: FLAGS.prompts_per_domain]
    ]
    overlap = {n: _overlap(full, k) for k, n in enumerate(names)}
    for n, (kept, size) in overlap.items():
        print(
            f"{n:10} vocabulary: {kept:,} of {size:,} ids spelt identically by the verifier "
            f"({kept / size:.1%})",
            flush=True,
        )
    rows = []
    for tau in [float(t) for t in FLAGS.taus]:
        loops, paths, which = {}, None, None
        for n in names:
            dep = full.subset([n])
            if tau == 0.0:
                dep = dep.with_temperatures([0.0])
            r = acceptance.loop_acceptance(
                dep,
                texts,
                gamma=FLAGS.gamma,
                tau=tau,
                new_tokens=FLAGS.new_tokens,
                batch=FLAGS.batch,
                seeds=seeds,
            )
            p, w = r.pop("paths"), r.pop("texts")
            if paths is None:
                paths, which = p, w
            loops[n] = r
        forced = acceptance.teacher_forced(
            full, [texts[i] for i in which], paths, tau=tau, batch=FLAGS.batch
        )
        for n, f in zip(names, forced):
            r = loops[n]
            rows.append(dict(drafter=n, tau=tau, loop=r, forced=f, overlap=list(overlap[n])))
            steps = " ".join(
                f"{a:.3f}±{s:.3f}" for a, s in zip(r["step_alpha"], r["step_alpha_se"])
            )
            print(
                f"τ {tau:g}  {n:10} teacher-forced α {f['alpha']:.3f}±{f['alpha_se']:.3f} "
                f"(top-1 {f['top1']:.3f}, kept {f['kept']:.3f}, {f['positions']} positions)  "
                f"in the loop: step α {steps}, tokens/round {r['tokens_per_round']:.3f}"
                f"±{r['tokens_per_round_se']:.3f} ({r['rows']} paths)",
                flush=True,
            )
    flags_rec = {
        k: FLAGS[k].value
        for k in (
            "deployment",
            "drafters",
            "dtype",
            "max_len",
            "domains",
            "prompts_per_domain",
            "seeds",
            "gamma",
            "taus",
            "new_tokens",
            "batch",
        )
    }
    path = provenance.write_json(
        Path(FLAGS.out) / "drafter_acceptance.json", {"rows": rows, "flags": flags_rec}, prov
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    define_flags()
    sf.run(main, validate, "drafter_acceptance")
