r"""A feature drafter (EAGLE) for SmolLM2-135M-Instruct or Gemma-3-270M
(`specjax.train.distill_eagle`).

  python experiments/train_eagle.py --data=runs/eagle_data      # every stage
  python experiments/train_eagle.py --stage=features --data=runs/eagle_data
  python experiments/train_eagle.py --stage=train,eval --steps=600 --tag=long
  python experiments/train_eagle.py --verifier=gemma3 --data=runs/eagle_gemma3_data \
      --out=runs/eagle_gemma3 --steps=3000 --time_budget_s=2100 --curve_every=300

``--verifier`` (`specjax.train.verifiers`): ``smollm2`` (default) or ``gemma3``; it sets the
verifier, the defaults of --feature_layers and --kept, the ids the head always keeps and
where --stage=ship writes (specjax/zoo_smollm2/ or specjax/zoo_gemma3/). The generations
must be that verifier's (``train_drafters.py --verifier=...``: their folder says whose).

Reads the verifier's generations written by ``experiments/train_drafters.py
--stage=generate`` (``gen_{domain}.npz`` for training, ``heldout_{domain}.npz``: its
replies to the 24 shipped plan prompts, never trained on) from ``--data``. Stages (each
writes atomically under --out and is skipped when its file exists, so a killed run
resumes):
  features  the verifier's hidden states over those rows: ``feat_{name}.npz``;
  train     one drafter on every training domain together: ``eagle{tag}.npz`` + ``.json``;
  eval      its α (τ 1) and top-1 agreement on each domain's held-out replies, at draft
            step 1 (verifier features) and step 2 (its own): ``eval_eagle{tag}.json``;
  ship      copies the drafter's trained part (bf16) into the verifier's zoo folder.

``--curve_every N``: held-out α (steps 1 and 2, each domain) every N training steps and at
the end, recorded in the drafter's history (``curve``: step, rows seen, epochs, α): the
data curve; its time counts neither in --time_budget_s nor in the schedule's pace.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
from absl import flags

from specjax.runner import provenance
from specjax.runner import script_flags as sf

FLAGS = flags.FLAGS
STAGES = ("features", "train", "eval", "ship")
DOMAINS = ("code", "prose", "reasoning")
#: The verifier's context in every stage (`_verifier`).
MAX_LEN = 1024
_GEN_KEYS = ("prompt", "prompt_len", "tokens", "valid", "top_ids", "top_logp")


def define_flags():
    provenance.define_common_flags(out="runs/eagle")
    flags.DEFINE_list("stage", ["all"], "stages to run: all, or some of " + ", ".join(STAGES))
    flags.register_validator(
        "stage",
        lambda v: set(v) <= {"all", *STAGES},
        "--stage: all or a list of " + ", ".join(STAGES),
    )
    flags.DEFINE_string("data", "runs/eagle_data", "folder of gen_*.npz / heldout_*.npz")
    flags.DEFINE_list(
        "more_data",
        [],
        "more folders of gen_*.npz (train_drafters.py --stage=generate --seed=S), trained on too",
    )
    flags.DEFINE_enum(
        "verifier",
        "smollm2",
        ["smollm2", "gemma3"],
        "the verifier (specjax.train.verifiers): its model, prompt format, feature layers, "
        "head size and zoo folder",
    )
    flags.DEFINE_list("domains", ["code", "prose"], "domains")
    flags.DEFINE_string("dtype", "bfloat16", "the verifier's dtype for the features")
    flags.DEFINE_integer("steps", 400, "training steps")
    flags.DEFINE_integer("batch", 8, "rows per training step")
    flags.DEFINE_float("learning_rate", 1e-3, "peak learning rate")
    flags.DEFINE_float("second_pass", 1.0, "weight of the own-feature pass (0: off)")
    flags.DEFINE_float("noise", 0.1, "input-feature noise (× RMS)")
    flags.DEFINE_float(
        "weight_decay",
        0.0,
        "AdamW's decoupled weight decay (every trained parameter)",
        lower_bound=0.0,
    )
    flags.DEFINE_integer(
        "kept", None, "head rows (most frequent verifier ids; default: the verifier's, 4096 / 8192)"
    )
    flags.DEFINE_list(
        "feature_layers",
        None,
        "the verifier states the drafter reads (EAGLE-3): blocks' residual streams by index, "
        "the layer count for the final-normed state; empty: the final-normed state alone; "
        "unset: the verifier's default (SmolLM2: empty; Gemma-3-270M: 2,9,18)",
    )
    flags.register_validator(
        "feature_layers",
        lambda v: v is None or all(x.strip().isdigit() for x in v),
        "--feature_layers: a comma-separated list of layer indices (non-negative ints)",
    )
    flags.DEFINE_list(
        "features_of",
        [],
        "the verifier states the feature files hold (default: --feature_layers); a superset "
        "lets drafters reading different subsets share one features stage",
    )
    flags.DEFINE_float("reg_weight", 1.0, "weight of the regression on the final feature")
    flags.DEFINE_float(
        "tv_weight", 0.0, "weight of the acceptance loss 1 - Σ min(p, q) (DistillSpec's TV)"
    )
    flags.DEFINE_float(
        "loop_weight",
        0.0,
        "weight of 1 - the loop's expected acceptance (TV where a rule-1 loop drafts)",
    )
    flags.DEFINE_integer("loop_gamma", 3, "the loop's γ for --loop_weight", lower_bound=1)
    flags.DEFINE_integer("layers", 1, "decoder layers of the drafter (EAGLE: 1)", lower_bound=1)
    flags.DEFINE_integer(
        "eval_train_rows",
        24,
        "--stage=eval also measures α on this many rows of the training data per domain "
        "(evenly spaced; 0: off), written to fit_eagle{tag}.json: its gap to held-out α "
        "tells over- from under-fitting",
        lower_bound=0,
    )
    flags.DEFINE_integer(
        "eval_loop_gamma",
        3,
        "--stage=eval also predicts the loop's per-step α and tokens per round at this γ "
        "from the held-out positions (`specjax.measure.loop_law`; 0: off)",
        lower_bound=0,
    )
    flags.DEFINE_string(
        "eval_against",
        "",
        "--stage=eval also predicts the loop for this feature drafter (a file, or 'eagle') on "
        "the same held-out texts and prints the difference with its paired standard error",
    )
    flags.DEFINE_integer(
        "eval_loop_tokens",
        64,
        "the loop prediction covers each held-out reply's first this many tokens",
        lower_bound=1,
    )
    flags.DEFINE_float("ce_weight", 0.1, "weight of the cross-entropy on the verifier's law")
    flags.DEFINE_float("time_budget_s", 3600, "training seconds at most")
    flags.DEFINE_integer(
        "curve_every",
        0,
        "--stage=train measures held-out α every this many steps and at the end (0: off), "
        "recorded in the drafter's history as its data curve",
        lower_bound=0,
    )
    flags.DEFINE_string("tag", "", "suffix of the drafter files")
    flags.DEFINE_string(
        "init_from",
        "",
        "start from this feature drafter (a file, or 'eagle' for the shipped one) instead of "
        "a fresh one: its head's ids are kept; its record is kept under 'init_from'",
    )


def _atomic_json(path: Path, obj) -> None:
    from specjax.runner.results import atomic_write_text  # pylint: disable=import-outside-toplevel

    atomic_write_text(path, json.dumps(obj, indent=1, default=float))


def _spec():
    """The ``--verifier``'s record (`specjax.train.verifiers.VERIFIERS`)."""
    from specjax.train import verifiers  # pylint: disable=import-outside-toplevel

    return verifiers.get(FLAGS.verifier)


