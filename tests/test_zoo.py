"""The shipped zoo (`zoo/`, built by experiments/train_zoo.py) and its loader.

Fast: nothing is trained. The files are checked against the manifest, every model is
re-scored on a slice of the shipped held-out text of its domain(s), the deployment is
assembled, and each loader error is provoked on a copy of the zoo in ``tmp_path``.
"""

import json
import shutil

import jax.numpy as jnp
import numpy as np
import pytest

from specjax.data import REASONING_SPECIAL_TOKENS, load_heldout
from specjax.engine.deployment import from_zoo
from specjax.errors import ConfigError
from specjax.measure import evaluation
from specjax.models import zoo as zoo_lib
from specjax.models.api import count_params

DOMAINS = ('code', 'prose', 'reasoning')
# Held-out slice per (model, domain): the first SLICE_TOKENS tokens, one window.
SLICE_TOKENS = 384
# Every model must beat the add-one unigram baseline of its domain(s) on the slice by a
# clear margin: a relative gain 1 - model/unigram (nats/byte) of at least SAFETY_FACTOR
# times the smallest gain the manifest records for any (model, own domain) on the whole
# shipped held-out text. The factor leaves room for the slice being harder than the whole
# text and for numeric differences between machines.
SAFETY_FACTOR = 0.5


@pytest.fixture(scope='module')
def zoo():
    return zoo_lib.load_zoo()


@pytest.fixture(scope='module')
def manifest(zoo):
    return zoo.manifest


def _copy(tmp_path):
    dst = tmp_path / 'zoo'
    shutil.copytree(zoo_lib.default_zoo_path(), dst)
    return dst


def _one_line_error(excinfo, *needles):
    msg = str(excinfo.value)
    assert '\n' not in msg, msg
    for n in needles:
        assert n in msg, (n, msg)
    return msg


# ---------------------------------------------------------------------------------------
# The manifest matches the files
# ---------------------------------------------------------------------------------------


def test_manifest_matches_files(zoo, manifest):
    root = zoo.path
    assert manifest['format'] == zoo_lib.ZOO_FORMAT
    assert manifest['drafter_order'] == list(zoo_lib.DRAFTER_ORDER)
    files = set()
    for rec in list(manifest['tokenizers'].values()) + list(manifest['models'].values()):
        assert zoo_lib.file_sha256(root / rec['file']) == rec['sha256'], rec['file']
        files.add(rec['file'])
    shipped = {str(p.relative_to(root)) for p in root.rglob('*') if p.is_file()}
    assert shipped == files | {'manifest.json'}, shipped ^ (files | {'manifest.json'})
    size = sum((root / f).stat().st_size for f in shipped)
    assert size <= 25e6, f'zoo is {size / 1e6:.1f} MB, budget 25 MB'


def test_parameter_counts_and_vocab_sizes(zoo, manifest):
    models = (zoo.verifier,) + zoo.drafters
    assert zoo.names == zoo_lib.DRAFTER_ORDER
    for m in models:
        rec = manifest['models'][m.name]
        assert count_params(m.params) == rec['n_params'] == m.n_params
        tok_rec = manifest['tokenizers'][rec['tokenizer']]
        assert m.tokenizer.vocab_size == tok_rec['vocab_size'] == m.lm.vocab_size
        assert m.tokenizer.fingerprint() == tok_rec['fingerprint']
        assert rec['config'] == m.lm.config.to_dict()  # every field, defaults included
    v = zoo.verifier.n_params
    sizes = [d.n_params for d in zoo.drafters]
    assert sizes == sorted(sizes) and sizes[-1] < v  # code < prose < reasoning < verifier
    for d in zoo.drafters:
        assert d.cost == pytest.approx(d.n_params / v)
        assert 0 < d.cost < 0.35
    assert [d.temperature for d in zoo.drafters] == [1.0, 1.0, 1.3]
    # Deployed like the seed's (SPEC §8): code and prose in the verifier's tokenizer group,
    # reasoning with its own; the extra drafter prose512 has a third, for the pairing sweep.
    fp = {m.name: m.tokenizer.fingerprint() for m in models}
    assert fp['code'] == fp['prose'] == fp['verifier']
    assert fp['reasoning'] != fp['verifier']
    extra = zoo_lib.load_zoo(names=['prose512']).drafter('prose512')
    assert len({fp['verifier'], fp['reasoning'], extra.tokenizer.fingerprint()}) == 3
    rt = zoo.drafter('reasoning').tokenizer
    for s in REASONING_SPECIAL_TOKENS:
        assert len(rt.encode(s)) == 1  # one token for the drafter...
        assert len(zoo.verifier.tokenizer.encode(s)) > 1  # ...several for the verifier


def test_manifest_records_measurements(manifest):
    for name, rec in manifest['models'].items():
        assert rec['train']['steps'] > 0 and rec['train']['wall_s'] > 0
        assert 'seed' in rec['train']
        for dom in DOMAINS:
            h = rec['heldout'][dom]
            assert h['nats_per_token'] > 0 and h['nats_per_byte'] > 0
            assert h['unigram_nats_per_byte'] > 0
        assert rec['decode_tokens_per_s'] > 0
        if rec['role'] == 'drafter':
            assert set(rec['acceptance']) == set(DOMAINS)
            assert all(0 < a < 1 for a in rec['acceptance'].values())


