r"""A feature drafter's teacher-forced α on held-out replies, by drafter temperature and top-m.

  python experiments/drafter_alpha.py \
      --features code=runs/eagle3/feat_L2-15-30_heldout_code.npz,prose=runs/eagle3/feat_L2-15-30_heldout_prose.npz
  python experiments/drafter_alpha.py --eagle runs/eagle3/eagle_ftC.npz --temperatures 0.9,1,1.1 \
      --features code=...

For the feature drafter ``--eagle`` (the shipped ``eagle``, or a file train_eagle.py wrote)
and each ``label=FILE`` of ``--features`` (held-out verifier features, ``feat_*heldout_*.npz``
from ``train_eagle.py --stage=features``), `specjax.train.distill_eagle.feature_alpha` at every
drafter temperature of ``--temperatures``: Leviathan α = Σ min(p, q_T) at draft step 1 and
2 (verifier τ 1), and how often the verifier's argmax is among the drafter's m most likely
ids at step 1 for m = 1 … ``--top_m`` — the root acceptance at verifier τ 0 of m twins
drafting greedily without replacement (`benchmark_real.py --drafters eagle*m`).

Two questions it answers: is the drafter calibrated (α largest at T = 1), and what can a
tree of its samples reach at the root. Prints a table and writes ``drafter_alpha.json``
under --out. About a minute per features file and temperature on 2 cores.
"""

from __future__ import annotations

from pathlib import Path

from absl import flags

from specjax.runner import provenance
from specjax.runner import script_flags as sf

FLAGS = flags.FLAGS


def define_flags():
    """The script's flags (defined only when it runs as a script)."""
    provenance.define_common_flags(out="runs/drafter_alpha")
    flags.DEFINE_string("eagle", "eagle", "the feature drafter: 'eagle' (shipped) or a .npz file")
    flags.DEFINE_list("features", [], "label=FILE held-out feature files (train_eagle.py's)")
    flags.DEFINE_list("temperatures", ["1.0"], "drafter temperatures (> 0)")
    flags.DEFINE_integer("top_m", 3, "top-m coverage of the verifier's argmax, m = 1..top_m", 1)


#: What `specjax.train.distill_eagle.Features.load` reads from a features file.
FEATURE_KEYS = ("tokens", "length", "prompt_len", "feats")


def _features() -> list[tuple[str, Path]]:
    """(label, file) per --features entry (checked by `validate`)."""
    return [(e.partition("=")[0], Path(e.partition("=")[2])) for e in FLAGS.features]


def validate() -> None:
    """Every flag, before anything is printed, loaded or written (`sf.run`): a
    `ConfigError` naming the flag, its value and what is allowed."""
    sf.check(FLAGS.temperatures, "--temperatures", "", "one or more numbers > 0")
    temps = [sf.number("--temperatures", t, 0.0, 100.0, lo_open=True) for t in FLAGS.temperatures]
    sf.check(
        len(set(temps)) == len(temps),
        "--temperatures",
        ",".join(FLAGS.temperatures),
        "numbers > 0, each once",
    )
    sf.integer("--top_m", FLAGS.top_m, 1, 64)
    allowed = "label=FILE, FILE a features .npz (train_eagle.py --stage=features)"
    sf.check(FLAGS.features, "--features", "", f"one or more entries {allowed}")
    for entry in FLAGS.features:
        label, _, path = entry.partition("=")
        sf.check(label and path, "--features", entry, allowed)
        sf.npz_file("--features", path, allowed, keys=FEATURE_KEYS, shown=entry)
    labels = [label for label, _ in _features()]
    sf.check(
        len(set(labels)) == len(labels),
        "--features",
        ",".join(FLAGS.features),
        f"entries {allowed}, distinct labels",
    )
    sf.drafter_file("--eagle", FLAGS.eagle, feature=True)


def main(argv):
    del argv
    files, temps = _features(), [float(t) for t in FLAGS.temperatures]  # checked by `validate`
    from specjax.models import real_zoo  # pylint: disable=import-outside-toplevel
    from specjax.models.gguf import smollm2  # pylint: disable=import-outside-toplevel
    from specjax.train import distill_eagle  # pylint: disable=import-outside-toplevel

    prov = provenance.provenance()
    model = smollm2(max_len=1024, dtype="float32")
    lm, params, _ = real_zoo.load_eagle(FLAGS.eagle, model)
    rows = []
    for label, path in files:
        data = distill_eagle.Features.load(path)
        for t in temps:
            r = distill_eagle.feature_alpha(lm, params, data, temperature=t, top_m=FLAGS.top_m)
            rows.append(dict(features=label, file=str(path), temperature=t, **r))
            tops = "  ".join(f"top{m} {r[f'top{m}_1']:.4f}" for m in range(1, FLAGS.top_m + 1))
            print(
                f"{label:8} T {t:<5g} α step 1 {r['alpha1']:.4f}  step 2 {r['alpha2']:.4f}  "
                f"greedy {tops}  ({r['positions']} positions)",
                flush=True,
            )
    flags_rec = {k: FLAGS[k].value for k in ("eagle", "features", "temperatures", "top_m")}
    path = provenance.write_json(
        Path(FLAGS.out) / "drafter_alpha.json", {"rows": rows, "flags": flags_rec}, prov
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    define_flags()
    sf.run(main, validate, "drafter_alpha")
