r"""The shipped zoo, evaluated: each model's size, tokenizer, c_i and acceptance per domain.

  python experiments/evaluate_zoo.py --write_docs          # docs/results/zoo.md, ~2 min
  python experiments/evaluate_zoo.py --zoo runs/train_zoo/zoo --out runs/evaluate_zoo

Loads the zoo (`specjax.models.zoo.load_zoo`, `--zoo`, default the shipped one), counts
every model's parameters, takes its tokenizer and token shares from the manifest, prices
each drafter at c_i = its parameters ÷ the verifier's, and re-measures every drafter's
acceptance α = Σ min(p, q) per domain in verifier space on the shipped held-out text
(`specjax.measure.evaluation.acceptance_rates`: verifier τ = 1, each drafter at its default
τ, windows of `--window` verifier tokens; `--heldout_bytes` cuts the text for a quick
check), next to the α the manifest recorded when the zoo was built (`experiments/train_zoo.py`). Writes
``zoo.json`` under --out; ``--write_docs`` writes docs/results/zoo.md (``--docs_dir``).
"""

from __future__ import annotations

from pathlib import Path

import jax
import numpy as np
from absl import flags

from specjax.data import load_heldout
from specjax.engine.deployment import from_zoo
from specjax.measure.evaluation import acceptance_rates
from specjax.models import zoo as zoo_lib
from specjax.runner import provenance
from specjax.runner import script_flags as sf

FLAGS = flags.FLAGS
PAGE = "zoo"
DOMAINS = ("code", "prose", "reasoning")


def define_flags():
    """The script's flags (defined only when it runs as a script)."""
    provenance.define_common_flags(out="runs/evaluate_zoo", page=PAGE)
    flags.DEFINE_string("zoo", None, "zoo path (default: $SPECJAX_ZOO, else the shipped zoo)")
    flags.DEFINE_integer(
        "window",
        128,
        "verifier tokens of context per held-out window (the window train_zoo.py measures with)",
    )
    flags.DEFINE_integer(
        "heldout_bytes", 0, "use only this many bytes of each domain's held-out text (0: all of it)"
    )


def validate() -> None:
    """Every flag, before anything is printed, loaded or written (`sf.run`): a
    `ConfigError` naming the flag, its value and what is allowed."""
    _, manifest = sf.zoo("--zoo", FLAGS.zoo)
    max_len = int(manifest["models"]["verifier"]["config"]["max_len"])
    sf.integer("--window", FLAGS.window, 2, max_len)
    sf.integer("--heldout_bytes", FLAGS.heldout_bytes, 0)


def evaluate(zoo, window: int = 128, heldout_bytes: int = 0) -> dict:
    """Every model's record (params, tokenizer, shares, c_i, α per domain: measured and
    recorded) and the zoo's size; see the module docstring."""
    manifest = zoo.manifest
    names = [zoo.verifier.name] + [m.name for m in zoo.drafters]
    n_params = {
        m.name: int(sum(x.size for x in jax.tree.leaves(m.params)))
        for m in (zoo.verifier,) + zoo.drafters
    }
    dep = from_zoo(zoo)
    alpha = {n: {} for n in dep.names}
    for dom in DOMAINS:
        text = load_heldout(dom)
        if heldout_bytes:
            text = text.encode("utf-8")[:heldout_bytes].decode("utf-8", "ignore")
        for name, a in zip(dep.names, acceptance_rates(dep, text, window=window)):
            alpha[name][dom] = float(a)
    models = {}
    for name in names:
        rec = manifest["models"][name]
        tok = manifest["tokenizers"][rec["tokenizer"]]
        models[name] = dict(
            role=rec["role"],
            n_params=n_params[name],
            tokenizer=rec["tokenizer"],
            vocab_size=tok["vocab_size"],
            special_tokens=tok.get("special_tokens", []),
            token_shares=_token_shares(rec),
            domains=rec.get("domains", []),
            temperature=rec.get("temperature"),
            cost=n_params[name] / n_params[zoo.verifier.name],
            train_wall_s=rec.get("train", {}).get("wall_s"),
            reused=bool(rec.get("train", {}).get("reused")),
            alpha=alpha.get(name),
            recorded_alpha=rec.get("acceptance"),
        )
    size = sum(f.stat().st_size for f in Path(zoo.path).rglob("*") if f.is_file())
    return dict(
        models=models,
        drafter_order=manifest.get("drafter_order", []),
        extra_drafters=manifest.get("extra_drafters", []),
        window=window,
        heldout_bytes=heldout_bytes,
        zoo_bytes=size,
        wall_s=manifest.get("wall_s"),
        created_by=manifest.get("created_by"),
    )


