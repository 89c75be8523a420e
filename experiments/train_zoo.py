"""Trains the shipped model zoo: one verifier, the seed's three drafters and a fourth.

    python experiments/train_zoo.py --out zoo [--budget_scale 1.0] [--workers 2] [--reuse zoo]

The seed's deployment in miniature (SPEC §8): a 70B verifier and 1.5B code / 3B prose /
7B reasoning drafters, where the code and prose drafters are small models of the
verifier's own family (same tokenizer) and the reasoning drafter is of another family,
with thinking tokens the verifier lacks, sampled hotter. Each drafter is trained on the
mixed traffic (all three domains) with emphasis on its own domain, as general-purpose
models tuned towards a speciality are:

| model     | tokenizer                             | trained on (token shares)       | params  | c_i   |
| --------- | ------------------------------------- | ------------------------------- | ------- | ----- |
| verifier  | `verifier`: BPE 1024, all three domains | code / prose / reasoning 1:1:1 | ~3.4 M  | 1     |
| code      | `verifier` (the verifier's group)     | code 0.78, prose 0.2, reasoning 0.02 | ~0.16 M | ~0.05 |
| prose     | `verifier` (the verifier's group)     | prose 0.78, code 0.2, reasoning 0.02 | ~0.5 M  | ~0.15 |
| reasoning | `reasoning`: BPE 768 with `<think>`/`</think>` | reasoning 0.6, code 0.2, prose 0.2 | ~0.84 M | ~0.24 |
| prose512  | `prose512`: BPE 512 on prose (a third tokenizer) | prose only            | ~0.43 M | ~0.13 |

`drafter_order` (the seed's deployment, every config's default) is code, prose, reasoning;
``prose512`` (a third tokenizer, for the pairing sweep) is under ``extra_drafters``.
Size ratios 4.6 / 15 / 24 % (the seed's 2.1 / 4.3 / 10 %, doubled to train on a CPU); f32.

Deterministic (tokenizer ties broken by ids, step ``s``'s batch drawn from ``(seed, s)``,
fixed init seeds, step counts not time budgets); ``--workers N`` trains the verifier beside
the drafters without changing a number. Checkpoints every 100 steps under ``--workdir``: a
killed build resumes to the same result. ``--reuse DIR`` copies every model whose recipe
(config, training settings, seed, tokenizer hash, token shares) is unchanged.

The zoo is then loaded back through `load_zoo` (verified as a user loads it); the manifest
records held-out loss per domain against an add-one unigram, each drafter's α = Σ min(p, q)
per domain (verifier τ = 1, drafter at its τ, verifier space, shipped held-out text) and
decode speed.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import shutil
import time
from concurrent.futures import ProcessPoolExecutor
from fractions import Fraction
from multiprocessing import get_context
from pathlib import Path

import numpy as np

from specjax.atomic import publish_dir, recover_dir
from specjax.models.zoo_recipe import (
    ACCEPTANCE_WINDOW,
    DOMAINS,
    DRAFTERS,
    EXTRA_DRAFTERS,
    MAX_LEN,
    MODELS,
    SEED,
    TRAIN_BYTES,
    build_tokenizers,
    scaled_steps,
)

ROOT = Path(__file__).resolve().parents[1]

CHECKPOINT_EVERY = 100  # training steps between resumable checkpoints

log = logging.getLogger('train_zoo')


# ----------------------------------------------------------------------------------------
# Worker: train one model (runs in a fresh process when --workers > 1)
# ----------------------------------------------------------------------------------------


def train_model(
    name: str,
    config: dict,
    train_kwargs: dict,
    seed: int,
    tokens: np.ndarray,
    out_file: str,
    workdir: str,
) -> dict:
    """Trains one model on a token stream and writes its params file.

    Checkpoints go to ``workdir`` every ``CHECKPOINT_EVERY`` steps, so a killed run resumes
    where it stopped (bit-identically, see `specjax.train.loop`); a workdir left by a different
    config, seed or token stream is wiped first. ``wall_s`` adds up the sessions.
    """
    import jax

    from specjax.models.api import TransformerLM, count_params
    from specjax.models.transformer import TransformerConfig
    from specjax.runner.results import atomic_write_text
    from specjax.train import checkpoints
    from specjax.train.loop import TrainConfig, train

    logging.basicConfig(
        level=logging.INFO,
        format=f'%(asctime)s [{name}] %(message)s',
        datefmt='%H:%M:%S',
        force=True,
    )
    _quiet_jax()
    logging.getLogger('specjax.train.loop').setLevel(logging.INFO)
    lm = TransformerLM(TransformerConfig(**config))
    tc = TrainConfig(
        seed=seed,
        log_every=50,
        checkpoint_every=CHECKPOINT_EVERY,
        keep_checkpoints=1,
        **train_kwargs,
    )
    wd = Path(workdir)
    key = hashlib.sha256(
        json.dumps([config, train_kwargs, seed], sort_keys=True).encode()
        + np.ascontiguousarray(tokens).tobytes()
    ).hexdigest()
    stamp = wd / 'run.json'
    state = json.loads(stamp.read_text()) if stamp.is_file() else {}
    if state.get('key') != key:
        shutil.rmtree(wd, ignore_errors=True)
        state = {'key': key, 'wall_s': 0.0}
    wd.mkdir(parents=True, exist_ok=True)
    prev, t0 = float(state['wall_s']), time.monotonic()

    def record_wall(step=None, metrics=None):
        if step is None or step % 10 == 0:
            state['wall_s'] = prev + time.monotonic() - t0
            atomic_write_text(stamp, json.dumps(state))  # a kill leaves the old stamp

    params = lm.init_params(jax.random.key(seed))  # ignored when resuming
    params, history = train(
        lm, tc, tokens, None, workdir=str(wd), params=params, callback=record_wall
    )
    record_wall()
    wall = state['wall_s']
    if history.get('resumed_from') is not None:
        logging.info('resumed from step %d', history['resumed_from'])
    params_sha = checkpoints.save_params_file(out_file, params)
    losses = history['loss']
    tail = losses[-20:]
    steps = int(history['final_step'])
    return dict(
        name=name,
        wall_s=round(wall, 1),
        params_sha256=params_sha,
        n_params=count_params(params),
        final_train_loss=float(np.mean(tail)),
        first_train_loss=float(losses[0]),
        steps=steps,
        resumed=history.get('resumed_from') is not None,
        tokens_per_s=round(steps * tc.batch_size * tc.seq_len / max(wall, 1e-9), 1),
    )


# ----------------------------------------------------------------------------------------
# Main
# ----------------------------------------------------------------------------------------


def _full_config(kwargs: dict) -> dict:
    from specjax.models.transformer import TransformerConfig

    return TransformerConfig(**kwargs).to_dict()


@dataclasses.dataclass(frozen=True)
class BuildConfig:
    """The command line's settings (see `define_flags`)."""

    out: Path
    budget_scale: float = 1.0
    workers: int = 2
    reuse: Path | None = None
    cache: Path | None = None
    workdir: Path = ROOT / 'runs' / 'train_zoo'


