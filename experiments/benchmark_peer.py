r"""specjax against transformers' assisted generation, on the same weights (`specjax.measure.peer`).

  python experiments/benchmark_peer.py --out runs/benchmark_peer
  python experiments/benchmark_peer.py --gamma 4 --prompts_per_domain 2 --new_tokens 32

The zoo's verifier and its best drafter exported to Hugging Face Llama folders, then the
same prompts decoded by specjax and by `transformers` (plain and assisted generation),
greedy and sampled, batch 1; see `specjax.measure.peer` for what is measured. Prints a table and
writes ``benchmark_peer.json`` under --out. Needs torch and transformers. About 3 minutes
at the defaults on 2 cores.
"""

from __future__ import annotations

from pathlib import Path

from absl import flags

from specjax.measure import peer
from specjax.runner import provenance
from specjax.runner import script_flags as sf

FLAGS = flags.FLAGS


def define_flags():
    """The script's flags (defined only when it runs as a script)."""
    provenance.define_common_flags(out="runs/benchmark_peer")
    flags.DEFINE_string(
        "drafter",
        "auto",
        "the zoo drafter (must share the verifier's "
        "tokenizer); 'auto': the one of the verifier's tokenizer group with the "
        "highest mean acceptance in the zoo manifest",
    )
    flags.DEFINE_string(
        "cross_drafter",
        "reasoning",
        "a zoo drafter of another tokenizer, run "
        "against transformers' different-tokenizer assisted generation ('' to "
        "skip)",
    )
    flags.DEFINE_integer("gamma", 4, "γ, draft tokens per round")
    flags.DEFINE_integer(
        "prompts_per_domain", 2, "plan prompts per domain (code, prose, reasoning)"
    )
    flags.DEFINE_integer("new_tokens", 48, "tokens generated per prompt")
    flags.DEFINE_integer("seed", 0, "PRNG seed (specjax rows; torch.manual_seed)")
    flags.DEFINE_string("zoo", None, "zoo path (default: $SPECJAX_ZOO, else the shipped zoo)")


def validate() -> None:
    """Every flag, before anything is printed, loaded or written (`sf.run`): a
    `ConfigError` naming the flag, its value and what is allowed."""
    sf.packages(("torch", "transformers"), "the peer is transformers on PyTorch")
    _, manifest = sf.zoo("--zoo", FLAGS.zoo)
    models = manifest["models"]
    tok = models["verifier"]["tokenizer"]
    names = sf.zoo_drafters(manifest)
    same = [n for n in names if models[n]["tokenizer"] == tok]
    other = [n for n in names if models[n]["tokenizer"] != tok]
    sf.check(
        FLAGS.drafter in ("auto", *same),
        "--drafter",
        FLAGS.drafter,
        f"auto or a zoo drafter of the verifier's tokenizer: one of {', '.join(same)}",
    )
    sf.check(
        FLAGS.cross_drafter in ("", *other),
        "--cross_drafter",
        FLAGS.cross_drafter,
        f"'' (none) or a zoo drafter of another tokenizer: one of {', '.join(other)}",
    )
    sf.integer("--gamma", FLAGS.gamma, 1, 64)
    sf.integer("--prompts_per_domain", FLAGS.prompts_per_domain, 1, 24)
    max_len = int(models["verifier"]["config"]["max_len"])
    sf.integer("--new_tokens", FLAGS.new_tokens, 1, max_len // 2)
    sf.integer("--seed", FLAGS.seed, 0, 2**31 - 1)


def main(argv):
    del argv
    prov = provenance.provenance()
    result = peer.run(
        FLAGS.zoo,
        FLAGS.out,
        FLAGS.drafter,
        FLAGS.cross_drafter,
        FLAGS.gamma,
        FLAGS.prompts_per_domain,
        FLAGS.new_tokens,
        FLAGS.seed,
    )
    peer.print_result(result)
    path = provenance.write_json(Path(FLAGS.out) / "benchmark_peer.json", result, prov)
    print(f"wrote {path}")


if __name__ == "__main__":
    define_flags()
    sf.run(main, validate, "benchmark_peer")