def _verifier():
    return _spec().load(max_len=MAX_LEN, dtype=FLAGS.dtype, out_first=True)


def _kept() -> int:
    return _spec().kept if FLAGS.kept is None else FLAGS.kept


def _drafter_file(value: str):
    """A drafter file named by --init_from / --eval_against: 'eagle' is the verifier's
    shipped one."""
    from specjax.models.real_zoo import drafter_path  # pylint: disable=import-outside-toplevel

    return drafter_path(value, _spec().zoo_dir)


def _sources() -> dict[str, Path]:
    """Feature file name -> the generations it is computed from: each domain's training
    and held-out replies in --data, and its training replies in each --more_data folder."""
    out = {
        f"{kind}_{d}": Path(FLAGS.data) / f"{kind}_{d}.npz"
        for d in FLAGS.domains
        for kind in ("gen", "heldout")
    }
    for i, folder in enumerate(FLAGS.more_data):
        out.update({f"gen_{d}_x{i}": Path(folder) / f"gen_{d}.npz" for d in FLAGS.domains})
    return out


def _names():
    return list(_sources())


def _layers() -> tuple:
    if FLAGS.feature_layers is None:
        return _spec().feature_layers
    return tuple(int(x) for x in FLAGS.feature_layers)


def _feat_path(out: Path, name: str) -> Path:
    """``feat_{name}.npz``; with --feature_layers ``feat_L2-15-27_{name}.npz`` (the verifier
    states as well as its final feature)."""
    held = tuple(int(x) for x in FLAGS.features_of) or _layers()
    tag = "L" + "-".join(map(str, held)) + "_" if held else ""
    return out / f"feat_{tag}{name}.npz"


