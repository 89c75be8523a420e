"""Synthetic test deployments: the adversarial setups of the losslessness suite (SPEC §9).

Used by the tests and by ``deployment="synthetic"`` configs (exact table LMs, so every
figure has an exactly computable target).

A case is a verifier table and three drafter tables over a small vocabulary. The drafters
have their *own* vocabularies (rule 3): drafter 0 shares the verifier's ids, drafter 1 is a
permutation of them plus a token the verifier lacks (a "thinking" token), drafter 2 covers
only part of the verifier's vocabulary (verifier tokens outside it are re-tokenised into two
drafter tokens). So every case also exercises cross-vocabulary drafting.
"""

from __future__ import annotations

import dataclasses
import itertools

import jax.numpy as jnp
import numpy as np

from specjax.engine.spec import DrafterSpec, cross_vocab_maps
from specjax.models.synthetic import BigramLM, random_table
from specjax.verify.distributions import sampling_probs

V = 5  # verifier vocabulary
NEG = -1e4  # logit of an impossible token (exp underflows to exactly 0 in f32)
CASES = ("random", "q_equals_p", "disjoint_support", "one_hot_q", "sharp_p", "flat_p")
DRAFTER_TEMPERATURES = (1.0, 0.7, 1.5)


@dataclasses.dataclass
class Setup:
    verifier: BigramLM
    v_params: dict
    drafters: tuple
    d_data: tuple
    v_table: np.ndarray


def _maps():
    """(to_verifier, retok, retok_len) for the three drafters."""
    # Drafter 0: identity.
    m0 = (np.arange(V), np.arange(V)[:, None], np.ones(V, np.int32))
    # Drafter 1: reversed ids + one extra token (id V) the verifier lacks.
    perm = np.arange(V)[::-1].copy()
    to1 = np.concatenate([perm, [-1]])
    inv = np.argsort(perm)
    m1 = (to1, inv[:, None], np.ones(V, np.int32))
    # Drafter 2: knows verifier ids 0..V-3 only; ids V-2, V-1 exist as two-token spellings.
    known = V - 2
    to2 = np.concatenate([np.arange(known), [-1, -1]])
    retok2 = np.zeros((V, 2), np.int32)
    lens2 = np.ones(V, np.int32)
    for v in range(V):
        if v < known:
            retok2[v, 0] = v
        else:
            retok2[v] = [known + (v - known), (v * 7) % known]
            lens2[v] = 2
    m2 = (to2, retok2, lens2)
    return (m0, m1, m2)