def define_flags() -> None:
    """The script's flags (defined only when it runs as a script)."""
    from absl import flags  # pylint: disable=import-outside-toplevel

    flags.DEFINE_string(
        'out', str(ROOT / 'specjax' / 'zoo'), 'output directory (replaced at the end)'
    )
    flags.DEFINE_float(
        'budget_scale', 1.0, "multiplies every model's step count (1.0: the shipped zoo)"
    )
    flags.DEFINE_integer(
        'workers', 2, 'training processes (2: verifier alongside the drafters; 1: in-process)'
    )
    flags.DEFINE_string(
        'reuse', None, 'an existing zoo: models whose recipe matches are copied, not retrained'
    )
    flags.DEFINE_string('cache', None, 'data cache (default: specjax.data default)')
    flags.DEFINE_string(
        'workdir',
        str(ROOT / 'runs' / 'train_zoo'),
        'training checkpoints (a killed run resumes from them) and the zoo '
        'being built; the checkpoints are deleted after a successful build',
    )


def validate() -> None:
    """Every flag, before anything is printed, loaded or written (`script_flags.run`): a
    `ConfigError` naming the flag, its value and what is allowed."""
    from absl import flags  # pylint: disable=import-outside-toplevel

    from specjax.runner import script_flags as sf  # pylint: disable=import-outside-toplevel

    f = flags.FLAGS
    out = sf.out_dir('--out', f.out).resolve()  # `script_flags.common` checked it too
    sf.number('--budget_scale', f.budget_scale, 0.0, 1000.0, lo_open=True)
    sf.integer('--workers', f.workers, 1, 64)
    if f.reuse:
        sf.zoo('--reuse', f.reuse)
    if f.cache:
        sf.out_dir('--cache', f.cache)
    work = sf.out_dir('--workdir', f.workdir).resolve()
    inside = lambda a, b: b in (a, *a.parents)  # noqa: E731  (a is b or under it)
    sf.check(
        not (inside(work, out) or inside(out, work / 'zoo') or inside(out, work / 'ckpt')),
        '--out / --workdir',
        f'{f.out} / {f.workdir}',
        'an --out that neither holds --workdir nor lies in its zoo/ or ckpt/ (the zoo is '
        'built in --workdir/zoo, then moved to --out, which is replaced)',
    )