def stage_features(out: Path, model) -> None:
    from specjax.train import distill, distill_eagle  # pylint: disable=import-outside-toplevel

    for name, src in _sources().items():
        path = _feat_path(out, name)
        if path.exists():
            continue
        if not src.exists():
            raise SystemExit(f"{src}: missing (run train_drafters --stage=generate)")
        t0 = time.perf_counter()
        f = distill_eagle.verifier_features(
            model,
            distill.Generated.load(src),
            layers=tuple(int(x) for x in FLAGS.features_of) or _layers(),
        )
        f.save(path)
        print(f"features {name}: {f.tokens.shape} in {time.perf_counter() - t0:.0f} s", flush=True)


def _recipe():
    from specjax.train.distill_eagle import EagleRecipe  # pylint: disable=import-outside-toplevel

    return EagleRecipe(
        steps=FLAGS.steps,
        batch=FLAGS.batch,
        learning_rate=FLAGS.learning_rate,
        second_pass=FLAGS.second_pass,
        noise=FLAGS.noise,
        weight_decay=FLAGS.weight_decay,
        kept=_kept(),
        feature_layers=_layers(),
        reg_weight=FLAGS.reg_weight,
        ce_weight=FLAGS.ce_weight,
        layers=FLAGS.layers,
        tv_weight=FLAGS.tv_weight,
        loop_weight=FLAGS.loop_weight,
        loop_gamma=FLAGS.loop_gamma,
    )


def stage_train(out: Path, model) -> None:
    import dataclasses  # pylint: disable=import-outside-toplevel

    from specjax.models import real_zoo  # pylint: disable=import-outside-toplevel
    from specjax.train import distill_eagle as de  # pylint: disable=import-outside-toplevel

    path = out / f"eagle{FLAGS.tag}.npz"
    if path.exists():
        return
    paths = [_feat_path(out, n) for n in _names() if n.startswith("gen_")]
    missing = [p.name for p in paths if not p.exists()]
    if missing:
        raise SystemExit(f"--out={out}: {', '.join(missing)} missing (run --stage=features first)")
    data = de.Features.concat([de.Features.load(p) for p in paths])
    recipe = _recipe()
    prior = None
    if FLAGS.init_from:
        lm, params, prior = real_zoo.load_eagle(_drafter_file(FLAGS.init_from), model)
        prior = {
            "file": str(_drafter_file(FLAGS.init_from)),
            **{k: prior[k] for k in ("recipe", "data", "heldout_alpha") if k in prior},
            **{k: prior["history"][k] for k in ("n_rows", "n_targets") if "history" in prior},
        }
    else:
        lm, params = de.initial_eagle(model, data, recipe, always=_spec().always_kept(model))
    held = {}
    if FLAGS.curve_every:
        held = {d: de.Features.load(_feat_path(out, f"heldout_{d}")) for d in FLAGS.domains}
    params, hist = de.train_eagle(
        lm,
        params,
        data,
        recipe,
        time_budget_s=FLAGS.time_budget_s,
        log=lambda s: print(s, flush=True),
        checkpoint_every=FLAGS.curve_every,
        on_checkpoint=lambda p: _curve_point(de, lm, p, held),
    )
    info = {
        "recipe": dataclasses.asdict(recipe),
        "history": hist,
        "domains": FLAGS.domains,
        "verifier": _spec().title,
    }
    if prior is not None:
        info["init_from"] = prior
    real_zoo.save_eagle(path, lm, params, {**info, "data": _data_info()})


