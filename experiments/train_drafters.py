r"""Drafters distilled from SmolLM2-135M-Instruct (`make train-drafters`), and the real
verifiers' generations a feature drafter trains on (``--verifier``).

  python experiments/train_drafters.py                       # every stage, every domain
  python experiments/train_drafters.py --stage=generate --domains=code
  python experiments/train_drafters.py --stage=train --targets=hard --tag=hard
  python experiments/train_drafters.py --stage=generate,train,eval    # no shipping
  python experiments/train_drafters.py --stage=generate,train,eval --domains=code \
      --new_tokens=128 --init_from=shipped --steps=2400 --time_budget_s=3000 --tag=more
  python experiments/train_drafters.py --stage=eval --domains=code,prose \
      --new_tokens=128 --out=runs/drafters_shipped     # the shipped drafters' held-out α
  python experiments/train_drafters.py --verifier=gemma3 --stage=generate \
      --domains=code,prose --prompts=320 --new_tokens=128 --dtype=bfloat16 \
      --out=runs/eagle_gemma3_data                     # Gemma-3-270M's, for train_eagle.py

``--verifier`` (`specjax.train.verifiers`): ``smollm2`` (default) or ``gemma3``
(Gemma-3-270M, the optional package: a base model, prompts as plain text after its BOS;
the generate stage only, the distilled drafters are SmolLM2's).

Stages (each writes its files atomically under --out and is skipped when they exist, so
a killed run resumes):
  generate  the verifier's replies to --prompts train-split prompts per domain, in its chat
            template (plain text after its BOS for a base model), with its top-k log-probs (`specjax.train.distill.generate`):
            ``gen_{domain}.npz``; and to the 24 shipped (held-out) plan prompts:
            ``heldout_{domain}.npz``.
  train     one `SubsetVocabLM` per domain (`specjax.train.distill.train_drafter`):
            ``drafter_{domain}{tag}.npz`` + ``.json`` (recipe, coverage, loss, time).
  eval      each drafter's Leviathan α against the verifier on every domain's held-out
            replies (`specjax.measure.evaluation.acceptance_rates` on the joined text), and the
            distilled drafters' α and top-1 agreement on the reply positions alone
            (`specjax.train.distill.reply_alpha`): ``eval{tag}.json``. Without drafters under
            --out it evaluates the shipped ones (writing the held-out replies it needs).
  ship      copies the drafters in bf16 into specjax/zoo_smollm2/ with a manifest.

``--stage`` takes one stage, ``all`` or a comma-separated list. ``make train-drafters`` (the
shipped drafters' recipe) takes about an hour on 2 cores.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from absl import flags

from specjax.runner import provenance
from specjax.runner import script_flags as sf

FLAGS = flags.FLAGS
STAGES = ("generate", "train", "eval", "ship")
DOMAINS = ("code", "prose", "reasoning")
#: The verifier's context in every stage (`_verifier`).
MAX_LEN = 1024


def define_flags():
    """The script's flags (defined only when it runs as a script)."""
    provenance.define_common_flags(out="runs/drafters")
    flags.DEFINE_list("stage", ["all"], "stages to run: all, or some of " + ", ".join(STAGES))
    flags.register_validator(
        "stage",
        lambda v: set(v) <= {"all", *STAGES},
        "--stage: all or a list of " + ", ".join(STAGES),
    )
    flags.DEFINE_enum(
        "verifier",
        "smollm2",
        ["smollm2", "gemma3"],
        "the verifier (specjax.train.verifiers): its model, prompt format and --stage choice",
    )
    flags.DEFINE_list("domains", ["code", "prose", "reasoning"], "domains")
    flags.DEFINE_integer("prompts", 640, "train-split prompts per domain")
    flags.DEFINE_integer(
        "seed", 0, "seed of the train-split prompt draw and the verifier's sampling (generate)"
    )
    flags.DEFINE_integer("new_tokens", 160, "tokens the verifier writes per prompt")
    flags.DEFINE_enum(
        "rows_from",
        "verifier",
        ["verifier", "corpus"],
        "generate: the verifier's replies (sampled, with its top-k), or the corpus's own "
        "text after each prompt, --new_tokens of it (distill_eagle.text_rows: prefilled "
        "only, for train_eagle.py --more_data; code and prose; no held-out replies)",
    )
    flags.DEFINE_integer("batch", 32, "rows per generation batch")
    flags.DEFINE_float("temperature", 1.0, "the verifier's τ while writing the training text")
    flags.DEFINE_enum("targets", "soft", ["soft", "hard"], "soft: top-k distribution; hard: token")
    flags.DEFINE_integer("steps", 800, "training steps per drafter")
    flags.DEFINE_float("time_budget_s", 900, "training seconds per drafter at most")
    flags.DEFINE_string("tag", "", "suffix of the drafter files (e.g. a variant's name)")
    flags.DEFINE_string("dtype", "float32", "the verifier's dtype")
    flags.DEFINE_string(
        "init_from",
        "",
        "train: continue from existing drafters instead of fresh ones: 'shipped' (the "
        "zoo's, per domain) or a folder holding drafter_{domain}.npz",
    )