def test_drafters_land_in_the_seeds_band_and_lead_their_own_domain(manifest):
    """Mixed-traffic α (the mean over the three domains, as recorded by train_zoo) in the
    seed's band, and each drafter the best of the three on its own domain."""
    order = manifest['drafter_order']
    acc = {n: manifest['models'][n]['acceptance'] for n in order}
    for n in order:
        mixed = float(np.mean([acc[n][d] for d in DOMAINS]))
        assert 0.45 <= mixed <= 0.75, (n, mixed)
        own = manifest['models'][n]['domains'][0]
        assert acc[n][own] == max(acc[m][own] for m in order), (n, own)


# ---------------------------------------------------------------------------------------
# Every model beats its unigram baseline on its own domain(s)
# ---------------------------------------------------------------------------------------


def _observed_gain(manifest) -> float:
    gains = []
    for rec in manifest['models'].values():
        for dom in rec['domains']:
            h = rec['heldout'][dom]
            gains.append(1 - h['nats_per_byte'] / h['unigram_nats_per_byte'])
    return min(gains)


@pytest.mark.parametrize('name', ('verifier',) + zoo_lib.DRAFTER_ORDER)
def test_beats_unigram_on_own_domains(zoo, manifest, name):
    m = zoo.model(name)
    gain = _observed_gain(manifest)
    assert gain > 0.2, f'the shipped zoo itself gains only {gain:.2f} over unigram'
    threshold = SAFETY_FACTOR * gain
    for dom in m.domains:
        text = load_heldout(dom)[: 8 * SLICE_TOKENS]
        loss = evaluation.heldout_loss(
            m.lm,
            m.params,
            m.tokenizer,
            text,
            seq_len=SLICE_TOKENS,
            max_tokens=SLICE_TOKENS,
            batch_size=1,
        )
        assert loss['tokens'] == SLICE_TOKENS
        uni = manifest['models'][name]['heldout'][dom]['unigram_nats_per_byte']
        got = 1 - loss['nats_per_byte'] / uni
        assert got > threshold, (
            f'{name} on {dom}: {loss["nats_per_byte"]:.3f} nats/byte vs unigram {uni:.3f} '
            f'(gain {got:.2f}, need > {threshold:.2f})'
        )


# ---------------------------------------------------------------------------------------
# The deployment
# ---------------------------------------------------------------------------------------


def test_deployment_builds(zoo, manifest):
    dep = from_zoo(zoo)
    assert dep.names == ('code', 'prose', 'reasoning')
    assert len(dep.drafters) == len(dep.d_data) == len(dep.drafter_encode) == 3
    assert len(set(dep.groups)) == 2  # {code, prose} share the verifier's tokenizer
    assert dep.groups[0] == dep.groups[1] == zoo.verifier.tokenizer.fingerprint()
    assert dep.stop_table.shape == (zoo.verifier.lm.vocab_size,) and dep.stop_table.any()
    toks = zoo.verifier.tokenizer
    assert all((b'\n' in toks.token_bytes(i)) == dep.stop_table[i] for i in range(toks.vocab_size))
    vv = zoo.verifier.lm.vocab_size
    for same in dep.d_data[:2]:
        np.testing.assert_array_equal(same.to_verifier, np.arange(vv))
        np.testing.assert_array_equal(same.retok_len, np.ones(vv))
    # A cross-vocabulary drafter re-spells a verifier token in at most M of its own tokens,
    # M ≤ the verifier's longest token in bytes (byte-level BPE: one byte is one token).
    longest = max(len(b) for b in toks.all_token_bytes())
    wide = from_zoo(zoo_lib.load_zoo(names=['reasoning', 'prose512']))
    for k in (0, 1):  # cross-vocabulary: partial intersection
        to_v = np.asarray(wide.d_data[k].to_verifier)
        assert (to_v >= 0).any() and (to_v < 0).any()
        vv_rows, width = wide.d_data[k].retok.shape
        assert vv_rows == vv and 1 <= width <= longest
    rt = zoo.drafter('reasoning').tokenizer
    think = rt.encode(REASONING_SPECIAL_TOKENS[0])[0]
    assert int(dep.d_data[2].to_verifier[think]) == -1  # not a verifier token
    text = 'def f(x):\n    return x\n'
    assert dep.decode(dep.encode(text)) == text
    assert [f(text) for f in dep.drafter_encode][2] == zoo.drafter('reasoning').tokenizer.encode(
        text
    )
    assert [d.cost for d in dep.drafters] == [d.cost for d in zoo.drafters]
    assert [d.temperature for d in dep.drafters] == [1.0, 1.0, 1.3]