def _curve_point(de, lm, params, held: dict) -> dict:
    """Held-out α at draft steps 1 and 2 (and top-1 at step 1) per domain: a point of the
    data curve (`--curve_every`)."""
    out = {}
    for d, f in held.items():
        r = de.feature_alpha(lm, params, f, batch=_spec().eval_batch)
        out[d] = {k: round(float(r[k]), 4) for k in ("alpha1", "alpha2", "top1_1")}
    return {"heldout": out}


def _data_info() -> dict:
    """The generation folders the drafter was trained on (--data, --more_data); the rows
    and targets they held are in its history (`n_rows`, `n_targets`)."""
    return {"folders": [FLAGS.data, *FLAGS.more_data]}


def stage_eval(out: Path, model) -> None:
    from specjax.models import real_zoo  # pylint: disable=import-outside-toplevel
    from specjax.train import distill_eagle as de  # pylint: disable=import-outside-toplevel

    src = out / f"eagle{FLAGS.tag}.npz"
    if not src.exists():
        raise SystemExit(f"--out={out}: {src.name} missing (run --stage=train first)")
    lm, params, _ = real_zoo.load_eagle(src, model, dtype="float32")
    against = None
    if FLAGS.eval_against and FLAGS.eval_loop_gamma:
        against = real_zoo.load_eagle(_drafter_file(FLAGS.eval_against), model)[:2]
    batch = _spec().eval_batch
    res, fit = {}, {}
    for d in FLAGS.domains:
        held = de.Features.load(_feat_path(out, f"heldout_{d}"))
        res[d] = de.feature_alpha(lm, params, held, batch=batch)
        print(f"eval {d}: {res[d]}", flush=True)
        if FLAGS.eval_loop_gamma:
            raw = _loop_law(de, lm, params, held)
            res[d]["loop"] = _loop_summary(raw)
            print(f"eval {d}, loop prediction: {res[d]['loop']}", flush=True)
            if against is not None:
                res[d]["loop_minus_against"] = _paired(raw, _loop_law(de, *against, held))
                print(f"eval {d}, minus --eval_against: {res[d]['loop_minus_against']}", flush=True)
        train = _feat_path(out, f"gen_{d}")
        if FLAGS.eval_train_rows and train.exists():
            f = de.Features.load(train)
            n = min(FLAGS.eval_train_rows, len(f.tokens))
            rows = np.linspace(0, len(f.tokens) - 1, n).round().astype(int)
            fit[d] = {
                "train": de.feature_alpha(lm, params, f.take(rows), batch=batch),
                "heldout": res[d],
            }
            print(f"eval {d}, {n} training rows: {fit[d]['train']}", flush=True)
    _atomic_json(out / f"eval_eagle{FLAGS.tag}.json", res)
    if fit:
        _atomic_json(out / f"fit_eagle{FLAGS.tag}.json", fit)


def _loop_law(de, lm, params, held) -> dict:
    """`specjax.measure.loop_law.loop_alpha` at --eval_loop_gamma on the first --eval_loop_tokens
    reply tokens of each held-out row."""
    from specjax.measure import loop_law  # pylint: disable=import-outside-toplevel

    g = FLAGS.eval_loop_gamma
    pos = de.feature_alpha_positions(lm, params, held, steps=min(g, 3), batch=_spec().eval_batch)
    mask = pos["mask"] & (np.cumsum(pos["mask"], axis=1) <= FLAGS.eval_loop_tokens)
    return loop_law.loop_alpha(pos["alpha"], pos["accept"], mask, g)