def case_tables(name: str, seed: int = 0):
    """(verifier table f32[V, V], [three drafter tables in their own ids])."""
    rng = np.random.default_rng(seed)
    vt = random_table(rng, V, 1.5)
    maps = _maps()
    # Drafter logits in *verifier* ids, then laid out in each drafter's own ids.
    dq = [random_table(rng, V, 1.5) for _ in range(3)]
    if name == "q_equals_p":
        dq = [vt.copy() for _ in range(3)]
    elif name == "disjoint_support":
        vt[:, : V // 2] = NEG  # p lives on the upper ids
        for t in dq:
            t[:, V // 2 :] = NEG  # q on the lower ids
    elif name == "one_hot_q":
        for i, t in enumerate(dq):
            t[:] = NEG
            t[np.arange(V), (np.arange(V) + i) % V] = 0.0
    elif name == "sharp_p":
        vt *= 6.0
    elif name == "flat_p":
        vt *= 0.05
    elif name != "random":
        raise ValueError(f"case: got {name!r}; allowed: {CASES}")
    d_tables = []
    for (to_v, _, _), t in zip(maps, dq):
        vd = len(to_v)
        table = np.full((vd, vd), NEG, np.float32)
        ok = np.nonzero(to_v >= 0)[0]
        # Row = the drafter's context token (in its ids), column = the next token.
        ctx_v = np.where(to_v >= 0, to_v, 0)
        table[:, ok] = t[ctx_v][:, to_v[ok]]
        if vd > V:  # the extra "thinking" token: likely, but outside the intersection
            table[:, V:] = 2.0
        d_tables.append(table)
    return vt.astype(np.float32), d_tables


def make_setup(name: str, seed: int = 0, temperatures=DRAFTER_TEMPERATURES) -> Setup:
    vt, d_tables = case_tables(name, seed)
    drafters, data = [], []
    for i, ((to_v, retok, lens), table) in enumerate(zip(_maps(), d_tables)):
        drafters.append(DrafterSpec(f"d{i}", BigramLM(table.shape[0]), temperature=temperatures[i]))
        data.append(cross_vocab_maps({"table": jnp.asarray(table)}, to_v, retok, lens, V))
    return Setup(
        verifier=BigramLM(V),
        v_params={"table": jnp.asarray(vt)},
        drafters=tuple(drafters),
        d_data=tuple(data),
        v_table=vt,
    )


def sequence_distribution(
    table: np.ndarray, temperature: float, start: int, length: int
) -> np.ndarray:
    """Exact law of the next `length` tokens after `start` when sampling `table` at `temperature`.

    Returns:
        f64[V] * length (an ndarray of shape (V,)*length) summing to 1.
    """
    probs = np.asarray(sampling_probs(jnp.asarray(table), temperature), np.float64)
    probs = probs / probs.sum(-1, keepdims=True)
    v = table.shape[0]
    out = np.zeros((v,) * length)
    for seq in itertools.product(range(v), repeat=length):
        prev, pr = start, 1.0
        for tok in seq:
            pr *= probs[prev, tok]
            prev = tok
        out[seq] = pr
    return out


def drafter_prompts(prompt: list[int]) -> list[list[int]]:
    """The prompt re-spelt in each drafter's ids (through its re-tokenisation table)."""
    out = []
    for _, retok, lens in _maps():
        out.append([int(t) for v in prompt for t in retok[v, : lens[v]]])
    return out


SYMBOLS = "\nabcd"  # verifier token v is the character SYMBOLS[v]; token 0 ends a plan step


def make_deployment(
    case: str = "random",
    seed: int = 0,
    temperatures=DRAFTER_TEMPERATURES,
    fourth: bool = False,
    costs=(0.02, 0.04, 0.1, 0.03),
):
    """A synthetic `Deployment` over `make_setup`'s models, with text spelt in SYMBOLS.

    With `fourth=True` a fourth drafter shares drafter 0's vocabulary (same tokenizer
    group), so prefix partitioning yields a set of two drafters.
    """
    from specjax.engine.deployment import Deployment

    setup = make_setup(case, seed, temperatures)
    drafters, data = list(setup.drafters), list(setup.d_data)
    groups = ["verifier", "reversed", "partial"]
    maps = list(_maps())
    if fourth:
        rng = np.random.default_rng(seed + 99)
        drafters.append(DrafterSpec("d3", BigramLM(V), temperature=1.2))
        data.append(
            cross_vocab_maps({"table": jnp.asarray(random_table(rng, V, 1.5))}, *maps[0], V)
        )
        groups.append("verifier")
        maps.append(maps[0])
    drafters = [dataclasses.replace(d, cost=c) for d, c in zip(drafters, costs)]

    def encode(text):
        return [SYMBOLS.index(ch) for ch in text]

    def decode(ids):
        return "".join(SYMBOLS[i] for i in ids)

    def drafter_encoder(m):
        _, retok, lens = m
        return lambda text: [int(t) for v in encode(text) for t in retok[v, : lens[v]]]

    stop = np.zeros(V, bool)
    stop[0] = True
    return Deployment(
        verifier=setup.verifier,
        v_params=setup.v_params,
        drafters=tuple(drafters),
        d_data=tuple(data),
        groups=tuple(groups),
        encode=encode,
        decode=decode,
        drafter_encode=tuple(drafter_encoder(m) for m in maps),
        stop_table=stop,
    ), setup


def tiny_transformers(vocab: int = 32, max_len: int = 64, verifier_layers: int = 2):
    """A tiny random transformer verifier and two tiny transformer drafters of its
    vocabulary (1 and 2 layers, identity maps): ``(verifier, v_params, specs, data)``, for
    engine tests on real KV caches. Fixed seeds."""
    import dataclasses  # pylint: disable=import-outside-toplevel

    from specjax.engine.spec import identity_maps  # pylint: disable=import-outside-toplevel
    from specjax.models.api import TransformerLM  # pylint: disable=import-outside-toplevel
    from specjax.models.transformer import TransformerConfig  # pylint: disable=import-outside-toplevel

    base = TransformerConfig(
        vocab_size=vocab,
        d_model=32,
        n_layers=verifier_layers,
        n_heads=4,
        n_kv_heads=2,
        d_ff=64,
        max_len=max_len,
    )
    v = TransformerLM(base)
    ds = [
        TransformerLM(
            dataclasses.replace(base, d_model=16, n_heads=2, n_kv_heads=1, d_ff=32, n_layers=n)
        )
        for n in (1, 2)
    ]
    specs = tuple(DrafterSpec(f"t{i}", lm, temperature=1.0) for i, lm in enumerate(ds))
    data = tuple(identity_maps(lm.init_params(10 + i), vocab) for i, lm in enumerate(ds))
    return v, v.init_params(0), specs, data


def tiny_transformer_deployment(max_len: int = 96, feature: bool = False):
    """A verifier (2 layers, d 32) and two one-layer drafters as tiny random transformers:
    'same' (the verifier's byte tokenizer) and 'other' (bytes plus two thinking tokens, a
    tokenizer of its own); with ``feature`` a third, 'eagle', a feature drafter
    (`specjax.models.eagle`, one layer over the verifier's final state, its head the
    verifier's over every id). Fixed seeds: every process builds the same deployment."""
    from types import SimpleNamespace  # pylint: disable=import-outside-toplevel

    from specjax.engine.deployment import build_deployment  # pylint: disable=import-outside-toplevel
    from specjax.models.api import TransformerLM  # pylint: disable=import-outside-toplevel
    from specjax.models.transformer import TransformerConfig  # pylint: disable=import-outside-toplevel
    from specjax.tokenizers import ByteTokenizer  # pylint: disable=import-outside-toplevel

    def model(vocab, d, layers, seed, tok):
        cfg = TransformerConfig(
            vocab_size=vocab,
            d_model=d,
            n_layers=layers,
            n_heads=4,
            n_kv_heads=2,
            d_ff=2 * d,
            max_len=max_len,
        )
        lm = TransformerLM(cfg)
        return SimpleNamespace(lm=lm, params=lm.init_params(seed), tokenizer=tok)

    plain, marked = ByteTokenizer(), ByteTokenizer(special_tokens=["<think>", "</think>"])
    verifier = model(256, 32, 2, 0, plain)
    drafters = [
        ("same", model(256, 16, 1, 1, plain), 1.0, 0.1),
        ("other", model(258, 16, 1, 2, marked), 1.0, 0.1),
    ]
    if feature:
        from specjax.models.eagle import EagleLM, eagle_config  # pylint: disable=import-outside-toplevel

        lm = EagleLM(eagle_config(verifier.lm.config, 256), 256)
        net = lm.init_net(3)
        net["fc"] = net["fc"] * 3.0  # a drafter that reads its features (not near-uniform)
        params = lm.attach(net, verifier.params["embed"], np.arange(256))
        drafters.append(("eagle", SimpleNamespace(lm=lm, params=params, tokenizer=plain), 1.0, 0.1))
    return build_deployment(verifier, drafters)