def build_config() -> BuildConfig:
    """The flags as a `BuildConfig` (checked by `validate`)."""
    from absl import flags  # pylint: disable=import-outside-toplevel

    f = flags.FLAGS
    return BuildConfig(
        out=Path(f.out).expanduser(),
        budget_scale=f.budget_scale,
        workers=f.workers,
        reuse=Path(f.reuse).expanduser() if f.reuse else None,
        cache=Path(f.cache).expanduser() if f.cache else None,
        workdir=Path(f.workdir).expanduser(),
    )


@dataclasses.dataclass
class Build:
    """What the build has so far: the corpora, tokenizers and token streams, the training
    jobs (and the models reused instead), their results and the manifest's records."""

    cfg: BuildConfig
    work: Path  # the zoo being built
    corpora: dict = dataclasses.field(default_factory=dict)
    toks: dict = dataclasses.field(default_factory=dict)
    tok_records: dict = dataclasses.field(default_factory=dict)
    streams: dict = dataclasses.field(default_factory=dict)
    jobs: list = dataclasses.field(default_factory=list)
    reused: dict = dataclasses.field(default_factory=dict)
    recipes: dict = dataclasses.field(default_factory=dict)
    results: dict = dataclasses.field(default_factory=dict)
    train_wall: float = 0.0
    models: dict = dataclasses.field(default_factory=dict)


def main(argv) -> int:
    del argv
    from specjax.models.zoo import load_zoo  # pylint: disable=import-outside-toplevel

    cfg = build_config()
    logging.basicConfig(
        level=logging.INFO, format='%(asctime)s %(message)s', datefmt='%H:%M:%S', force=True
    )
    _quiet_jax()
    t_start = time.monotonic()
    if recover_dir(cfg.out):  # a build killed while publishing: its old zoo back first
        log.warning('%s: the zoo a killed build had moved aside is back', cfg.out)
    b = Build(cfg=cfg, work=cfg.workdir / 'zoo')  # moved to --out at the end
    shutil.rmtree(b.work, ignore_errors=True)
    (b.work / 'tokenizers').mkdir(parents=True)
    (b.work / 'models').mkdir()
    try:
        prepare_data(b)
        plan_jobs(b)
        run_jobs(b)
        manifest = write_first_manifest(b)
        measure(b, manifest)
        manifest['wall_s'] = dict(
            training=round(b.train_wall, 1), total=round(time.monotonic() - t_start, 1)
        )
        _write_manifest(b.work, manifest)
        load_zoo(b.work)  # the final manifest still verifies
        publish_dir(b.work, cfg.out)
    except BaseException:
        shutil.rmtree(b.work, ignore_errors=True)  # the checkpoints stay, for a resume
        raise
    shutil.rmtree(cfg.workdir / 'ckpt', ignore_errors=True)
    from specjax.measure import evaluation  # pylint: disable=import-outside-toplevel

    evaluation.print_zoo_report(manifest, cfg.out, DOMAINS)
    return 0


