r"""Speed on a real verifier: SmolLM2-135M-Instruct or Gemma-3-270M (GGUF, dequantized) on
this machine.

  python experiments/benchmark_real.py      # every default: ~80 engine programs, over an hour here
  make benchmark-real-headline              # docs/results/real_speed_headline.md's command
  python experiments/benchmark_real.py --deployment gemma3 --dtypes bfloat16 \
      --dtype bfloat16 --drafters smollm2,lookup --doc_name gemma3_speed --write_docs
  python experiments/benchmark_real.py --parts ratio --dtypes float32,bfloat16
  python experiments/benchmark_real.py --parts spec --drafters code,lookup --gammas 2,4 --batches 1
  python experiments/benchmark_real.py --parts spec --dtype bfloat16 --drafters lookup,lookup+code+prose

``--deployment`` names the deployment kind measured (`specjax.runner.deployments`: a kind
with a ``real_speed_target()``, smollm2 or gemma3): its verifier's loader, its drafters,
its GGUF file for transformers; Gemma-3-270M's prompts are the plan prompts as plain text
(a base model: no chat template), its drafters smollm2 (across vocabularies) and lookup.

Parts (``--parts``, in this order; one process, nothing timed concurrently):
  machine  CPU model, caches, load; stream bandwidth (a jitted sum over 1 GiB, best of 5).
  ratio    T_step and T_score(k) for k = 1..9 at batch 1 and 8 per dtype (one-token and
           k-token verifier forwards over 100 cached tokens, jitted in a `lax.scan`,
           interleaved, min of 3 runs), against the bandwidth floor (weight bytes read per
           forward ÷ stream bandwidth) and the roofline projection of the same forwards on
           one TPU v5e chip and one H100 (bf16 weights; bytes and FLOPs counted from the
           model).
  spec     per batch, verifier τ, drafter (or '+'-joined drafters: one token tree of their
           chains per row) and γ: AR and speculative tokens/s (the engine's
           compiled programs, compilation and the first run excluded, AR and speculative
           runs alternating, medians of paired ratios), α, tokens per round, c = T_draft /
           T_step, Leviathan's speed-up and the hardware-aware prediction
           E·T_step / (γ·T_draft + T_score(γ+1)), measured ÷ hardware-aware; AR against
           its bandwidth floor (the weights' and the KV cache's bytes a decode step reads ÷
           stream bandwidth).
  peer     transformers on the same GGUF weights (f32, eager): plain greedy `generate`,
           prompt-lookup decoding (`prompt_lookup_num_tokens`), assisted generation with the
           code drafter exported to an HF folder (SmolLM2 only); greedy tokens identical to
           specjax's.

The measurement is `specjax.measure.real_speed`'s; this script holds the flags, their
checks and the writes. Writes ``real_speed.json`` under --out; ``--write_docs`` writes
<docs_dir>/<doc_name>.md (``--docs_dir``, ``--doc_name``) with the command, commit, date and
machine on top. The kept pages: the default --doc_name, docs/results/real_speed_headline.md
(SmolLM2), and docs/results/gemma3_speed.md (``--deployment gemma3 --doc_name
gemma3_speed``); other runs are listed in docs/performance.md.
"""

from __future__ import annotations

from pathlib import Path

from absl import flags

from specjax.measure import drafter_entries as entries
from specjax.measure import real_speed
from specjax.measure.real_speed import MAX_LEN, PARTS
from specjax.models.gguf import parse_layout
from specjax.runner import deployments, provenance
from specjax.runner import script_flags as sf
from specjax.verify import registry

#: The one-chain rules (`--chain_rules`).
_ONE_CHAIN = tuple(r.name for r in registry.all_rules() if r.one_chain)

FLAGS = flags.FLAGS
#: The results page this script's runs belong on (`make benchmark-real-headline` writes it).
PAGE = "real_speed_headline"