def _loop_summary(r: dict) -> dict:
    return {
        "gamma": FLAGS.eval_loop_gamma,
        "step_alpha": [float(x) for x in r["step_alpha"]],
        "step_alpha_se": [float(x) for x in r["step_alpha_se"]],
        "forced_alpha": [float(x) for x in r["forced_alpha"]],
        "tokens_per_round": r["tokens_per_round"],
        "tokens_per_round_se": r["tokens_per_round_se"],
        "round_start_share": r["round_start_share"],
        "positions": r["positions"],
    }


def _paired(a: dict, b: dict) -> dict:
    """This drafter minus --eval_against on the same held-out texts (`paired_difference`)."""
    from specjax.measure import loop_law  # pylint: disable=import-outside-toplevel

    return {"against": FLAGS.eval_against, **loop_law.paired_difference(a, b)}


def stage_ship(out: Path, model) -> None:
    from specjax.models import real_zoo  # pylint: disable=import-outside-toplevel

    src = out / f"eagle{FLAGS.tag}.npz"
    lm, params, info = real_zoo.load_eagle(src, model, dtype="float32")
    info = {k: v for k, v in info.items() if k not in ("config", "verifier_vocab", "kind")}
    info.setdefault("data", _data_info())  # a drafter trained before the record existed
    ev = out / f"eval_eagle{FLAGS.tag}.json"
    if ev.exists():
        info["heldout_alpha"] = json.loads(ev.read_text())
    spec = _spec()
    info.setdefault("verifier", spec.title)
    info.setdefault("made_by", f"{spec.ship_command}: {provenance.command_line()}")
    dst = real_zoo.save_eagle(spec.zoo_dir / "eagle.npz", lm, params, info, dtype="bfloat16")
    print(f"shipped {dst}")


def _stages() -> list[str]:
    return [s for s in STAGES if s in FLAGS.stage or "all" in FLAGS.stage]


def validate() -> None:
    """Every flag and every file the stages read that no earlier stage of this run writes,
    before anything is printed, loaded or written (`sf.run`): a `ConfigError` naming the
    flag, its value and what is allowed. The verifier's layer count comes from its GGUF
    file's metadata (no weights read)."""
    from specjax.errors import ConfigError  # pylint: disable=import-outside-toplevel
    from specjax.models import gguf  # pylint: disable=import-outside-toplevel
    from specjax.models.api import TransformerLM  # pylint: disable=import-outside-toplevel

    sf.names("--domains", FLAGS.domains, DOMAINS)
    sf.dtype("--dtype", FLAGS.dtype)
    sf.integer("--steps", FLAGS.steps, 1)
    sf.integer("--batch", FLAGS.batch, 1, 4096)
    sf.number("--learning_rate", FLAGS.learning_rate, 0.0, 10.0, lo_open=True)
    for name in ("second_pass", "noise", "weight_decay", "reg_weight", "tv_weight"):
        sf.number(f"--{name}", FLAGS[name].value, 0.0, 1e6)
    sf.number("--loop_weight", FLAGS.loop_weight, 0.0, 1e6)
    sf.number("--ce_weight", FLAGS.ce_weight, 0.0, 1e6)
    sf.number("--time_budget_s", FLAGS.time_budget_s, 0.0, lo_open=True)
    sf.integer("--eval_loop_gamma", FLAGS.eval_loop_gamma, 0, 64)
    sf.check("/" not in FLAGS.tag, "--tag", FLAGS.tag, "a file-name suffix (no '/')")
    cfg = gguf.read_gguf(_spec().path(), max_len=MAX_LEN).config
    sf.integer("--kept", _kept(), 1, cfg.vocab_size)
    lm = TransformerLM(cfg)
    for flag in ("feature_layers", "features_of"):
        values = FLAGS[flag].value
        if values is None:
            values = [str(i) for i in _layers()]
        sf.integers(f"--{flag}", values, 0, cfg.n_layers, empty=True)
        try:
            lm.check_layers(tuple(int(x) for x in values) or None)
        except ValueError:
            raise ConfigError.invalid(
                f"--{flag}",
                ",".join(values),
                f"layer indices in [0, {cfg.n_layers}] ({cfg.n_layers}: the final-normed "
                f"state) of the verifier",
            ) from None
    held = tuple(int(x) for x in FLAGS.features_of)
    if held and not set(_layers()) <= set(held):  # flags against flags before any folder
        raise ConfigError.invalid(
            "--feature_layers",
            ",".join(map(str, _layers())),
            f"a subset of --features_of={','.join(FLAGS.features_of)}",
        )
    if "features" in _stages():
        sf.in_dir("--data", FLAGS.data, "a folder of gen_*.npz / heldout_*.npz")
    for folder in FLAGS.more_data:
        sf.in_dir("--more_data", folder, "folders of gen_*.npz")
    _check_inputs(Path(FLAGS.out), _stages())


