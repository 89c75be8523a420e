"""Two processes x 4 CPU devices joined by `jax.distributed` on 127.0.0.1 (loopback only):
a sharded speculative generate, the baseline and a tiny sweep give the tokens of one
process alone (experiments/distributed_generate.py; README, "Multi-host").

Bounded: every process is killed after TIMEOUT seconds. Cold (empty compilation cache)
the pair needs ~25 s of CPU each; its wall time depends on what else the 2 cores run.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT = 240


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow  # ~45 s idle, ~80 s under load: two jax processes; `make test-all`
def test_two_processes_generate_like_one(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}  # 4 devices each, not 8
    env["JAX_PLATFORMS"] = "cpu"
    env["SPECJAX_COMPILE_CACHE"] = ""  # both processes compile cold: no skew (see the script)
    port = _free_port()
    procs = []
    for pid in range(2):
        cmd = [
            sys.executable,
            str(ROOT / "experiments" / "distributed_generate.py"),
            f"--coordinator=127.0.0.1:{port}",
            "--num_processes=2",
            f"--process_id={pid}",
            "--local_devices=4",
            "--rules=fsdp_tp",
            "--model_axis=2",
            f"--out={tmp_path / f'p{pid}.json'}",
        ]
        log = open(tmp_path / f"p{pid}.log", "w")
        procs.append(
            (
                subprocess.Popen(
                    cmd,
                    env=env,
                    cwd=ROOT,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                ),
                log,
            )
        )
    try:
        for p, _ in procs:
            p.wait(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        pytest.fail(f"distributed generate did not finish in {TIMEOUT} s")
    finally:
        for p, log in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
            log.close()
    for pid, (p, _) in enumerate(procs):
        tail = (tmp_path / f"p{pid}.log").read_text()[-2000:]
        assert p.returncode == 0, f"process {pid} failed:\n{tail}"
    a, b = (json.loads((tmp_path / f"p{i}.json").read_text()) for i in range(2))
    assert (a["processes"], a["devices"], a["local_devices"]) == (2, 8, 4)
    assert a["sharded_over_processes"] == 2  # parameters live on both processes
    assert a["mesh"] == {"data": 4, "model": 2}  # FSDP's 'data' axis spans the processes
    assert a["local_param_fraction"] < 0.75 and b["local_param_fraction"] < 0.75
    assert a["sweep"] == b["sweep"] and a["autoregressive"] == b["autoregressive"]
    assert a["sweep"]["1.0"] == a["reference"]["spec"]
    assert a["autoregressive"] == a["reference"]["autoregressive"]
    assert a["sweep"]["1.0"] != a["sweep"]["0.5"]  # the sweep's cells differ