def define_flags():
    """The script's flags (defined only when it runs as a script)."""
    provenance.define_common_flags(out="runs/benchmark_real", repeats=3, page=PAGE)
    flags.DEFINE_string(
        "doc_name",
        PAGE,
        "name of the results page --write_docs writes (<docs_dir>/<doc_name>.md)",
    )
    flags.DEFINE_string(
        "deployment",
        "smollm2",
        "the real deployment measured: a deployment kind with a GGUF verifier "
        f"({', '.join(speed_kinds())})",
    )
    flags.DEFINE_list("parts", ["machine", "ratio", "spec", "peer"], "parts to run")
    flags.DEFINE_list(
        "dtypes",
        ["float32:tied", "float32", "bfloat16"],
        "verifier layouts for the ratio part: dtype[:token+token] (gguf.LAYOUT_TOKENS: "
        "'tied' keeps the file's tied head, read as the table's transpose, instead of a "
        "[D, V] copy; 'fused' q/k/v and gate/up tables; 'out_first' weights stored "
        "[out, in])",
    )
    flags.DEFINE_list("ks", [str(k) for k in range(1, 10)], "block widths k (ratio part)")
    flags.DEFINE_list("ratio_batches", ["1", "8"], "batch sizes (ratio part)")
    flags.DEFINE_string(
        "dtype",
        "float32",
        "verifier dtype[:token+token] for the spec and peer parts (tokens as --dtypes')",
    )
    flags.DEFINE_string(
        "ar_reference",
        "",
        "another verifier dtype[:tokens] whose autoregressive decoding is timed in the same paired "
        "rounds (spec part), e.g. float32 beside a bfloat16 run: the model's plain decoding "
        "at the other precision (its own target numerics), which may be faster on this "
        "machine; rows then also give spec / reference AR",
    )
    flags.DEFINE_list(
        "drafters",
        ["code", "prose", "lookup", "reasoning"],
        "drafters (spec part); names joined by '+' (e.g. lookup+code+prose) share each "
        "row as one token tree: one chain per drafter, scored in one (S·γ+1)-token "
        "forward and verified by --tree_rule; NAME*COUNT names a drafter COUNT times "
        "(twins: COUNT chains drafted in one pass, under token_tree their first drafts "
        "drawn without replacement)",
    )
    flags.DEFINE_enum(
        "tree_rule",
        "token_tree",
        [r.name for r in registry.all_rules() if r.allows_slots(2)],
        "verification rule of the '+' setups (one-drafter setups use rule 1, rejection)",
    )
    flags.DEFINE_list(
        "chain_rules",
        ["rejection"],
        "verification rules of the one-drafter setups, one setup each: rejection (rule 1) "
        "and/or block_verification (the chain verified as a block, Sun et al. 2025)",
    )
    flags.DEFINE_enum(
        "q_layout",
        "dense",
        ["dense", "sparse"],
        "how drafts' laws reach the rule (EngineConfig.q_layout; sparse: on the drafters' "
        "ids where each has a known set, e.g. eagle's head and prompt lookup)",
    )
    flags.DEFINE_list("gammas", ["2", "3", "4", "6", "8"], "γ values (spec part)")
    flags.DEFINE_list("batches", ["1", "8"], "batch sizes (spec part)")
    flags.DEFINE_list("taus", ["1.0", "0.0"], "verifier temperatures (spec part)")
    flags.DEFINE_bool(
        "greedy_drafters",
        True,
        "at verifier τ = 0 the drafters draft greedily "
        "too (τ_i = 0; lossless either way); else at their own τ_i",
    )
    flags.DEFINE_integer("new_tokens", 64, "tokens generated per row")
    flags.DEFINE_integer(
        "prompts_per_domain",
        1,
        "plan prompts per domain at batch 1 (rows cycle through the domains at larger batches)",
    )
    flags.DEFINE_string("drafter_dir", "", "folder of drafter_{code,prose}.npz (default: shipped)")
    flags.DEFINE_string(
        "eagle",
        "",
        "a feature drafter file (train_eagle.py's eagle*.npz) for 'eagle' (default: shipped)",
    )


def _validator(name: str):
    def valid(specs) -> bool:
        for spec in [specs] if isinstance(specs, str) else specs:
            if spec:
                try:
                    parse_layout(spec, f"--{name}")
                except ValueError as e:
                    raise flags.ValidationError(str(e)) from None
        return True

    return valid


def speed_kinds() -> dict:
    """The deployment kinds this script measures, by name: those with a
    ``real_speed_target()`` (`specjax.measure.real_speed.Target`)."""
    return {k.name: k for k in deployments.all_kinds() if hasattr(k, "real_speed_target")}


def target() -> real_speed.Target:
    """--deployment's target (checked by `validate`)."""
    return speed_kinds()[FLAGS.deployment].real_speed_target()