def prepare_data(b: Build) -> None:
    """The corpora, the tokenizers (saved into the zoo) and every model's token streams."""
    from specjax.data import load_domain  # pylint: disable=import-outside-toplevel
    from specjax.models import zoo as zoo_lib  # pylint: disable=import-outside-toplevel

    b.corpora = {
        d: load_domain(d, 'train', max_bytes=TRAIN_BYTES, cache=b.cfg.cache) for d in DOMAINS
    }
    t0 = time.monotonic()
    b.toks, tok_sources = build_tokenizers(b.corpora)
    log.info(
        'tokenizers trained in %.1fs: %s',
        time.monotonic() - t0,
        {n: t.vocab_size for n, t in b.toks.items()},
    )
    for name, tok in b.toks.items():
        path = b.work / 'tokenizers' / f'{name}.json'
        tok.save(path)
        b.tok_records[name] = dict(
            file=f'tokenizers/{name}.json',
            sha256=zoo_lib.file_sha256(path),
            vocab_size=tok.vocab_size,
            fingerprint=tok.fingerprint(),
            special_tokens=tok.special_tokens,
            **tok_sources[name],
        )
    t0 = time.monotonic()
    for mname, spec in MODELS.items():
        for dom in spec['domains']:
            key = (spec['tokenizer'], dom)
            if key not in b.streams:
                b.streams[key] = np.asarray(b.toks[key[0]].encode(b.corpora[dom]), np.int32)
    log.info('encoded %d streams in %.1fs', len(b.streams), time.monotonic() - t0)


def plan_jobs(b: Build) -> None:
    """Every model's recipe; a model whose recipe a --reuse zoo holds is copied, the others
    become training jobs."""
    reuse = _reusable(b.cfg.reuse) if b.cfg.reuse else {}
    for mname, spec in MODELS.items():
        config = _full_config(
            dict(spec['config'], max_len=MAX_LEN, vocab_size=b.toks[spec['tokenizer']].vocab_size)
        )
        tk = scaled_steps(spec['train'], b.cfg.budget_scale)
        b.recipes[mname] = _recipe(
            config, tk, spec['seed'], b.tok_records[spec['tokenizer']]['sha256'], spec['domains']
        )
        tokens = model_tokens(b.streams, spec)
        out_file = str(b.work / 'models' / f'{mname}.npz')
        if b.recipes[mname] in reuse.get(mname, {}):
            src, rec = reuse[mname][b.recipes[mname]]
            shutil.copyfile(src, out_file)
            b.reused[mname] = rec
            log.info('reused %s from %s (same recipe)', mname, src)
            continue
        b.jobs.append(
            (mname, config, tk, spec['seed'], tokens, out_file, str(b.cfg.workdir / 'ckpt' / mname))
        )


def run_jobs(b: Build) -> None:
    """Trains the jobs: in this process (--workers 1), else the verifier beside the drafters
    in spawned processes."""
    t0 = time.monotonic()
    if b.cfg.workers <= 1 or len(b.jobs) <= 1:
        for job in b.jobs:
            b.results[job[0]] = train_model(*job)
    else:
        groups = _split_jobs(b.jobs, b.cfg.workers)
        with ProcessPoolExecutor(max_workers=len(groups), mp_context=get_context('spawn')) as pool:
            futures = [pool.submit(_train_sequence, g) for g in groups]
            for f in futures:
                for r in f.result():
                    b.results[r['name']] = r
    b.train_wall = time.monotonic() - t0
    log.info('training done in %.1fs', b.train_wall)