def _spec():
    """The ``--verifier``'s record (`specjax.train.verifiers.VERIFIERS`)."""
    from specjax.train import verifiers  # pylint: disable=import-outside-toplevel

    return verifiers.get(FLAGS.verifier)


def _verifier():
    return _spec().load(max_len=MAX_LEN, dtype=FLAGS.dtype)


def _prompted(model, prompts) -> dict:
    """`distill.generate`'s texts and prefix for ``prompts`` in the verifier's format."""
    spec = _spec()
    return {"texts": [spec.prompt_text(model, p) for p in prompts], "prefix": spec.prefix(model)}


def _heldout(out: Path, model, d: str):
    """The verifier's replies to the shipped (held-out) plan prompts of domain ``d``:
    ``heldout_{d}.npz``, written once."""
    from specjax.data.shipped import load_prompts  # pylint: disable=import-outside-toplevel
    from specjax.train import distill  # pylint: disable=import-outside-toplevel

    path = out / f"heldout_{d}.npz"
    if not path.exists():
        prompts = [p["prompt"] for p in load_prompts([d])]
        g = distill.generate(
            model,
            **_prompted(model, prompts),
            new_tokens=FLAGS.new_tokens,
            batch=min(FLAGS.batch, len(prompts)),
            temperature=FLAGS.temperature,
            seed=1,
        )
        g.save(path)
    return distill.Generated.load(path)


def stage_generate(out: Path, model) -> None:
    from specjax.train import distill  # pylint: disable=import-outside-toplevel

    if FLAGS.rows_from == "corpus":
        from specjax.train.distill_eagle import text_rows  # pylint: disable=import-outside-toplevel

        for d in FLAGS.domains:
            path = out / f"gen_{d}.npz"
            if not path.exists():
                spec = _spec()
                text_rows(
                    model,
                    d,
                    FLAGS.prompts,
                    FLAGS.new_tokens,
                    seed=FLAGS.seed,
                    prompt_text=spec.prompt_text,
                    prefix=spec.prefix(model),
                ).save(path)
                print(f"{d}: corpus rows written to {path}", flush=True)
        return
    for d in FLAGS.domains:
        _heldout(out, model, d)
    for d in FLAGS.domains:
        path = out / f"gen_{d}.npz"
        if path.exists():
            continue
        prompts = distill.domain_prompts(d, FLAGS.prompts, seed=FLAGS.seed)
        t0 = time.perf_counter()
        g = distill.generate(
            model,
            **_prompted(model, prompts),
            new_tokens=FLAGS.new_tokens,
            batch=FLAGS.batch,
            temperature=FLAGS.temperature,
            seed=FLAGS.seed,
        )
        g.save(path)
        print(
            f"{d}: {distill.summarize(g)} in {time.perf_counter() - t0:.0f} s "
            f"(load {os.getloadavg()[0]:.1f})",
            flush=True,
        )


def stage_train(out: Path, model) -> None:
    from specjax.train import distill  # pylint: disable=import-outside-toplevel

    for d in FLAGS.domains:
        path = out / f"drafter_{d}{FLAGS.tag}.npz"
        if path.exists():
            continue
        data = distill.Generated.load(out / f"gen_{d}.npz")
        recipe = distill.DrafterRecipe(targets=FLAGS.targets, steps=FLAGS.steps)
        init, prior = None, None
        if FLAGS.init_from:
            from specjax.models import real_zoo  # pylint: disable=import-outside-toplevel

            src = _init_source(d)
            lm0, params0, prior = real_zoo.load_drafter(src)
            init = (lm0, params0)
        lm, params, hist = distill.train_drafter(
            data, model, recipe, time_budget_s=FLAGS.time_budget_s, init=init
        )
        if prior is not None:
            hist["continued_from"] = {
                "file": str(real_zoo.drafter_path(src)),
                "recipe": prior.get("recipe"),
                "made_by": prior.get("made_by"),
            }
        import dataclasses  # pylint: disable=import-outside-toplevel

        from specjax.models.real_zoo import save_drafter  # pylint: disable=import-outside-toplevel

        save_drafter(
            path,
            lm,
            params,
            {
                "recipe": dataclasses.asdict(recipe),
                "history": hist,
                "data": distill.summarize(data),
                "domain": d,
                "load_average": list(os.getloadavg()),
            },
        )
        print(
            f"{d}: trained in {hist['seconds']:.0f} s, coverage {hist['coverage']:.3f}, "
            f"final loss {hist['loss'][-1][1]:.3f}",
            flush=True,
        )


