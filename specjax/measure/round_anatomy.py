"""Tools of experiments/profile_round.py: a package's modules by role (for paired timing of
an older copy), an HLO census of a compiled loop body, a per-thunk
profile of a traced run, the drafters' catch-up and a forward timer with CPU time, and
ablated variants of the speculative round (scratch copies
traced from a package's `engine.decode`, never the engine's code path).
"""

from __future__ import annotations

import collections
import functools
import importlib
import re
import time
from pathlib import Path

import jax
import jax.numpy as jnp

from specjax import metrics
from specjax.measure.timing import forward_timer

# ----------------------------------------------------------------------------------------
# A package's modules (the current one, or an older copy renamed for paired timing)
# ----------------------------------------------------------------------------------------


def round_budget_fn(decode):
    """The decode module's per-row budget function (`round_budget`; `_budget` before it was
    made public), so an older package compares too."""
    return getattr(decode, "round_budget", None) or decode._budget  # pylint: disable=protected-access


def counters_class(mods):
    """The round counters' class (`engine.state.Counters`; in `engine.decode` before)."""
    decode = mods["decode"]
    if hasattr(decode, "Counters"):
        return decode.Counters
    return importlib.import_module(f"{mods['pkg']}.engine.state").Counters


def _ar_module(pkg: str):
    """The module of `autoregressive_generate` (`engine.autoregressive`; `engine.generate`
    before the baseline left it), so an older package compares too."""
    try:
        return importlib.import_module(f"{pkg}.engine.autoregressive")
    except ModuleNotFoundError:
        return importlib.import_module(f"{pkg}.engine.generate")


def load_package(pkg: str) -> dict:
    """The modules of package ``pkg`` ('specjax', or e.g. 'specjax_old': a renamed copy of an
    older tree) that the round's tools use, by role, and ``pkg`` itself."""
    m = lambda name: importlib.import_module(f"{pkg}.{name}")  # noqa: E731
    return dict(
        zoo=m("models.zoo"),
        dep=m("engine.deployment"),
        gen=m("engine.generate"),
        ar=_ar_module(pkg),
        decode=m("engine.decode"),
        spec=m("engine.spec"),
        data=m("data"),
        api=m("models.api"),
        rules=m("verify.rules"),
        dist=m("verify.distributions"),
        streams=m("verify.streams"),
        pkg=pkg,
    )


# ----------------------------------------------------------------------------------------
# HLO census
# ----------------------------------------------------------------------------------------

_FREE = {
    "parameter",
    "get-tuple-element",
    "tuple",
    "bitcast",
    "constant",
    "after-all",
    "partition-id",
    "replica-id",
}
_COMP = re.compile(r"^(?:ENTRY\s+)?(%?[\w.\-]+)\s+\(.*\)\s+->\s+.*\{\s*$")
_INSTR = re.compile(r"^\s*(?:ROOT\s+)?%?[\w.\-]+\s+=\s+(.+?)\s+([a-z][\w\-]*)\((.*)$")


def parse_hlo(text: str) -> dict:
    """{computation: [(opcode, attrs line)]} of an HLO module's text."""
    comps, cur = {}, None
    for line in text.splitlines():
        m = _COMP.match(line)
        if m:
            cur = m.group(1).lstrip("%")
            comps[cur] = []
            if line.startswith("ENTRY"):
                comps["__entry__"] = cur
            continue
        if cur is None:
            continue
        if line.strip() == "}":
            cur = None
            continue
        mi = _INSTR.match(line)
        if mi:
            comps[cur].append((mi.group(2), line))
    return comps


def _called(line, key):
    m = re.search(key + r"=%?([\w.\-]+)", line)
    return m.group(1) if m else None


def census(comps, name, trips: int = 1) -> collections.Counter:
    """Instructions of computation `name` that run: `thunks` (each once), `executed` (times
    the known trip counts of nested loops), nested while loops' instructions also as
    `nested_*`; a fusion is one thunk, a `call` runs its callee."""
    c = collections.Counter()
    for op, line in comps.get(name, []):
        if op in _FREE:
            continue
        if op == "while":
            c["while"] += 1
            m = re.search(r'"known_trip_count":\{"n":"(\d+)"', line)
            n = int(m.group(1)) if m else 1
            sub = census(comps, _called(line, "body"), trips * n)
            sub += census(comps, _called(line, "condition"), trips * n)
            c["executed"] += sub.pop("executed", 0)
            for k, v in sub.items():
                c[k if k.startswith("nested_") else f"nested_{k}"] += v
            continue
        if op in ("call", "conditional"):
            for callee in re.findall(
                r"(?:to_apply|branch_computations|true_computation|"
                r"false_computation)=\{?%?([\w.\-, %]+)\}?",
                line,
            ):
                for n in callee.split(","):
                    c += census(comps, n.strip().lstrip("%"), trips)
            c[op] += 1
            continue
        c["thunks"] += 1
        c["executed"] += trips
        c[op] += 1
    return c


