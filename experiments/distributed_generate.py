r"""Sharded speculative generation across processes (multi-controller JAX).

Every process runs this same program; `jax.distributed.initialize` joins them into one
runtime whose mesh spans every process's devices. On CPU, for a test on one machine
(loopback only, 2 processes x 4 CPU devices)::

    python experiments/distributed_generate.py --coordinator=127.0.0.1:12355 \
        --num_processes=2 --process_id=0 --local_devices=4 --out=/tmp/p0.json &
    python experiments/distributed_generate.py --coordinator=127.0.0.1:12355 \
        --num_processes=2 --process_id=1 --local_devices=4 --out=/tmp/p1.json

On a Cloud TPU pod slice, run it on every worker with no coordinator flags (the TPU
environment supplies them): ``gcloud compute tpus tpu-vm ssh NAME --worker=all
--command="python experiments/distributed_generate.py --out=/tmp/out.json"``.

What it does: a verifier and two drafters (one of another vocabulary) as small
transformers with fixed seeds, parameters placed on a ('data', 'model') mesh over all
processes' devices by a named rule set, then `speculative_generate` and the
autoregressive baseline on a batch of prompts, and a tiny sweep (drafter temperatures,
traced, so the sweep reuses one compiled program). Each
process writes the tokens it got (and, from process 0, the single-process reference
computed on its local devices) to ``--out`` as JSON.
"""

from __future__ import annotations

import dataclasses
import time


def define_flags():
    """The script's flags (defined only when it runs as a script; every process of a pod
    runs the same command line)."""
    from absl import flags  # pylint: disable=import-outside-toplevel

    flags.DEFINE_string("coordinator", None, "host:port of process 0 (None: auto)")
    flags.DEFINE_integer("num_processes", None, "processes in all (None: auto)")
    flags.DEFINE_integer("process_id", None, "this process's index (None: auto)")
    flags.DEFINE_integer("local_devices", 0, "CPU devices per process (0: leave the platform's)")
    flags.DEFINE_string("rules", "fsdp_tp", "a rule set of specjax.runtime.sharding")
    flags.DEFINE_integer("model_axis", 2, "size of the 'model' mesh axis")
    flags.DEFINE_integer("gamma", 3, "draft tokens per round")
    flags.DEFINE_list(
        "temperatures", ["1.0", "0.5"], "the sweep: drafter temperatures (traced: one program)"
    )
    flags.DEFINE_integer("max_new_tokens", 8, "tokens generated per row")
    flags.DEFINE_string("out", None, "the JSON file this process writes")
    flags.mark_flag_as_required("out")


def validate() -> None:
    """Every flag, before anything is joined, loaded or written (`script_flags.run`): a
    `ConfigError` naming the flag, its value and what is allowed."""
    from absl import flags  # pylint: disable=import-outside-toplevel

    from specjax.runner import script_flags as sf  # pylint: disable=import-outside-toplevel
    from specjax.runtime import sharding as shd  # pylint: disable=import-outside-toplevel

    f = flags.FLAGS
    if f.coordinator is not None:
        host, colon, port = f.coordinator.rpartition(":")
        sf.check(
            host and colon and port.isdigit() and 1 <= int(port) <= 65535,
            "--coordinator",
            f.coordinator,
            "host:port, port in [1, 65535]",
        )
    n = None
    if f.num_processes is not None:
        n = sf.integer("--num_processes", f.num_processes, 1, 4096)
    if f.process_id is not None:
        sf.integer("--process_id", f.process_id, 0, None if n is None else n - 1)
    sf.integer("--local_devices", f.local_devices, 0, 1024)
    sf.check(f.rules in shd.RULE_SETS, "--rules", f.rules, list(shd.RULE_SETS))
    axis = sf.integer("--model_axis", f.model_axis, 1, 1024)
    if f.local_devices and n is not None:
        total = f.local_devices * n
        sf.check(
            total % axis == 0,
            "--model_axis",
            axis,
            f"a divisor of the devices in all ({n} × {f.local_devices} = {total})",
        )
    sf.integer("--gamma", f.gamma, 1, 64)
    sf.numbers("--temperatures", f.temperatures, 0.0, 100.0)
    sf.integer("--max_new_tokens", f.max_new_tokens, 1, 256)


def _initialize(args) -> None:
    """Joins this process to the others (CPU devices and gloo collectives when
    --local_devices is set)."""
    import jax  # pylint: disable=import-outside-toplevel

    if args.local_devices:
        jax.config.update("jax_platforms", "cpu")
        jax.config.update("jax_num_cpu_devices", args.local_devices)
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        coordinator_address=args.coordinator,
        num_processes=args.num_processes,
        process_id=args.process_id,
        initialization_timeout=60,
    )