def validate() -> None:
    """Every flag, before anything is printed, loaded or written (`sf.run`): a
    `ConfigError` naming the flag, its value and what is allowed."""
    kinds = speed_kinds()
    sf.check(
        FLAGS.deployment in kinds,
        "--deployment",
        FLAGS.deployment,
        f"one of {', '.join(kinds)} (a deployment kind with a real GGUF verifier)",
    )
    parts = sf.names("--parts", FLAGS.parts, PARTS)
    for spec in FLAGS.dtypes:
        parse_layout(spec, "--dtypes")
    parse_layout(FLAGS.dtype, "--dtype")
    if FLAGS.ar_reference:
        parse_layout(FLAGS.ar_reference, "--ar_reference")
    if "ratio" in parts:
        sf.check(FLAGS.dtypes, "--dtypes", "", "one or more layouts with --parts=ratio")
        sf.integers("--ks", FLAGS.ks, 1, 64)
        sf.integers("--ratio_batches", FLAGS.ratio_batches, 1, 1024)
    t = target()
    known = t.drafters
    allowed = (
        f"entries NAME, NAME*COUNT (COUNT >= 1, twins) or such parts joined by '+', "
        f"NAME one of {', '.join(known)} (--deployment {t.name})"
    )
    text = ",".join(FLAGS.drafters)
    sf.check(FLAGS.drafters or "spec" not in parts, "--drafters", text, allowed)
    for e in FLAGS.drafters:
        sf.check(entries.entry_ok(e), "--drafters", text, f"{allowed} ({e!r} does not parse)")
        bad = [n for n in entries.members(e) if n not in known]
        sf.check(
            not bad, "--drafters", text, f"{allowed} ({bad[0] if bad else ''!r} is not one of them)"
        )
    gammas = sf.integers("--gammas", FLAGS.gammas, 1, 64)
    sf.integers("--batches", FLAGS.batches, 1, 1024)
    sf.numbers("--taus", FLAGS.taus, 0.0)
    sf.integer("--new_tokens", FLAGS.new_tokens, 1, MAX_LEN // 2)
    sf.integer("--prompts_per_domain", FLAGS.prompts_per_domain, 1, 24)
    widest = max([len(entries.members(e)) for e in FLAGS.drafters] or [1]) * max(gammas) + 1
    sf.check(
        widest <= 256,
        "--drafters / --gammas",
        f"{text} / {','.join(FLAGS.gammas)}",
        f"blocks of at most 256 tokens (chains × γ + 1; this is {widest})",
    )
    sf.doc_name("--doc_name", FLAGS.doc_name)
    used = {n for e in FLAGS.drafters for n in entries.members(e)} | (
        {t.peer_drafter} if "peer" in parts and t.peer_drafter else set()
    )
    if FLAGS.drafter_dir:
        folder = sf.in_dir(
            "--drafter_dir", FLAGS.drafter_dir, "a folder holding drafter_code.npz / .json"
        )
        wanted = sorted(used & {"code", "prose"})
        sf.check(
            any((folder / f"drafter_{n}.npz").exists() for n in wanted) or not wanted,
            "--drafter_dir",
            FLAGS.drafter_dir,
            f"a folder holding drafter_{{{','.join(wanted)}}}.npz (none of them is there)",
        )
        for n in wanted:
            f = folder / f"drafter_{n}.npz"
            if f.exists() or f.is_symlink():
                sf.drafter_file("--drafter_dir", f, shown=FLAGS.drafter_dir)
    if FLAGS.eagle:
        sf.drafter_file("--eagle", FLAGS.eagle, feature=True)


def main(argv):
    del argv
    prov = provenance.provenance()
    settings = real_speed.Settings.from_values(FLAGS.flag_values_dict())
    t = target()
    result = real_speed.measure(settings, prov["machine"], t)
    provenance.write_outputs(
        Path(FLAGS.out) / "real_speed.json",
        result,
        prov,
        page=FLAGS.doc_name if FLAGS.write_docs else None,
        title=f"Speed on the real verifier ({t.model})",
        body=real_speed.page,
        docs_dir=FLAGS.docs_dir,
    )


if __name__ == "__main__":
    define_flags()
    for _name in ("dtypes", "dtype", "ar_reference"):
        flags.register_validator(_name, _validator(_name))
    flags.register_validator(
        "drafters",
        lambda v: all(entries.entry_ok(e) for e in v),
        "--drafters: entries NAME, NAME*COUNT (COUNT ≥ 1, twins) or such parts joined by '+'",
    )
    flags.register_validator(
        "chain_rules",
        lambda v: bool(v) and all(r in _ONE_CHAIN for r in v),
        f"--chain_rules: one or more of {', '.join(_ONE_CHAIN)}",
    )
    flags.register_validator(
        "eagle",
        lambda v: not v or (Path(v).suffix == ".npz" and Path(v).is_file()),
        "--eagle: an existing feature drafter .npz file (train_eagle.py's eagle*.npz)",
    )
    sf.run(main, validate, "benchmark_real")