def loop_census(text: str) -> dict:
    comps = parse_hlo(text)
    entry = comps.get("__entry__")
    whiles = [line for op, line in comps.get(entry, []) if op == "while"]
    if not whiles:
        return {}
    # The speculative loop: the entry's largest while body.
    best = max(whiles, key=lambda l: len(comps.get(_called(l, "body"), [])))
    c = census(comps, _called(best, "body"))
    c += census(comps, _called(best, "condition"))
    copies = sum(1 for op, line in comps.get(_called(best, "body"), []) if op == "copy")
    keys = (
        "thunks",
        "executed",
        "fusion",
        "custom-call",
        "copy",
        "while",
        "nested_thunks",
        "nested_fusion",
        "dynamic-update-slice",
        "scatter",
        "gather",
        "sort",
        "dot",
        "call",
        "conditional",
    )
    out = {k: int(c.get(k, 0)) for k in keys}
    out["body_copies"] = copies
    out["top_ops"] = dict(
        collections.Counter(
            {
                k: v
                for k, v in c.items()
                if not k.startswith("nested_") and k not in ("thunks", "executed")
            }
        ).most_common(12)
    )
    return out


def _op_names(text: str) -> dict:
    """{instruction name: (opcode, shape, op_name)} of an HLO module's text."""
    out = {}
    for line in text.splitlines():
        m = re.match(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s+=\s+(.+?)\s+([a-z][\w\-]*)\(", line)
        if m:
            on = re.search(r'op_name="([^"]+)"', line)
            out[m.group(1)] = (
                m.group(3),
                m.group(2)[:40],
                on.group(1).replace("jit(loop)/while/body/", "") if on else "",
            )
    return out


_CATEGORIES = (
    (
        "prng",
        ("threefry", "_uniform", "_gumbel", "random_bits", "_split", "fold_in", "categorical"),
    ),
    ("dot", ("dot_general", "ynn")),
    ("cache write", ("scatter",)),
    ("sampling", ("sampling_probs", "cumsum", "softmax", "sample")),
    ("copy", ("copy",)),
)


def thunk_profile(pdir: str, hlo_text: str, rounds: int, top: int = 30) -> dict:
    """Per-thunk time of one traced loop run (XLA:CPU with
    `XLA_FLAGS=--xla_cpu_enable_xprof_traceme=true`), per round, joined with the HLO."""
    from jax.profiler import ProfileData  # pylint: disable=import-outside-toplevel

    files = sorted(Path(pdir).glob("**/*.xplane.pb"))
    if not files:
        print("  (no trace written)")
        return {}
    names = _op_names(hlo_text)
    tot, cnt = collections.Counter(), collections.Counter()
    for plane in ProfileData.from_file(str(files[-1])).planes:
        for line in plane.lines:
            if "XLA" not in line.name:
                continue
            for ev in line.events:
                if ev.name.startswith("ThunkExecutor") or ev.name.startswith("while"):
                    continue
                tot[ev.name] += ev.duration_ns
                cnt[ev.name] += 1
    if not tot:
        print("  (no per-thunk events: set XLA_FLAGS=--xla_cpu_enable_xprof_traceme=true)")
        return {}
    cats = collections.Counter()
    for name, ns in tot.items():
        op, shape, on = names.get(name, ("?", "", ""))
        key = f"{name} {op} {on}"
        cat = next((c for c, keys in _CATEGORIES if any(k in key for k in keys)), "other")
        cats[cat] += ns
    total = sum(tot.values())
    print(
        f"  thunk time per round {total / rounds / 1e3:.1f} µs over "
        f"{sum(cnt.values()) / rounds:.0f} thunk events; by category (µs/round): "
        + ", ".join(f"{k} {v / rounds / 1e3:.1f}" for k, v in cats.most_common())
    )

    def show(rows):
        for name, ns in rows:
            op, shape, on = names.get(name, ("?", "", ""))
            print(
                f"    {ns / rounds / 1e3:7.1f} µs/round {cnt[name] / rounds:4.1f}x  {name:28} "
                f"{shape:28} {on[:100]}"
            )

    show(tot.most_common(top))
    # The products are the forwards' (timed apart); what is left is the round's own work.
    rest = [
        (n, ns) for n, ns in tot.most_common() if "dot_general" not in names.get(n, ("", "", ""))[2]
    ]
    print(f"  the {top} largest thunks outside the products (dot_general):")
    show(rest[:top])
    return {k: v / rounds / 1e3 for k, v in cats.items()}


# ----------------------------------------------------------------------------------------
# Ablations: variants of the round traced from the package's decode module
# ----------------------------------------------------------------------------------------


class _Patch:
    def __init__(self, module, **attrs):
        self.module, self.attrs, self.old = module, attrs, {}

    def __enter__(self):
        for k, v in self.attrs.items():
            self.old[k] = getattr(self.module, k)
            setattr(self.module, k, v)

    def __exit__(self, *exc):
        for k, v in self.old.items():
            setattr(self.module, k, v)


def _argmax_patches(mods):
    """Every draw of the round an argmax and every key derivation a no-op (whichever of
    these the package's decode module uses)."""
    decode = mods["decode"]
    argmax = lambda keys, probs: jnp.argmax(probs, -1).astype(jnp.int32)
    dummy_keys = lambda row_keys, *f: jax.vmap(jax.random.wrap_key_data)(row_keys)
    half = lambda row_keys, length, k, gamma: jnp.full((row_keys.shape[0], k, gamma), 0.5)
    swaps = dict(
        sample_rows=argmax,
        sample_rows_u=lambda u, probs: argmax(None, probs),
        fold_keys=dummy_keys,
        _draft_uniforms=half,
        draft_uniforms=half,
    )
    # The drafting step lives in engine/drafting.py since twins (in decode before).
    try:
        drafting = importlib.import_module(f"{mods['pkg']}.engine.drafting")
    except ImportError:
        drafting = None
    patches = [
        _Patch(module, **{k: v for k, v in swaps.items() if hasattr(module, k)})
        for module in (decode, drafting)
        if module is not None
    ]
    rules = mods["rules"]
    if hasattr(rules, "sample"):
        patches.append(_Patch(rules, sample=lambda key, p: jnp.argmax(p, -1).astype(jnp.int32)))
    uniform = lambda key, shape=(), dtype=jnp.float32, *a, **k: jnp.full(shape, 0.5, dtype)
    patches.append(_Patch(jax.random, uniform=uniform))
    return patches


def variants(mods):
    decode = mods["decode"]
    full = decode.speculative_round

    def with_patches(patches_fn):
        def round_fn(*a, **k):
            ps = patches_fn()
            for p in ps:
                p.__enter__()
            try:
                return full(*a, **k)
            finally:
                for p in reversed(ps):
                    p.__exit__()

        return round_fn

    def no_counters():
        # The round's counter update: `count_round` (from engine.state), `_count` before.
        name = "count_round" if hasattr(decode, "count_round") else "_count"
        return [_Patch(decode, **{name: lambda c, *a, **k: c})]

    # The scratch rounds below take the loop, its inputs and the state (`decode.SpecLoop`,
    # `decode.RoundInputs`); `positional` gives them the round's signature, as the loop
    # of experiments/profile_round.py calls it.
    positional = decode.positional
    return {
        "full": full,
        "argmax": with_patches(lambda: _argmax_patches(mods)),
        "no_counters": with_patches(no_counters),
        "argmax_no_counters": with_patches(lambda: _argmax_patches(mods) + no_counters()),
        "skeleton": positional(functools.partial(skeleton_round, mods)),
        "verifier_only": positional(functools.partial(verifier_only_round, mods, None)),
        "verifier_1tok": positional(functools.partial(verifier_only_round, mods, 1)),
    }


def verifier_only_round(mods, width, loop, inputs, state):
    """The verifier's block forward alone in the loop (no drafter, zero drafts, one token
    committed per round by argmax): what the round's verifier forward costs in place,
    against T_score measured alone. `width` None: the round's γ + 1 tokens; 1: an AR step."""
    api = mods["api"]
    argmax = getattr(mods["streams"], "argmax_first", lambda x: jnp.argmax(x, -1))
    gamma = loop.drafters[0].own_gamma(loop.cfg.gamma)
    t = gamma + 1 if width is None else width
    b = state.tokens.shape[0]
    length = state.length
    root = jnp.take_along_axis(state.tokens, (length - 1)[:, None], axis=1)
    block = jnp.concatenate([root, jnp.zeros((b, t - 1), jnp.int32)], 1)
    pos = (length - 1)[:, None] + jnp.arange(t)[None]
    v_logits, vcache = loop.verifier.forward(
        inputs.v_params, state.vcache, block, pos, api.causal_block_mask(b, t)
    )
    tok = argmax(v_logits[:, 0]).astype(jnp.int32)
    live = ~state.done
    tokens = jax.vmap(lambda r, x, i, w: jnp.where(w, r.at[i].set(x), r))(
        state.tokens, tok, length, live
    )
    new_len = length + live
    done = state.done | (new_len - state.start >= inputs.max_new)
    return state.replace(
        tokens=tokens,
        length=new_len,
        done=done,
        vcache=loop.verifier.advance(vcache, live.astype(jnp.int32)),
        counters=state.counters.replace(rounds=state.counters.rounds + live),
    )


def skeleton_round(mods, loop, inputs, state):
    """The round's forwards and cache bookkeeping only: greedy drafting, the verifier's
    block, commit the matching prefix and the verifier's argmax (no sampling, no rule, no
    counters). A floor for what a round must cost with this loop structure."""
    decode, api = mods["decode"], mods["api"]
    argmax = getattr(mods["streams"], "argmax_first", lambda x: jnp.argmax(x, -1))
    cfg, verifier, max_new = loop.cfg, loop.verifier, inputs.max_new
    spec, data = loop.drafters[0], inputs.d_data[0]
    gamma = spec.own_gamma(cfg.gamma)
    b = state.tokens.shape[0]
    length = state.length
    cache, logits, synced, caught = decode.consume(
        spec, data, state.dcaches[0], state.dlogits[0], state.tokens, state.dsynced[0], length, 2
    )
    base = cache.length

    def step(c, _):
        cache, logits = c
        x = argmax(logits).astype(jnp.int32)
        nl, cache = spec.lm.forward(
            data.params, cache, x[:, None], cache.length[:, None], api.causal_block_mask(b, 1)
        )
        return (spec.lm.advance(cache, jnp.ones((b,), jnp.int32)), nl[:, 0]), x

    (cache, logits), xs = jax.lax.scan(step, (cache, logits), None, length=gamma - 1)
    xs = jnp.concatenate([xs, argmax(logits).astype(jnp.int32)[None]], 0).T
    root = jnp.take_along_axis(state.tokens, (length - 1)[:, None], axis=1)
    block = jnp.concatenate([root, xs], 1)
    pos = (length - 1)[:, None] + jnp.arange(gamma + 1)[None]
    v_logits, vcache = verifier.forward(
        inputs.v_params, state.vcache, block, pos, api.causal_block_mask(b, gamma + 1)
    )
    target = argmax(v_logits).astype(jnp.int32)  # [B, γ+1]
    n = jnp.sum(jnp.cumprod((xs == target[:, :gamma]).astype(jnp.int32), 1), 1)
    live = ~state.done
    budget = round_budget_fn(decode)(cfg, state, max_new, gamma)
    n_commit = jnp.where(live, jnp.minimum(n + 1, budget), 0)
    idx = jnp.arange(gamma + 1)
    new = jnp.where(
        idx[None] < n[:, None],
        jnp.pad(xs, ((0, 0), (0, 1))),
        jnp.take_along_axis(target, n[:, None], 1),
    )

    def write(row, new, at, cnt):
        old = jax.lax.dynamic_slice(row, (at,), (gamma + 1,))
        return jax.lax.dynamic_update_slice(row, jnp.where(idx < cnt, new, old), (at,))

    tokens = jax.vmap(write)(state.tokens, new, length, n_commit)
    vcache = verifier.advance(vcache, n_commit)
    keep = jnp.where(live & caught, jnp.minimum(jnp.minimum(n, n_commit), gamma - 1), 0)
    dcache = spec.lm.rollback(cache, base + keep)
    new_len = length + n_commit
    done = state.done | (new_len - state.start >= max_new)
    return state.replace(
        tokens=tokens,
        length=new_len,
        done=done,
        vcache=vcache,
        dcaches=(dcache,),
        dsynced=jnp.where(caught, length + keep, synced)[None],
        dlogits=(logits,),
        counters=state.counters.replace(rounds=state.counters.rounds + live),
    )


def catch_up(mods, cfg, spec, data, carry, k=0):
    """Drafter k fed the committed tokens it has not read, γ + 1 at a time."""
    gamma = cfg.gamma if spec.gamma is None else spec.gamma

    def behind(c):
        return jnp.any(c[2] < carry.length)

    def feed(c):
        cache, logits, synced = c
        cache, logits, synced, _ = mods["decode"].consume(
            spec, data, cache, logits, carry.tokens, synced, carry.length, gamma + 1
        )
        return cache, logits, synced

    c = jax.lax.while_loop(behind, feed, (carry.dcaches[k], carry.dlogits[k], carry.dsynced[k]))
    swap = lambda xs, x: tuple(x if i == k else y for i, y in enumerate(xs))  # noqa: E731
    return carry.replace(
        dcaches=swap(carry.dcaches, c[0]),
        dlogits=swap(carry.dlogits, c[1]),
        dsynced=carry.dsynced.at[k].set(c[2]),
    )


class Forward:
    """A `width`-token forward at batch `batch` over `context` cached tokens in a cache of
    `capacity` slots, `reps` times in a jitted `lax.scan`: benchmark.py's measurement
    (`timing.forward_timer`: the cache carried, written in place, its length not advanced),
    here also with the process CPU time."""

    def __init__(self, lm, params, batch, width, context, capacity, reps=32):
        timer = forward_timer(lm, params, batch, width, context, capacity, reps)
        self.exe, self.args, self.reps = timer.executable, timer.args, reps

    def run(self):
        t0, c0 = time.perf_counter(), time.process_time()
        jax.block_until_ready(self.exe(*self.args))
        return ((time.perf_counter() - t0) / self.reps, (time.process_time() - c0) / self.reps)


# ----------------------------------------------------------------------------------------
# Whole calls, interleaved across packages
# ----------------------------------------------------------------------------------------


def end_to_end(loaded, pkgs, run, batch, gamma, t_step, t_score, t_draft) -> list:
    """benchmark.py's measurement for each package, interleaved: tokens/s of whole
    `speculative_generate` and `autoregressive_generate` calls (prefill included, compiled
    seconds only, a warm-up first, medians of `run.repeats`), spec/AR and measured /
    hardware-aware (E · T_step / (γ · T_draft + T_score), the forwards given).

    ``loaded[pkg]``: (modules, full deployment, prompt texts); ``run``: the call's settings
    (``members`` the chains' drafters, ``engine_config(mods, gamma, max_new)``,
    ``new_tokens``, ``temperature``, ``bucket``, ``repeats``)."""
    import statistics  # pylint: disable=import-outside-toplevel

    runs = {}
    for pkg in pkgs:
        mods, full, texts_all = loaded[pkg]
        gen = mods["gen"]
        dep = full.subset(run.members)
        texts = (texts_all * (batch // len(texts_all) + 1))[:batch]
        v = [full.encode(t) for t in texts]
        d = [[enc(t) for t in texts] for enc in dep.drafter_encode]
        keys = gen.row_keys_for(0, batch)
        cfg = run.engine_config(mods, gamma, run.new_tokens)
        common = dict(bucket=run.bucket)
        runs[(pkg, "spec")] = lambda gen=gen, cfg=cfg, dep=dep, v=v, d=d, k=keys: (
            gen.speculative_generate(
                cfg, dep.verifier, dep.v_params, dep.drafters, dep.d_data, v, d, k, **common
            )
        )
        runs[(pkg, "ar")] = lambda ar_mod=mods["ar"], dep=dep, v=v, k=keys: (
            ar_mod.autoregressive_generate(
                dep.verifier,
                dep.v_params,
                v,
                k,
                temperature=run.temperature,
                max_new_tokens=run.new_tokens,
                **common,
            )
        )
    tps = collections.defaultdict(list)
    counters = {}
    for rep in range(run.repeats + 1):
        for key, fn in runs.items():
            res = fn()
            if rep:
                tps[key].append(float((res.length - res.start).sum()) / res.seconds)
            if key[1] == "spec":
                counters[key[0]] = res.counters
    rows = []
    for pkg in pkgs:
        c = counters[pkg]
        per_round = float(metrics.mean_accepted_length(c.committed.sum(), c.rounds.sum()))
        alpha = float(metrics.acceptance(c.own_accepted_at.sum(), c.own_reached_at.sum()))
        hw = float(metrics.hardware_aware_speedup(per_round, t_step, t_draft, t_score, gamma))
        sp, ar = statistics.median(tps[(pkg, "spec")]), statistics.median(tps[(pkg, "ar")])
        rows.append(
            dict(
                package=pkg,
                variant="e2e",
                batch=batch,
                gamma=gamma,
                spec_tokens_per_s=sp,
                ar_tokens_per_s=ar,
                spec_over_ar=sp / ar,
                tokens_per_round=per_round,
                alpha=alpha,
                hardware_aware=hw,
                measured_over_hardware_aware=sp / ar / hw,
            )
        )
        print(
            f"  {pkg:11} e2e: AR {ar:8.1f} tok/s, spec {sp:8.1f} tok/s, spec/AR "
            f"{sp / ar:.3f}; α {alpha:.3f}, E {per_round:.2f}, hardware-aware {hw:.3f}, "
            f"measured/hw {sp / ar / hw:.3f}",
            flush=True,
        )
    return rows