def test_deployment_overrides(zoo):
    dep = from_zoo(zoo, names=['reasoning', 'code'], temperatures={'code': 0.0}, costs=[0.5, 0.25])
    assert dep.names == ('reasoning', 'code')
    assert [d.temperature for d in dep.drafters] == [1.3, 0.0]
    assert [d.cost for d in dep.drafters] == [0.5, 0.25]
    with pytest.raises(ConfigError) as e:
        from_zoo(zoo, names=['code', 'poetry'])
    _one_line_error(e, 'poetry', 'prose')
    with pytest.raises(ConfigError) as e:
        from_zoo(zoo, temperatures=[1.0])
    _one_line_error(e, 'temperatures')


@pytest.mark.slow  # ~15 s on a 2-core CPU, most of it compiling prefix_distributions
def test_acceptance_helper_matches_prefix_distributions(zoo):
    """The packed α computation equals `prefix_distributions` (short window, so that its
    per-token padding to the re-tokenisation width fits the drafters' context)."""
    from specjax.engine.deployment import prefix_distributions
    from specjax.verify.distributions import sampling_probs

    dep = from_zoo(zoo, names=['reasoning'])  # cross-vocabulary, with thinking tokens
    text = load_heldout('reasoning')[:400]
    n = 6
    got = evaluation.acceptance_rates(dep, text, window=n, max_tokens=n)
    ids = np.asarray(dep.encode(text), np.int32)[:n][None]
    q, ok = prefix_distributions(dep, ids, np.array([n]), n)
    assert ok.all()
    p = sampling_probs(dep.verifier.logits_full(dep.v_params, jnp.asarray(ids)), 1.0)[0]
    want = [float(jnp.minimum(p, q[k]).sum(-1).mean()) for k in range(len(dep.drafters))]
    np.testing.assert_allclose(got, want, atol=1e-5)


# ---------------------------------------------------------------------------------------
# Loader errors: one line, naming what is wrong
# ---------------------------------------------------------------------------------------


def test_load_subset(zoo):
    z = zoo_lib.load_zoo(names=['prose'])
    assert z.names == ('prose',) and z.verifier.name == 'verifier'


def test_unknown_model_name():
    with pytest.raises(ConfigError) as e:
        zoo_lib.load_zoo(names=['code', 'poetry'])
    _one_line_error(e, "'poetry'", "'verifier'", "'code'", "'prose'", "'reasoning'")


def test_missing_manifest(tmp_path):
    with pytest.raises(ConfigError) as e:
        zoo_lib.load_zoo(tmp_path)
    _one_line_error(e, 'manifest.json', str(tmp_path))
    with pytest.raises(ConfigError) as e:
        zoo_lib.load_zoo(tmp_path / 'nowhere')
    _one_line_error(e, 'nowhere')


def test_corrupt_manifest(tmp_path):
    root = _copy(tmp_path)
    (root / 'manifest.json').write_text('{"format": ', encoding='utf-8')
    with pytest.raises(ConfigError) as e:
        zoo_lib.load_zoo(root)
    _one_line_error(e, 'manifest.json', 'JSON')


@pytest.mark.parametrize('target', ['models/prose.npz', 'tokenizers/reasoning.json'])
def test_flipped_bytes_sha_mismatch(tmp_path, target):
    root = _copy(tmp_path)
    path = root / target
    data = bytearray(path.read_bytes())
    for i in (len(data) // 3, len(data) // 2):
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(ConfigError) as e:
        zoo_lib.load_zoo(root)
    _one_line_error(e, str(path), 'sha256 mismatch')


def test_corrupt_file_with_matching_manifest_sha(tmp_path):
    """A damaged file whose sha was (wrongly) re-recorded is still caught when read."""
    root = _copy(tmp_path)
    path = root / 'models' / 'code.npz'
    path.write_bytes(path.read_bytes()[:1000])  # truncated
    manifest = json.loads((root / 'manifest.json').read_text())
    manifest['models']['code']['sha256'] = zoo_lib.file_sha256(path)
    (root / 'manifest.json').write_text(json.dumps(manifest))
    with pytest.raises(ConfigError) as e:
        zoo_lib.load_zoo(root)
    _one_line_error(e, "'code'", str(path), 'corrupt')


@pytest.mark.parametrize('target', ['models/reasoning.npz', 'tokenizers/reasoning.json'])
def test_missing_file(tmp_path, target):
    root = _copy(tmp_path)
    (root / target).unlink()
    with pytest.raises(ConfigError) as e:
        zoo_lib.load_zoo(root)
    _one_line_error(e, str(root / target), 'missing')


def test_vocabulary_mismatch(tmp_path):
    root = _copy(tmp_path)
    manifest = json.loads((root / 'manifest.json').read_text())
    manifest['models']['reasoning']['tokenizer'] = 'verifier'  # 1024 ids for a 768-id model
    (root / 'manifest.json').write_text(json.dumps(manifest))
    with pytest.raises(ConfigError) as e:
        zoo_lib.load_zoo(root)
    msg = _one_line_error(e, "'reasoning'", 'vocab')
    assert '768' in msg and '1024' in msg