def stage_eval(out: Path, model, prov: dict) -> None:
    """α of every drafter of the real deployment (the distilled ones, the zoo's cross-
    vocabulary reasoning drafter, prompt lookup) on each domain's held-out replies."""
    from specjax.engine.deployment import LOOKUP  # pylint: disable=import-outside-toplevel
    from specjax.measure.evaluation import acceptance_rates  # pylint: disable=import-outside-toplevel
    from specjax.models import real_zoo  # pylint: disable=import-outside-toplevel
    from specjax.runner.deployments.smollm2 import from_smollm2  # pylint: disable=import-outside-toplevel
    from specjax.train import distill  # pylint: disable=import-outside-toplevel

    files = {
        d: str(out / f"drafter_{d}{FLAGS.tag}.npz")
        for d in real_zoo.DISTILLED
        if (out / f"drafter_{d}{FLAGS.tag}.npz").exists()
    }
    # No drafters trained under --out: the shipped ones are evaluated.
    files = files or {d: str(real_zoo.drafter_path(d)) for d in real_zoo.DISTILLED}
    names = list(files) + ["reasoning", LOOKUP]
    dep = from_smollm2(names, verifier=model, drafters=files, chat=False)
    res = {"drafters": names, "alpha": {}, "load_average": list(os.getloadavg())}
    for d in FLAGS.domains:
        held = _heldout(out, model, d)
        # The domain's replies (template + prompt + reply) joined into one stream cut in
        # windows of 512 verifier tokens: one shape, so one compiled program per drafter.
        text = "".join(distill.heldout_text(model, None, held))
        alpha = acceptance_rates(dep, text, window=512)
        res["alpha"][d] = dict(zip(names, map(float, alpha)))
        print(
            f"held-out {d}: " + ", ".join(f"α({n}) {a:.3f}" for n, a in zip(names, alpha)),
            flush=True,
        )
    # The distilled drafters on the replies alone (the positions a round meets; the
    # stream above also counts the template and the prompts): α at τ 1 and top-1 agreement.
    res["reply_alpha"] = {}
    for name, path in files.items():
        lm, params, _ = real_zoo.load_drafter(path)
        for d in FLAGS.domains:
            held = _heldout(out, model, d)
            r = distill.reply_alpha(model, lm, params, held, temperature=1.0)
            res["reply_alpha"].setdefault(d, {})[name] = r
            print(
                f"held-out {d} replies: {name} α {r['alpha']:.3f}, top-1 {r['top1']:.3f} "
                f"({r['positions']} positions)",
                flush=True,
            )
    provenance.write_json(out / f"eval{FLAGS.tag}.json", res, prov)


def stage_ship(out: Path, model) -> None:
    """The drafters in bf16 into specjax/zoo_smollm2/, with their held-out α."""
    from specjax.models import real_zoo  # pylint: disable=import-outside-toplevel

    ev = json.loads((out / f"eval{FLAGS.tag}.json").read_text())
    for d in real_zoo.DISTILLED:
        src = out / f"drafter_{d}{FLAGS.tag}.npz"
        if not src.exists():
            continue
        lm, params, info = real_zoo.load_drafter(src)
        info["heldout_alpha"] = {dom: a.get(d) for dom, a in ev["alpha"].items()}
        info["made_by"] = "make train-drafters (experiments/train_drafters.py)"
        real_zoo.save_drafter(real_zoo.DRAFTER_DIR / f"{d}.npz", lm, params, info, dtype="bfloat16")
        print(f"shipped {d}: {(real_zoo.DRAFTER_DIR / f'{d}.npz').stat().st_size / 1e6:.1f} MB")
    del model


def _init_source(d: str):
    """The drafter ``--init_from`` names for domain ``d``: a shipped name or a file."""
    return d if FLAGS.init_from == "shipped" else Path(FLAGS.init_from) / f"drafter_{d}.npz"


def _stages() -> list[str]:
    return [s for s in STAGES if s in FLAGS.stage or "all" in FLAGS.stage]