def _token_shares(rec: dict) -> dict:
    """A model's training token shares per domain (a record written before shares were
    recorded: equal shares of its corpus domains, as train_zoo.py's --reuse reads it)."""
    if rec.get("token_shares"):
        return dict(rec["token_shares"])
    domains = list(rec.get("train", {}).get("corpus", rec.get("domains", [])))
    return {d: 1 / len(domains) for d in domains}


def _shares(rec: dict) -> str:
    shares = rec["token_shares"]
    if len(shares) == 1:
        return f"{next(iter(shares))} only"
    values = [shares.get(d, 0) for d in DOMAINS]
    if len(set(values)) == 1:
        return f"1/{len(values)} each"
    return " / ".join(f"{v:.2g}" for v in values)


def _tokenizer(rec: dict, verifier: dict) -> str:
    if rec is verifier:
        return f"{rec['tokenizer']} BPE-{rec['vocab_size']}"
    if rec["tokenizer"] == verifier["tokenizer"]:
        return "verifier"
    extra = [t for t in rec["special_tokens"] if t.startswith("<") and "think" in t]
    return f"{rec['tokenizer']} BPE-{rec['vocab_size']}" + (
        " + " + "/".join(f"`{t}`" for t in extra) if extra else ""
    )


def render_page(res: dict) -> list[str]:
    """docs/results/zoo.md's body (below the provenance header), every figure the run's (α
    measured by this run; training times and the recorded α from the manifest)."""
    models = res["models"]
    verifier = next(r for r in models.values() if r["role"] == "verifier")
    lines = [
        "| model | params | tokenizer | token shares (code / prose / reasoning) | c_i | "
        "α code / prose / reasoning | mixed α | α recorded in the manifest (mixed) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, r in models.items():
        label = name + (" (extra)" if name in res["extra_drafters"] else "")
        if r["role"] == "verifier":
            lines.append(
                f"| {label} | {r['n_params']:,} | {_tokenizer(r, verifier)} | "
                f"{_shares(r)} | 1 | — | — | — |"
            )
            continue
        a = r["alpha"]
        best = {d: max(models[m]["alpha"][d] for m in res["drafter_order"]) for d in DOMAINS}
        cells = [
            (
                f"**{a[d]:.3f}**"
                if name in res["drafter_order"] and a[d] == best[d]
                else f"{a[d]:.3f}"
            )
            for d in DOMAINS
        ]
        rec = r["recorded_alpha"] or {}
        recorded = (
            f"{np.mean([rec[d] for d in DOMAINS]):.3f}" if all(d in rec for d in DOMAINS) else "—"
        )
        lines.append(
            f"| {label} | {r['n_params']:,} | {_tokenizer(r, verifier)} | "
            f"{_shares(r)} | {r['cost']:.3f} | {' / '.join(cells)} | "
            f"{np.mean([a[d] for d in DOMAINS]):.3f} | {recorded} |"
        )
    temps = " / ".join(
        f"{models[n]['temperature']:g}"
        for n in list(res["drafter_order"]) + list(res["extra_drafters"])
    )
    text = (
        "the shipped held-out text"
        if not res["heldout_bytes"]
        else f"the first {res['heldout_bytes']:,} bytes of each domain's held-out text"
    )
    lines += [
        "",
        f"α = Σ min(p, q) per domain in verifier space on {text} (verifier τ = 1, "
        f"drafters at their default τ: {temps}; windows of {res['window']} verifier "
        "tokens); bold: the best of the deployment's drafters on that domain. c_i = the "
        "drafter's parameters ÷ the verifier's.",
    ]
    trained = [
        f"{n} {r['train_wall_s']:,.0f} s" + (" (reused)" if r["reused"] else "")
        for n, r in models.items()
        if r["train_wall_s"] is not None
    ]
    if trained:
        lines += [
            "",
            "Training times recorded in the manifest (each measured when that model "
            "was trained): " + ", ".join(trained) + ".",
        ]
    if res["zoo_bytes"]:
        lines += ["", f"Zoo size on disk: {res['zoo_bytes'] / 1e6:.1f} MB."]
    return lines


def main(argv):
    del argv
    prov = provenance.provenance()
    manifest = zoo_lib.load_zoo(FLAGS.zoo).manifest
    zoo = zoo_lib.load_zoo(
        FLAGS.zoo, names=[*manifest["drafter_order"], *manifest.get("extra_drafters", [])]
    )
    res = evaluate(zoo, FLAGS.window, FLAGS.heldout_bytes)
    for line in render_page(res):
        print(line)
    print(f"wrote {provenance.write_json(Path(FLAGS.out) / 'zoo.json', res, prov)}")
    if FLAGS.write_docs:
        page = provenance.write_page(
            PAGE, "The zoo (experiments/evaluate_zoo.py)", render_page(res), prov, FLAGS.docs_dir
        )
        print(f"wrote {page}")


if __name__ == "__main__":
    define_flags()
    sf.run(main, validate, "evaluate_zoo")