def _trained_record(b: Build, mname: str, spec: dict) -> dict:
    from specjax.models import zoo as zoo_lib  # pylint: disable=import-outside-toplevel

    (_, config, tk, seed, tokens, path, _) = next(j for j in b.jobs if j[0] == mname)
    res = b.results[mname]
    rec = dict(
        role=spec['role'],
        file=f'models/{mname}.npz',
        sha256=zoo_lib.file_sha256(path),
        params_sha256=res['params_sha256'],
        config=config,
        n_params=res['n_params'],
        tokenizer=spec['tokenizer'],
        domains=_own_domains(spec),
        token_shares=dict(spec['domains']),
        recipe=b.recipes[mname],
        train=dict(
            tk,
            seed=seed,
            wall_s=res['wall_s'],
            tokens_per_s=res['tokens_per_s'],
            resumed=res['resumed'],
            train_tokens=int(len(tokens)),
            corpus={
                d: f'specjax.data.load_domain({d!r}, "train", max_bytes={TRAIN_BYTES})'
                for d in spec['domains']
            },
            first_train_loss=round(res['first_train_loss'], 4),
            final_train_loss=round(res['final_train_loss'], 4),
        ),
    )
    if spec['role'] == 'drafter':
        rec['temperature'] = spec['temperature']
    return rec


def write_first_manifest(b: Build) -> dict:
    """The manifest without measurements (trained and reused models' records), written."""
    from specjax.models import zoo as zoo_lib  # pylint: disable=import-outside-toplevel

    for mname, spec in MODELS.items():
        if mname in b.reused:
            rec = json.loads(json.dumps(b.reused[mname]))
            for k in ('heldout', 'acceptance', 'retok_width', 'decode_tokens_per_s'):
                rec.pop(k, None)
            rec['train']['reused'] = True
            b.models[mname] = dict(rec, recipe=b.recipes[mname])
        else:
            b.models[mname] = _trained_record(b, mname, spec)
    v_params = b.models['verifier']['n_params']
    for rec in b.models.values():
        if rec['role'] == 'drafter':
            rec['cost'] = rec['n_params'] / v_params
    manifest = dict(
        format=zoo_lib.ZOO_FORMAT,
        created_by='experiments/train_zoo.py',
        budget_scale=b.cfg.budget_scale,
        dtype='float32',
        seed=SEED,
        drafter_order=list(DRAFTERS),
        extra_drafters=list(EXTRA_DRAFTERS),
        tokenizers=b.tok_records,
        models=b.models,
    )
    _write_manifest(b.work, manifest)
    return manifest


def measure(b: Build, manifest: dict) -> None:
    """Loads the zoo being built through the zoo loader and records each model's held-out
    loss against a unigram, each drafter's acceptance per domain and decode speed."""
    from specjax.data import load_heldout  # pylint: disable=import-outside-toplevel
    from specjax.measure import evaluation  # pylint: disable=import-outside-toplevel
    from specjax.models import zoo as zoo_lib  # pylint: disable=import-outside-toplevel

    zoo = zoo_lib.load_zoo(b.work, names=DRAFTERS + EXTRA_DRAFTERS)
    heldout = {d: load_heldout(d) for d in DOMAINS}
    counts = {
        key: np.bincount(s, minlength=b.toks[key[0]].vocab_size) for key, s in b.streams.items()
    }
    t0 = time.monotonic()
    evaluation.record_heldout(zoo, b.models, heldout, b.corpora, counts)
    log.info('held-out evaluation in %.1fs', time.monotonic() - t0)
    t0 = time.monotonic()
    evaluation.record_acceptance(zoo, b.models, heldout, ACCEPTANCE_WINDOW)
    log.info('acceptance in %.1fs', time.monotonic() - t0)
    for m in (zoo.verifier,) + zoo.drafters:
        b.models[m.name]['decode_tokens_per_s'] = round(
            evaluation.decode_tokens_per_s(m.lm, m.params, n_tokens=256), 1
        )
    manifest['measurement'] = evaluation.zoo_measurement(TRAIN_BYTES, ACCEPTANCE_WINDOW)


def _quiet_jax() -> None:
    # 'Unable to initialize backend tpu' and similar are noise here.
    for name in ('jax', 'jax._src.xla_bridge', 'absl'):
        logging.getLogger(name).setLevel(logging.WARNING)