@dataclasses.dataclass
class _Job:
    """What every generate call shares: the config, the prompts, the keys and the sharded
    deployment."""

    cfg: object
    prompts: list
    d_prompts: list
    keys: object
    sdep: object
    max_new_tokens: int

    def speculative(self, d, temperature):
        """Tokens and accepted counts of `speculative_generate` on deployment `d` with every
        drafter at `temperature` (processes start together on the sharded deployment)."""
        import jax  # pylint: disable=import-outside-toplevel
        from jax.experimental import multihost_utils  # pylint: disable=import-outside-toplevel

        from specjax.engine import generate as gen  # pylint: disable=import-outside-toplevel

        d = d.with_temperatures([temperature] * len(d.drafters))
        if jax.process_count() > 1 and d.v_params is self.sdep.v_params:
            multihost_utils.sync_global_devices(f"generate tau={temperature}")
        spec = gen.speculative_generate(
            self.cfg,
            d.verifier,
            d.v_params,
            d.drafters,
            d.d_data,
            self.prompts,
            self.d_prompts,
            self.keys,
        )
        return spec.tokens.tolist(), spec.counters.accepted.tolist()

    def autoregressive(self, d):
        """Tokens of `autoregressive_generate` (τ = 1) on deployment `d`."""
        from specjax.engine.autoregressive import (  # pylint: disable=import-outside-toplevel
            autoregressive_generate,
        )

        return autoregressive_generate(
            d.verifier,
            d.v_params,
            self.prompts,
            self.keys,
            temperature=1.0,
            max_new_tokens=self.max_new_tokens,
        ).tokens.tolist()


def _header(args, mesh, sdep) -> dict:
    """The output's description of this process, the mesh and how the parameters are spread."""
    import jax  # pylint: disable=import-outside-toplevel

    return {
        "process": jax.process_index(),
        "processes": jax.process_count(),
        "devices": jax.device_count(),
        "local_devices": jax.local_device_count(),
        "mesh": dict(mesh.shape),
        "rules": args.rules,
        "sharded_over_processes": len(
            {dev.process_index for dev in sdep.v_params["embed"].sharding.device_set}
        ),
        "local_param_fraction": _local_fraction(sdep.v_params),
    }


def main(argv) -> int:
    del argv
    from absl import flags  # pylint: disable=import-outside-toplevel

    args = flags.FLAGS  # checked by `validate`
    t0 = time.time()
    _initialize(args)
    import jax  # pylint: disable=import-outside-toplevel
    from jax.experimental import multihost_utils  # pylint: disable=import-outside-toplevel

    # No persistent compilation cache: a process that found its programs cached would reach
    # the first collective long before the other finished compiling, and gloo gives a
    # peer 30 s to arrive. Both compile cold, and start each call together (barrier).
    from specjax.engine import generate as gen  # pylint: disable=import-outside-toplevel
    from specjax.engine.spec import EngineConfig  # pylint: disable=import-outside-toplevel
    from specjax.runner import provenance  # pylint: disable=import-outside-toplevel
    from specjax.runtime import sharding as shd  # pylint: disable=import-outside-toplevel

    prov = provenance.provenance()
    dep = _deployment()
    texts = ["def f(x):", "In the beginning", "1 + 2 =", "the", "x", "print(", "And", "ok"]
    n = jax.device_count()
    mesh = shd.make_mesh(n // args.model_axis, args.model_axis)
    sdep = shd.shard_deployment(dep, mesh, args.rules)
    timings = {"start": round(time.time() - t0, 2)}
    cfg = EngineConfig(
        gamma=args.gamma,
        rule="token_tree",
        verifier_temperature=1.0,
        n_slots=2,
        max_new_tokens=args.max_new_tokens,
    )
    job = _Job(
        cfg=cfg,
        prompts=[dep.encode(t) for t in texts],
        d_prompts=[[enc(t) for t in texts] for enc in dep.drafter_encode],
        keys=gen.row_keys_for(0, len(texts)),
        sdep=sdep,
        max_new_tokens=args.max_new_tokens,
    )
    out = {**_header(args, mesh, sdep), "sweep": {}, "timings": timings}
    temps = [float(t) for t in args.temperatures]
    for t in temps:  # the tiny sweep
        out["sweep"][str(t)] = job.speculative(sdep, t)
        timings[f"sharded_tau{t}"] = round(time.time() - t0, 2)
    multihost_utils.sync_global_devices("autoregressive")
    out["autoregressive"] = job.autoregressive(sdep)
    timings["sharded_autoregressive"] = round(time.time() - t0, 2)
    if jax.process_index() == 0:
        # The reference: the same deployment unsharded, on this process's first device.
        with jax.default_device(jax.local_devices()[0]):
            ref = _deployment()
            out["reference"] = {
                "spec": job.speculative(ref, temps[0]),
                "autoregressive": job.autoregressive(ref),
            }
        timings["reference"] = round(time.time() - t0, 2)
    out["seconds"] = round(time.time() - t0, 2)
    provenance.write_json(args.out, out, prov, indent=None)
    jax.distributed.shutdown()
    return 0


def _local_fraction(params) -> float:
    """The share of the parameters' elements this process holds (distinct shards only):
    1.0 when every process has a full copy, 1/P when each tensor is split over P processes."""
    import jax  # pylint: disable=import-outside-toplevel

    held = total = 0
    for x in jax.tree.leaves(params):
        total += x.size
        seen = set()
        for s in x.addressable_shards:
            key = tuple((i.start, i.stop) for i in s.index)
            if key not in seen:
                seen.add(key)
                held += s.data.size
    return round(held / total, 4)


def _deployment():
    """The fixed tiny deployment (same on every process: fixed seeds)."""
    from specjax.testing import tiny_transformer_deployment  # pylint: disable=import-outside-toplevel

    return tiny_transformer_deployment()


if __name__ == "__main__":
    from specjax.runner import script_flags

    define_flags()
    script_flags.run(main, validate, "distributed_generate", out="file")