def _check_inputs(out: Path, stages: list[str]) -> None:
    """What the stages read and no earlier stage of this run writes, checked before the
    verifier loads: a `ConfigError` naming the flag and the missing or unreadable file."""
    from specjax.errors import ConfigError  # pylint: disable=import-outside-toplevel
    from specjax.train import verifiers  # pylint: disable=import-outside-toplevel

    spec = _spec()
    for flag, folder in [("--out", out), ("--data", FLAGS.data)] + [
        ("--more_data", f) for f in FLAGS.more_data
    ]:
        if Path(folder).is_dir():
            verifiers.check_marker(flag, folder, spec)
    for stage, flag in (("train", "init_from"), ("eval", "eval_against")):
        value = FLAGS[flag].value
        if stage in stages and value:
            f = _drafter_file(value)
            if not (f.is_file() and f.with_suffix(".json").is_file()):
                raise ConfigError.invalid(
                    f"--{flag}",
                    value,
                    "a feature drafter file with its .json (train_eagle.py writes them), or 'eagle'",
                )
            sf.drafter_file(f"--{flag}", str(f), feature=True, shown=value)
    feats = [_feat_path(out, n) for n in _names()]
    if "features" in stages:
        for src, f in zip(_sources().values(), feats):
            flag = "--data" if src.parent == Path(FLAGS.data) else "--more_data"
            if not f.exists() and not src.exists():
                raise ConfigError.invalid(
                    flag,
                    str(src.parent),
                    f"a folder holding {src.name} (train_drafters.py --stage=generate writes it)",
                )
            if not f.exists():
                sf.npz_file(
                    flag,
                    src,
                    "a folder of generations train_drafters.py --stage=generate wrote",
                    keys=_GEN_KEYS,
                    shown=str(src.parent),
                )
    elif any(s in stages for s in ("train", "eval")) and not all(f.exists() for f in feats):
        raise ConfigError.invalid(
            "--stage",
            ",".join(stages),
            f"train/eval only where {out}/feat_*.npz exist (add features)",
        )
    for f in feats:
        if f.exists() and {"train", "eval"} & set(stages):
            sf.npz_file("--out", f, "a folder of features this script wrote", shown=str(out))
    drafter = out / f"eagle{FLAGS.tag}.npz"
    if "train" not in stages and ({"eval", "ship"} & set(stages)) and not drafter.exists():
        raise ConfigError.invalid(
            "--stage", ",".join(stages), f"eval/ship only where {drafter} exists (add train)"
        )
    if drafter.exists() and {"eval", "ship"} & set(stages):
        sf.drafter_file("--out", drafter, feature=True, shown=str(out))


def main(argv):
    del argv
    out = Path(FLAGS.out)
    stages = _stages()
    out.mkdir(parents=True, exist_ok=True)
    from specjax.train import verifiers  # pylint: disable=import-outside-toplevel

    verifiers.mark(out, _spec())
    model = _verifier()
    for s in stages:
        {"features": stage_features, "train": stage_train, "eval": stage_eval, "ship": stage_ship}[
            s
        ](out, model)


if __name__ == "__main__":
    define_flags()
    sf.run(main, validate, "train_eagle")