def _train_sequence(jobs) -> list[dict]:
    return [train_model(*job) for job in jobs]


def _shares(domains: dict) -> dict:
    from fractions import Fraction

    return {d: Fraction(v).limit_denominator(1000) for d, v in domains.items()}


def model_tokens(streams: dict, spec: dict) -> np.ndarray:
    """A model's training stream: each domain's tokens in the recipe's shares.

    The largest stream with exactly those shares that every domain's tokens allow; the
    domains are concatenated in order (`specjax.train.loop` samples windows uniformly, so a
    domain's share of the tokens is its share of the batches).
    """
    shares = _shares(spec['domains'])
    parts = {d: streams[(spec['tokenizer'], d)] for d in shares}
    if len(parts) == 1:
        return next(iter(parts.values()))
    total = min(Fraction(len(parts[d])) / shares[d] for d in shares)
    return np.concatenate([parts[d][: int(total * shares[d])] for d in shares])


def _own_domains(spec: dict) -> list[str]:
    """The verifier: every domain; a drafter: the domain it is emphasised on."""
    if spec['role'] == 'verifier':
        return list(spec['domains'])
    return [max(spec['domains'], key=spec['domains'].get)]


def _recipe(config: dict, train: dict, seed: int, tokenizer_sha: str, domains: dict) -> str:
    """A hash of everything that determines a model's trained parameters."""
    shares = {d: str(v) for d, v in _shares(domains).items()}
    blob = json.dumps(
        [config, {k: train[k] for k in sorted(train)}, seed, tokenizer_sha, shares, TRAIN_BYTES],
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()


def _reusable(root: Path) -> dict:
    """{model: {recipe: (params file, manifest record)}} of an existing zoo.

    Zoos written before recipes were recorded: the recipe is recomputed from the record
    (its config, training settings, seed, tokenizer hash and corpus domains in equal shares).
    """
    path = root / 'manifest.json'
    if not path.is_file():
        raise SystemExit(f'train_zoo: error: --reuse {root}: no manifest.json there')
    manifest = json.loads(path.read_text(encoding='utf-8'))
    out = {}
    for name, rec in manifest.get('models', {}).items():
        f = root / rec['file']
        if not f.is_file():
            continue
        recipe = rec.get('recipe')
        if recipe is None:
            train = {
                k: rec['train'][k]
                for k in ('steps', 'batch_size', 'seq_len', 'learning_rate', 'warmup_steps')
            }
            doms = list(rec['train'].get('corpus', rec.get('domains', [])))
            tok = manifest['tokenizers'][rec['tokenizer']]['sha256']
            recipe = _recipe(
                rec['config'],
                train,
                rec['train']['seed'],
                tok,
                {d: Fraction(1, len(doms)) for d in doms},
            )
        out.setdefault(name, {})[recipe] = (str(f), rec)
    return out


def _split_jobs(jobs: list, workers: int) -> list[list]:
    """The verifier alone in one group, the drafters spread over the others by size."""

    def work(job):
        c, t = job[1], job[2]
        return (
            t['steps']
            * t['batch_size']
            * c['n_layers']
            * c['d_model']
            * (c['d_model'] + c['vocab_size'] / c['n_layers'])
        )

    first = [j for j in jobs if j[0] == 'verifier']
    rest = sorted((j for j in jobs if j[0] != 'verifier'), key=work, reverse=True)
    n = max(1, workers - len(first))
    groups = [[] for _ in range(n)]
    for j in rest:
        min(groups, key=lambda g: sum(map(work, g))).append(j)
    return [g for g in ([first] if first else []) + groups if g]


def _write_manifest(root: Path, manifest: dict) -> None:
    from specjax.runner.results import atomic_write_text  # pylint: disable=import-outside-toplevel

    atomic_write_text(
        root / 'manifest.json', json.dumps(manifest, indent=1, sort_keys=False) + '\n'
    )


if __name__ == '__main__':
    from specjax.runner import script_flags

    define_flags()
    script_flags.run(main, validate, 'train_zoo')