def validate() -> None:
    """Every flag and every file the stages read that no earlier stage of this run writes,
    before anything is printed, loaded or written (`sf.run`): a `ConfigError` naming the
    flag, its value and what is allowed."""
    sf.names("--domains", FLAGS.domains, DOMAINS)
    sf.integer("--prompts", FLAGS.prompts, 1, 100_000)
    sf.integer("--seed", FLAGS.seed, 0)
    sf.integer("--new_tokens", FLAGS.new_tokens, 1, MAX_LEN // 2)
    sf.integer("--batch", FLAGS.batch, 1, 4096)
    sf.number("--temperature", FLAGS.temperature, 0.0, 100.0)
    sf.integer("--steps", FLAGS.steps, 1)
    sf.number("--time_budget_s", FLAGS.time_budget_s, 0.0, lo_open=True)
    sf.check(
        "/" not in FLAGS.tag and "\0" not in FLAGS.tag,
        "--tag",
        FLAGS.tag,
        "a file-name suffix (no '/')",
    )
    sf.dtype("--dtype", FLAGS.dtype)
    spec = _spec()
    sf.check(
        spec.distilled or set(_stages()) <= {"generate"},
        "--stage",
        ",".join(_stages()),
        f"generate with --verifier={spec.name} (the distilled drafters are SmolLM2's; "
        "train_eagle.py trains its feature drafter)",
    )
    spec.path()  # the model is installed (a one-line ConfigError naming it otherwise)
    _check_inputs(Path(FLAGS.out), _stages())


def _check_inputs(out: Path, stages: list[str]) -> None:
    """What the stages read and no earlier stage of this run writes, checked before the
    verifier loads: a `ConfigError` naming the flag and the missing or unreadable file."""
    from specjax.errors import ConfigError  # pylint: disable=import-outside-toplevel
    from specjax.models import real_zoo  # pylint: disable=import-outside-toplevel
    from specjax.train import verifiers  # pylint: disable=import-outside-toplevel

    if out.is_dir():
        verifiers.check_marker("--out", out, _spec())
    if FLAGS.init_from and FLAGS.init_from != "shipped":
        sf.in_dir(
            "--init_from", FLAGS.init_from, "'shipped' or a folder holding drafter_{domain}.npz"
        )
    if FLAGS.rows_from == "corpus" and not set(FLAGS.domains) <= {"code", "prose"}:
        raise ConfigError.invalid(
            "--domains", ",".join(FLAGS.domains), "code and/or prose with --rows_from=corpus"
        )
    for d in FLAGS.domains:
        trained = (out / f"drafter_{d}{FLAGS.tag}.npz").exists()
        gen = out / f"gen_{d}.npz"
        if "train" in stages and "generate" not in stages and not trained and not gen.exists():
            raise ConfigError.invalid(
                "--stage", ",".join(stages), f"train only where {gen} exists (add generate)"
            )
        held = out / f"heldout_{d}.npz"
        if {"generate", "eval"} & set(stages) and held.exists():
            sf.npz_file("--out", held, "a folder whose held-out replies read", shown=str(out))
        if "eval" in stages and trained:
            sf.drafter_file("--out", out / f"drafter_{d}{FLAGS.tag}.npz", shown=str(out))
        if "train" in stages and not trained and gen.exists():
            sf.npz_file(
                "--out",
                gen,
                "a folder whose generations train_drafters.py --stage=generate wrote",
                keys=("prompt", "prompt_len", "tokens", "valid", "top_ids", "top_logp"),
                shown=str(out),
            )
        if "train" in stages and FLAGS.init_from and not trained:
            src = _init_source(d)
            path = real_zoo.drafter_path(src)
            if not path.is_file() or not path.with_suffix(".json").is_file():
                raise ConfigError.invalid(
                    "--init_from",
                    FLAGS.init_from,
                    f"'shipped' or a folder holding drafter_{d}.npz and .json ({path} is missing)",
                )
            sf.drafter_file("--init_from", path, shown=FLAGS.init_from)
    if "ship" in stages and "eval" not in stages and not (out / f"eval{FLAGS.tag}.json").is_file():
        raise ConfigError.invalid(
            "--stage",
            ",".join(stages),
            f"ship only where {out}/eval{FLAGS.tag}.json exists (add eval)",
        )


def main(argv):
    del argv
    prov = provenance.provenance()
    out = Path(FLAGS.out)
    stages = _stages()
    out.mkdir(parents=True, exist_ok=True)
    from specjax.train import verifiers  # pylint: disable=import-outside-toplevel

    verifiers.mark(out, _spec())
    model = _verifier()
    for s in stages:
        if s == "eval":
            stage_eval(out, model, prov)
        else:
            {"generate": stage_generate, "train": stage_train, "ship": stage_ship}[s](out, model)


if __name__ == "__main__":
    define_flags()
    sf.run(main, validate, "train_drafters")
