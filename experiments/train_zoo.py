"""Trains the shipped model zoo: one verifier and three specialised drafters.

    python experiments/train_zoo.py --out zoo [--budget_scale 1.0] [--workers 2]

The seed's deployment in miniature (SPEC §8): a 70B verifier and 1.5B code / 3B prose /
7B reasoning drafters become

| model     | tokenizer                      | trained on       | params  | c_i     |
| --------- | ------------------------------ | ---------------- | ------- | ------- |
| verifier  | `verifier`: BPE 1024, all three domains | code+prose+reasoning | ~3.4 M | 1 |
| code      | `verifier` (same tokenizer group)       | code only        | ~0.16 M | ~0.05 |
| prose     | `prose`: BPE 512 on prose               | prose only       | ~0.43 M | ~0.13 |
| reasoning | `reasoning`: BPE 768 on reasoning (+ a little prose), with `<think>`/`</think>` as single tokens | reasoning only | ~0.84 M | ~0.24 |

i.e. drafter:verifier size ratios of about 4.6 / 12.7 / 24 % against the seed's 2.1 / 4.3
/ 10 %: the same order and roughly the same spread, each about doubled so that the
smallest drafter still learns its domain in minutes on a CPU. All f32.

Everything is deterministic: tokenizers (the HF trainer breaks ties by ids), batches
(`specjax.train` draws step ``s``'s batch from ``(seed, s)``), initialisation (fixed
seeds), step counts (not time budgets). With ``--workers 2`` the verifier trains in one
process while the drafters train in another (XLA:CPU barely uses a second core for these
sizes), which changes nothing numerically. Training checkpoints every 100 steps under
``--workdir`` (default ``runs/train_zoo``): rerunning a killed build resumes it, with the
same result as an uninterrupted one.

Afterwards the zoo is loaded back through `specjax.models.zoo.load_zoo` (so the written
files are verified as a user will load them) and the script records in the manifest, and
prints: held-out loss per domain against an add-one unigram baseline, each drafter's
acceptance α = Σ_x min(p, q) against the verifier per domain (verifier at τ = 1, drafter
at its default τ, in verifier space on the shipped held-out text), and decode speed.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import shutil
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

DOMAINS = ('code', 'prose', 'reasoning')
SEED = 0
#: Bytes of each domain's train split used for the models (a prefix cut at a newline).
TRAIN_BYTES = 3_000_000
#: Bytes of each domain's train split used to train the tokenizers.
TOKENIZER_BYTES = 1_500_000
#: Prose bytes added to the reasoning tokenizer's corpus (it writes English too).
REASONING_TOKENIZER_PROSE_BYTES = 150_000

#: Longest verifier token, in bytes (None = uncapped). The shipped zoo is uncapped: its
#: verifier learns code-indentation tokens of up to ~20 spaces, which the prose and
#: reasoning tokenizers spell one space at a time (M = 19 in `retokenization_table`). The
#: engine bounds the block that feeds such a drafter instead (engine/decode.py:
#: consume_width). A cap of 6 gives M <= 5 at a small cost in compression (bytes/token on
#: held-out prose 2.68 -> 2.63); it changes the tokenizer, so it needs a retrained zoo.
VERIFIER_MAX_TOKEN_BYTES = None

TOKENIZERS = {
    # name: (vocab size, {domain: bytes}, special tokens, longest token in bytes or None)
    'verifier': (1024, {d: TOKENIZER_BYTES for d in DOMAINS}, (), VERIFIER_MAX_TOKEN_BYTES),
    'prose': (512, {'prose': TOKENIZER_BYTES}, (), None),
    'reasoning': (768, {'reasoning': TOKENIZER_BYTES,
                        'prose': REASONING_TOKENIZER_PROSE_BYTES}, 'REASONING', None),
}

MODELS = {
    # name: role, tokenizer, domains, config (vocab_size filled in), training, default τ.
    'verifier': dict(
        role='verifier', tokenizer='verifier', domains=DOMAINS,
        config=dict(d_model=256, n_layers=4, n_heads=4, n_kv_heads=2, d_ff=688,
                    tie_embeddings=False),
        train=dict(steps=600, batch_size=8, seq_len=256, learning_rate=2e-3,
                   warmup_steps=50),
        temperature=1.0, seed=1),
    'code': dict(
        role='drafter', tokenizer='verifier', domains=('code',),
        config=dict(d_model=64, n_layers=2, n_heads=2, n_kv_heads=1, d_ff=176,
                    tie_embeddings=True),
        train=dict(steps=600, batch_size=16, seq_len=256, learning_rate=4e-3,
                   warmup_steps=40),
        temperature=1.0, seed=2),
    'prose': dict(
        role='drafter', tokenizer='prose', domains=('prose',),
        config=dict(d_model=128, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=352,
                    tie_embeddings=True),
        train=dict(steps=400, batch_size=16, seq_len=256, learning_rate=3e-3,
                   warmup_steps=40),
        temperature=1.0, seed=3),
    'reasoning': dict(
        role='drafter', tokenizer='reasoning', domains=('reasoning',),
        config=dict(d_model=128, n_layers=4, n_heads=4, n_kv_heads=2, d_ff=352,
                    tie_embeddings=True),
        train=dict(steps=300, batch_size=16, seq_len=256, learning_rate=3e-3,
                   warmup_steps=40),
        temperature=1.3, seed=4),
}
MAX_LEN = 512
DRAFTERS = ('code', 'prose', 'reasoning')
SEED_ACCEPTANCE = {'code': 0.68, 'prose': 0.61, 'reasoning': 0.54}
ACCEPTANCE_WINDOW = 128  # verifier tokens of context per held-out window
CHECKPOINT_EVERY = 100  # training steps between resumable checkpoints

log = logging.getLogger('train_zoo')


def _scaled_steps(train: dict, scale: float) -> dict:
    steps = max(10, int(round(train['steps'] * scale)))
    return dict(train, steps=steps, warmup_steps=min(train['warmup_steps'], steps // 4))


# ----------------------------------------------------------------------------------------
# Worker: train one model (runs in a fresh process when --workers > 1)
# ----------------------------------------------------------------------------------------

def train_model(name: str, config: dict, train_kwargs: dict, seed: int, tokens: np.ndarray,
                out_file: str, workdir: str) -> dict:
    """Trains one model on a token stream and writes its params file.

    Checkpoints go to ``workdir`` every ``CHECKPOINT_EVERY`` steps, so a killed run resumes
    where it stopped (bit-identically, see `specjax.train`); a workdir left by a different
    config, seed or token stream is wiped first. ``wall_s`` adds up the sessions.
    """
    import jax

    from specjax import checkpoints
    from specjax.models.api import TransformerLM, count_params
    from specjax.models.transformer import TransformerConfig
    from specjax.train import TrainConfig, train

    logging.basicConfig(level=logging.INFO, format=f'%(asctime)s [{name}] %(message)s',
                        datefmt='%H:%M:%S', force=True)
    _quiet_jax()
    logging.getLogger('specjax.train').setLevel(logging.INFO)
    lm = TransformerLM(TransformerConfig(**config))
    tc = TrainConfig(seed=seed, log_every=50, checkpoint_every=CHECKPOINT_EVERY,
                     keep_checkpoints=1, **train_kwargs)
    wd = Path(workdir)
    key = hashlib.sha256(json.dumps([config, train_kwargs, seed], sort_keys=True).encode()
                         + np.ascontiguousarray(tokens).tobytes()).hexdigest()
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
            stamp.write_text(json.dumps(state))

    params = lm.init_params(jax.random.key(seed))  # ignored when resuming
    params, history = train(lm, tc, tokens, None, workdir=str(wd), params=params,
                            callback=record_wall)
    record_wall()
    wall = state['wall_s']
    if history.get('resumed_from') is not None:
        logging.info('resumed from step %d', history['resumed_from'])
    params_sha = checkpoints.save_params_file(out_file, params)
    losses = history['loss']
    tail = losses[-20:]
    steps = int(history['final_step'])
    return dict(name=name, wall_s=round(wall, 1), params_sha256=params_sha,
                n_params=count_params(params), final_train_loss=float(np.mean(tail)),
                first_train_loss=float(losses[0]), steps=steps,
                resumed=history.get('resumed_from') is not None,
                tokens_per_s=round(steps * tc.batch_size * tc.seq_len / max(wall, 1e-9), 1))


# ----------------------------------------------------------------------------------------
# Main
# ----------------------------------------------------------------------------------------

def _full_config(kwargs: dict) -> dict:
    from specjax.models.transformer import TransformerConfig
    return TransformerConfig(**kwargs).to_dict()


def _lines(text: str) -> list[str]:
    return text.splitlines(keepends=True)


def train_bpe_capped(texts, vocab_size: int, special_tokens=(), name: str = 'bpe',
                     max_token_length: int | None = None):
    """`specjax.tokenizers.train_bpe` plus HF's ``max_token_length`` (no token longer than
    that many byte-level symbols, i.e. bytes); None: exactly `train_bpe`."""
    from specjax.tokenizers import train_bpe
    if max_token_length is None:
        return train_bpe(texts, vocab_size, special_tokens=special_tokens, name=name)
    from tokenizers import AddedToken, pre_tokenizers, trainers

    from specjax.tokenizers.bpe import BPETokenizer, new_byte_level_bpe
    hf = new_byte_level_bpe()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, min_frequency=0,
        special_tokens=[AddedToken(s, special=True, normalized=False) for s in special_tokens],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
        max_token_length=max_token_length)
    hf.train_from_iterator(texts, trainer=trainer)
    return BPETokenizer(hf, name=name)


def build_tokenizers(corpora: dict[str, str]):
    from specjax.data import REASONING_SPECIAL_TOKENS
    out, info = {}, {}
    for name, (vocab, sources, specials, max_len) in TOKENIZERS.items():
        texts = []
        for dom, nbytes in sources.items():
            texts += _lines(_prefix(corpora[dom], nbytes))
        specials = REASONING_SPECIAL_TOKENS if specials == 'REASONING' else specials
        out[name] = train_bpe_capped(texts, vocab, special_tokens=specials, name=name,
                                     max_token_length=max_len)
        if out[name].vocab_size != vocab:
            raise RuntimeError(f'tokenizer {name}: got {out[name].vocab_size} ids, wanted {vocab}')
        info[name] = dict(trained_on_bytes=dict(sources), max_token_bytes=max_len)
    return out, info


def _prefix(text: str, nbytes: int) -> str:
    data = text.encode('utf-8')
    if len(data) <= nbytes:
        return text
    return data[:data.rfind(b'\n', 0, nbytes) + 1].decode('utf-8')


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    ap.add_argument('--out', default='zoo', help='output directory (replaced at the end)')
    ap.add_argument('--budget_scale', type=float, default=1.0,
                    help='multiplies every model\'s step count (1.0: the shipped zoo)')
    ap.add_argument('--workers', type=int, default=2,
                    help='training processes (2: verifier alongside the drafters; 1: in-process)')
    ap.add_argument('--cache', default=None, help='data cache (default: specjax.data default)')
    ap.add_argument('--workdir', default=str(ROOT / 'runs' / 'train_zoo'),
                    help='training checkpoints (a killed run resumes from them) and the zoo '
                         'being built; the checkpoints are deleted after a successful build')
    args = ap.parse_args(argv)
    if args.budget_scale <= 0:
        ap.error(f'--budget_scale: got {args.budget_scale}; allowed: > 0')
    logging.basicConfig(level=logging.INFO, format='%(asctime)s %(message)s', datefmt='%H:%M:%S')
    _quiet_jax()
    t_start = time.monotonic()

    from specjax.data import load_domain, load_heldout
    from specjax.models import zoo as zoo_lib

    out = Path(args.out)
    workdir = Path(args.workdir)
    work = workdir / 'zoo'  # the zoo being built; moved to --out at the end
    shutil.rmtree(work, ignore_errors=True)
    (work / 'tokenizers').mkdir(parents=True)
    (work / 'models').mkdir()
    try:
        # ---- corpora and tokenizers ------------------------------------------------------
        cache = Path(args.cache) if args.cache else None
        corpora = {d: load_domain(d, 'train', max_bytes=TRAIN_BYTES, cache=cache) for d in DOMAINS}
        t0 = time.monotonic()
        toks, tok_sources = build_tokenizers(corpora)
        log.info('tokenizers trained in %.1fs: %s', time.monotonic() - t0,
                 {n: t.vocab_size for n, t in toks.items()})
        tok_records = {}
        for name, tok in toks.items():
            path = work / 'tokenizers' / f'{name}.json'
            tok.save(path)
            tok_records[name] = dict(
                file=f'tokenizers/{name}.json', sha256=zoo_lib.file_sha256(path),
                vocab_size=tok.vocab_size, fingerprint=tok.fingerprint(),
                special_tokens=tok.special_tokens, **tok_sources[name])

        # ---- token streams -----------------------------------------------------------------
        t0 = time.monotonic()
        streams: dict[tuple[str, str], np.ndarray] = {}
        for mname, spec in MODELS.items():
            for dom in spec['domains']:
                key = (spec['tokenizer'], dom)
                if key not in streams:
                    streams[key] = np.asarray(toks[key[0]].encode(corpora[dom]), np.int32)
        log.info('encoded %d streams in %.1fs', len(streams), time.monotonic() - t0)

        def model_tokens(spec) -> np.ndarray:
            parts = [streams[(spec['tokenizer'], d)] for d in spec['domains']]
            n = min(len(p) for p in parts)  # several domains: equal token shares
            return np.concatenate([p[:n] for p in parts]) if len(parts) > 1 else parts[0]

        # ---- training ----------------------------------------------------------------------
        jobs = []
        for mname, spec in MODELS.items():
            config = _full_config(dict(spec['config'], max_len=MAX_LEN,
                                       vocab_size=toks[spec['tokenizer']].vocab_size))
            tk = _scaled_steps(spec['train'], args.budget_scale)
            jobs.append((mname, config, tk, spec['seed'], model_tokens(spec),
                         str(work / 'models' / f'{mname}.npz'), str(workdir / 'ckpt' / mname)))
        t0 = time.monotonic()
        results = {}
        if args.workers <= 1:
            for job in jobs:
                results[job[0]] = train_model(*job)
        else:
            # The verifier in one process, the drafters one after another in the other.
            with ProcessPoolExecutor(max_workers=2, mp_context=get_context('spawn')) as pool:
                fut_v = pool.submit(train_model, *jobs[0])
                fut_d = pool.submit(_train_sequence, jobs[1:])
                results[jobs[0][0]] = fut_v.result()
                for r in fut_d.result():
                    results[r['name']] = r
        train_wall = time.monotonic() - t0
        log.info('training done in %.1fs', train_wall)

        # ---- manifest (without measurements), then load through the zoo loader -----------
        v_params = results['verifier']['n_params']
        models = {}
        for (mname, config, tk, seed, tokens, path, _) in jobs:
            spec, res = MODELS[mname], results[mname]
            rec = dict(
                role=spec['role'], file=f'models/{mname}.npz',
                sha256=zoo_lib.file_sha256(path), params_sha256=res['params_sha256'],
                config=config, n_params=res['n_params'], tokenizer=spec['tokenizer'],
                domains=list(spec['domains']),
                train=dict(tk, seed=seed, wall_s=res['wall_s'], tokens_per_s=res['tokens_per_s'],
                           resumed=res['resumed'],
                           train_tokens=int(len(tokens)),
                           corpus={d: f'specjax.data.load_domain({d!r}, "train", '
                                      f'max_bytes={TRAIN_BYTES})' for d in spec['domains']},
                           first_train_loss=round(res['first_train_loss'], 4),
                           final_train_loss=round(res['final_train_loss'], 4)))
            if spec['role'] == 'drafter':
                rec['temperature'] = spec['temperature']
                rec['cost'] = res['n_params'] / v_params
            models[mname] = rec
        manifest = dict(
            format=zoo_lib.ZOO_FORMAT, created_by='experiments/train_zoo.py',
            budget_scale=args.budget_scale, dtype='float32', seed=SEED,
            drafter_order=list(DRAFTERS), tokenizers=tok_records, models=models)
        _write_manifest(work, manifest)
        zoo = zoo_lib.load_zoo(work)

        # ---- held-out losses vs unigram ----------------------------------------------------
        t0 = time.monotonic()
        heldout = {d: load_heldout(d) for d in DOMAINS}
        counts = {key: np.bincount(s, minlength=toks[key[0]].vocab_size)
                  for key, s in streams.items()}
        for m in (zoo.verifier,) + zoo.drafters:
            rec = models[m.name]
            rec['heldout'] = {}
            for dom in DOMAINS:
                key = (m.tokenizer_name, dom)
                if key not in counts:
                    counts[key] = zoo_lib.unigram_counts(m.tokenizer, corpora[dom])
                loss = zoo_lib.heldout_loss(m.lm, m.params, m.tokenizer, heldout[dom],
                                            seq_len=256)
                uni = zoo_lib.unigram_loss(m.tokenizer, counts[key], heldout[dom])
                rec['heldout'][dom] = dict(
                    nats_per_token=round(loss['nats_per_token'], 4),
                    nats_per_byte=round(loss['nats_per_byte'], 4),
                    unigram_nats_per_token=round(uni['nats_per_token'], 4),
                    unigram_nats_per_byte=round(uni['nats_per_byte'], 4),
                    tokens=loss['tokens'], bytes=loss['bytes'],
                    in_domain=dom in m.domains)
        log.info('held-out evaluation in %.1fs', time.monotonic() - t0)

        # ---- acceptance --------------------------------------------------------------------
        t0 = time.monotonic()
        dep = zoo.deployment()
        for name, data in zip(dep.names, dep.d_data):
            # M: the most drafter tokens one verifier token re-spells into (1: same tokenizer).
            models[name]['retok_width'] = int(np.asarray(data.retok).shape[1])
        for dom in DOMAINS:
            alphas = zoo_lib.acceptance_rates(dep, heldout[dom], window=ACCEPTANCE_WINDOW)
            for name, a in zip(dep.names, alphas):
                models[name].setdefault('acceptance', {})[dom] = round(float(a), 4)
        log.info('acceptance in %.1fs', time.monotonic() - t0)

        # ---- decode speed ------------------------------------------------------------------
        for m in (zoo.verifier,) + zoo.drafters:
            models[m.name]['decode_tokens_per_s'] = round(
                zoo_lib.decode_tokens_per_s(m.lm, m.params, n_tokens=256), 1)

        manifest['measurement'] = dict(
            heldout_text='specjax.data.load_heldout(domain) (shipped, ~32 KB each)',
            heldout_loss='consecutive windows of 256 predicted tokens (specjax.train.eval_loss); '
                         'nats/byte = total nats / bytes of the predicted tokens',
            unigram='add-one smoothed unigram of the model\'s tokenizer, fitted on the same '
                    f'train prefix ({TRAIN_BYTES} B) of the domain',
            acceptance='alpha = mean over positions of sum_x min(p(x), q(x)) in verifier space; '
                       'p: verifier at temperature 1; q: drafter at its default temperature '
                       'after the token-level-intersection mask, read at verifier-token '
                       f'boundaries; windows of {ACCEPTANCE_WINDOW} verifier tokens of '
                       'the shipped held-out text',
            decode='greedy, batch 1, 256 one-token steps inside a jitted lax.scan; best of 3; '
                   'machine-dependent',
            seed_acceptance=SEED_ACCEPTANCE)
        manifest['wall_s'] = dict(training=round(train_wall, 1),
                                  total=round(time.monotonic() - t_start, 1))
        _write_manifest(work, manifest)
        zoo_lib.load_zoo(work)  # the final manifest still verifies

        # ---- publish -----------------------------------------------------------------------
        if out.exists():
            shutil.rmtree(out)
        shutil.move(str(work), str(out))
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)  # the checkpoints stay, for a resume
        raise
    shutil.rmtree(workdir / 'ckpt', ignore_errors=True)
    _print_report(manifest, out)
    return 0


def _quiet_jax() -> None:
    # 'Unable to initialize backend tpu' and similar are noise here.
    for name in ('jax', 'jax._src.xla_bridge', 'absl'):
        logging.getLogger(name).setLevel(logging.WARNING)


def _train_sequence(jobs) -> list[dict]:
    return [train_model(*job) for job in jobs]


def _write_manifest(root: Path, manifest: dict) -> None:
    tmp = root / 'manifest.json.tmp'
    tmp.write_text(json.dumps(manifest, indent=1, sort_keys=False) + '\n', encoding='utf-8')
    os.replace(tmp, root / 'manifest.json')


def _print_report(manifest: dict, out: Path) -> None:
    models = manifest['models']
    size = sum(f.stat().st_size for f in out.rglob('*') if f.is_file())
    print(f'\nzoo written to {out} ({size / 1e6:.2f} MB); training {manifest["wall_s"]["training"]:.0f}s, '
          f'total {manifest["wall_s"]["total"]:.0f}s\n')
    print('| model | params | c_i | steps | train s | decode tok/s |')
    print('| --- | --- | --- | --- | --- | --- |')
    for n, r in models.items():
        print(f'| {n} | {r["n_params"]:,} | {r.get("cost", 1.0):.3f} | {r["train"]["steps"]} | '
              f'{r["train"]["wall_s"]:.0f} | {r["decode_tokens_per_s"]:.0f} |')
    print('\nheld-out loss, nats/byte (model / unigram); * = trained on that domain')
    print('| model | ' + ' | '.join(DOMAINS) + ' |')
    print('| --- |' + ' --- |' * len(DOMAINS))
    for n, r in models.items():
        cells = []
        for d in DOMAINS:
            h = r['heldout'][d]
            cells.append(f'{h["nats_per_byte"]:.3f} / {h["unigram_nats_per_byte"]:.3f}'
                         + (' *' if h['in_domain'] else ''))
        print(f'| {n} | ' + ' | '.join(cells) + ' |')
    print('\nacceptance α = Σ min(p, q) vs the verifier (τ_v = 1, drafter at its default τ); '
          'seed: 0.68 / 0.61 / 0.54 (code / prose / reasoning, own domain)')
    print('| drafter | τ | M | ' + ' | '.join(DOMAINS) + ' | seed (own domain) |')
    print('| --- | --- | --- |' + ' --- |' * len(DOMAINS) + ' --- |')
    for n in manifest['drafter_order']:
        r = models[n]
        cells = [f'{r["acceptance"][d]:.3f}' + (' *' if d in r['domains'] else '')
                 for d in DOMAINS]
        print(f'| {n} | {r["temperature"]} | {r["retok_width"]} | ' + ' | '.join(cells)
              + f' | {SEED_ACCEPTANCE[n]} |')
    band = [models[n]['acceptance'][models[n]['domains'][0]] for n in manifest['drafter_order']]
    inside = all(0.4 <= a <= 0.8 for a in band)
    print(f'\nown-domain acceptance {" / ".join(f"{a:.2f}" for a in band)}: '
          f'{"inside" if inside else "OUTSIDE"} the 0.4–0.8 band')


if __name__ == '__main__':
    sys.exit(main())
