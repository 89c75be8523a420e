"""Bad input to the experiments/ scripts: a non-zero exit, the error on one line naming the
flag, no traceback, and nothing written before the error (each script's run itself is in
tests/test_experiment_scripts.py; the `specjax` CLI's bad inputs in test_bad_inputs.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run(script: str, *args: str) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [sys.executable, f"experiments/{script}", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    return proc


def _last_line(proc) -> str:
    return [line for line in proc.stderr.splitlines() if line.strip()][-1]


def test_loop_alpha_refuses_a_missing_file_in_one_line(tmp_path):
    proc = _run("loop_alpha.py", f"--out={tmp_path}", "--drafters=x=/no/file.npz")
    assert "--drafters: got 'x=/no/file.npz'" in _last_line(proc)


def test_loop_alpha_refuses_an_unknown_rule_in_one_line(tmp_path):
    proc = _run("loop_alpha.py", f"--out={tmp_path}", "--rules=token_tree")
    assert "--rules: one or more of rejection, block_verification" in proc.stderr


def test_benchmark_real_refuses_an_unknown_chain_rule_in_one_line(tmp_path):
    out = tmp_path / "run"
    proc = _run("benchmark_real.py", "--chain_rules=token_tree", f"--out={out}")
    assert "--chain_rules: one or more of rejection, block_verification" in proc.stderr
    assert not out.exists()


@pytest.mark.parametrize(
    "args, flag",
    [
        (["--stage=train"], "--stage: got 'train'"),
        (["--stage=generate,train", "--init_from=/nonexistent"], "--init_from: got '/nonexistent'"),
    ],
)
def test_train_drafters_refuses_missing_inputs_in_one_line(tmp_path, args, flag):
    out = tmp_path / "run"
    proc = _run("train_drafters.py", *args, "--domains=code", f"--out={out}")
    assert proc.returncode == 2
    assert _last_line(proc).startswith("train_drafters: error: " + flag)
    assert not out.exists()  # nothing written before the error


@pytest.mark.parametrize(
    "script, arg, field",
    [
        ("benchmark_real.py", "--dtype=float16", "--dtype: 'float16' is not allowed"),
        (
            "benchmark_real.py",
            "--dtypes=float32,bfloat16:sideways",
            "--dtypes: 'bfloat16:sideways'",
        ),
        ("compare_layouts.py", "--layouts=float32:tilted", "--layouts: 'float32:tilted'"),
    ],
)
def test_real_model_scripts_refuse_bad_layouts_in_one_line(tmp_path, script, arg, field):
    out = tmp_path / "run"
    proc = _run(script, arg, f"--out={out}")
    errors = [line for line in proc.stderr.splitlines() if field in line]
    assert len(errors) == 1 and "allowed: float32 or bfloat16" in errors[0], proc.stderr[-2000:]
    assert not out.exists()  # nothing written before the error


def test_compare_layouts_refuses_a_cache_too_small_in_one_line(tmp_path):
    out = tmp_path / "run"
    proc = _run("compare_layouts.py", "--capacity=50", f"--out={out}")
    assert proc.returncode == 2
    assert _last_line(proc).startswith(
        "compare_layouts: error: --capacity: got 50, allowed: 0 or >= "
    )
    assert not out.exists()


def test_profile_round_refuses_an_unknown_option_set_in_one_line(tmp_path):
    proc = _run("profile_round.py", f"--out={tmp_path}", "--compiler_options=ynn_all,fast")
    assert "--compiler_options: allowed names are single_thread" in proc.stderr
    assert not any(tmp_path.iterdir())


def test_loop_alpha_refuses_predict_at_another_temperature(tmp_path):
    proc = _run("loop_alpha.py", f"--out={tmp_path}", "--predict", "--tau=0")
    assert _last_line(proc).endswith("--tau: got 0.0, allowed: 1.0 with --predict")
    assert not any(tmp_path.iterdir())


# ----------------------------------------------------------------------------------------
# Issue 51: every script's flags checked in one place before anything is written
# (`specjax.runner.script_flags.run`): one line `<script>: error: <flag>: got ...`, exit 2.
# ----------------------------------------------------------------------------------------


def _damaged_npz(folder: Path, name: str, like: str) -> Path:
    """``folder/name`` (.npz, truncated) with the intact ``.json`` of shipped drafter `like`."""
    from specjax.models import real_zoo

    folder.mkdir(parents=True, exist_ok=True)
    src = real_zoo.DRAFTER_DIR / f"{like}.npz"
    dst = folder / name
    dst.write_bytes(src.read_bytes()[:4096])
    dst.with_suffix(".json").write_text(src.with_suffix(".json").read_text())
    return dst


def _one_line(proc, script: str, *needles: str) -> str:
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and proc.stdout == "", proc.stderr[-2000:]
    assert lines[0].startswith(f"{script}: error: "), lines
    for n in needles:
        assert n in lines[0], (n, lines[0])
    return lines[0]


@pytest.mark.parametrize(
    "script, args, needles",
    [
        ("benchmark_real", ["--drafters=nosuch"], ["--drafters: got 'nosuch'", "lookup"]),
        ("benchmark_real", ["--gammas=0"], ["--gammas: got '0'", "integers in [1, 64]"]),
        ("benchmark_real", ["--taus=nan"], ["--taus: got 'nan'", "finite numbers"]),
        ("benchmark_real", ["--new_tokens=0"], ["--new_tokens: got 0"]),
        ("benchmark_real", ["--batches=-1"], ["--batches: got '-1'"]),
        ("benchmark_real", ["--parts=nope"], ["--parts: got 'nope'", "machine, ratio"]),
        ("benchmark_real", ["--drafter_dir=/nonexistent"], ["--drafter_dir: got '/nonexistent'"]),
        ("benchmark_real", ["positional"], ["arguments: got 'positional'"]),
        ("train_drafters", ["--prompts=-1"], ["--prompts: got -1"]),
        ("train_drafters", ["--domains=math"], ["--domains: got 'math'"]),
        ("train_drafters", ["--temperature=nan"], ["--temperature: got nan", "finite"]),
        ("train_drafters", ["--dtype=float16"], ["--dtype: got 'float16'", "'bfloat16'"]),
        ("train_eagle", ["--dtype=float16"], ["--dtype: got 'float16'"]),
        ("train_eagle", ["--learning_rate=nan"], ["--learning_rate: got nan"]),
        ("loop_alpha", ["--drafters=nosuch"], ["--drafters: got 'nosuch'", "label=FILE"]),
        ("loop_alpha", ["--tau=nan"], ["--tau: got nan"]),
        ("loop_alpha", ["--seeds=x"], ["--seeds: got 'x'"]),
        ("compare_layouts", ["--rounds=0"], ["--rounds: got 0"]),
    ],
)
def test_bad_flags_are_one_line_and_nothing_is_written(tmp_path, script, args, needles):
    out = tmp_path / "run"
    proc = _run(f"{script}.py", *args, f"--out={out}")
    _one_line(proc, script, *needles)
    assert not out.exists()


@pytest.mark.parametrize("script", ["benchmark_real", "train_drafters", "loop_alpha"])
def test_an_out_that_is_a_file_is_refused_first(tmp_path, script):
    f = tmp_path / "file"
    f.write_text("x")
    for out in (f, f / "sub"):
        proc = _run(f"{script}.py", f"--out={out}")
        _one_line(proc, script, f"--out: got '{out}'", "is not a directory")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


def _corrupt_inputs(tmp_path):
    bad = _damaged_npz(tmp_path / "dd", "drafter_code.npz", "code")
    eagle = _damaged_npz(tmp_path / "ee", "eagle.npz", "eagle")
    return bad, eagle, sorted(tmp_path.rglob("*"))


def test_corrupt_drafter_files_are_one_line_naming_the_file(tmp_path):
    out = tmp_path / "run"
    bad, eagle, before = _corrupt_inputs(tmp_path)
    proc = _run("benchmark_real.py", f"--drafter_dir={bad.parent}", f"--out={out}")
    _one_line(proc, "benchmark_real", f"--drafter_dir: got '{bad.parent}'", "not a readable .npz")
    proc = _run("benchmark_real.py", f"--eagle={eagle}", "--drafters=eagle", f"--out={out}")
    _one_line(proc, "benchmark_real", f"--eagle: got '{eagle}'", "not a readable .npz")
    assert sorted(tmp_path.rglob("*")) == before  # nothing written


def test_corrupt_feature_drafters_are_one_line_naming_the_file(tmp_path):
    out = tmp_path / "run"
    _, eagle, before = _corrupt_inputs(tmp_path)
    proc = _run("loop_alpha.py", f"--drafters=x={eagle}", f"--out={out}")
    _one_line(proc, "loop_alpha", f"--drafters: got 'x={eagle}'", str(eagle))
    proc = _run("train_eagle.py", "--stage=train", f"--init_from={eagle}", f"--out={out}")
    _one_line(proc, "train_eagle", f"--init_from: got '{eagle}'", "not a readable .npz")
    assert sorted(tmp_path.rglob("*")) == before


def test_corrupt_training_inputs_are_one_line_naming_the_file(tmp_path):
    out = tmp_path / "run"
    bad, _, _ = _corrupt_inputs(tmp_path)
    gen = _damaged_npz(out, "gen_code.npz", "code")  # a generation file that does not read
    before = sorted(tmp_path.rglob("*"))
    proc = _run("train_drafters.py", "--stage=train", "--domains=code", f"--out={out}")
    _one_line(proc, "train_drafters", f"--out: got '{out}'", f"{gen}: not a readable .npz")
    (out / "gen_code.npz").unlink()
    (out / "gen_code.json").unlink()
    proc = _run(
        "train_drafters.py",
        "--stage=generate,train",
        "--domains=code",
        f"--init_from={bad.parent}",
        f"--out={out}",
    )
    _one_line(proc, "train_drafters", f"--init_from: got '{bad.parent}'", "not a readable .npz")
    assert sorted(tmp_path.rglob("*")) == [p for p in before if p.parent != out or p.suffix == ""]


def test_feature_layers_beyond_the_verifier_are_refused_before_it_loads(tmp_path):
    out = tmp_path / "run"
    proc = _run("train_eagle.py", "--stage=train", "--feature_layers=99", f"--out={out}")
    _one_line(proc, "train_eagle", "--feature_layers: got '99'", "[0, 30]")
    assert not out.exists()


@pytest.mark.parametrize(
    "name, value, needle",
    [
        ("SPECJAX_MAX_PROGRAMS", "-5", "an integer in [1, 4096]"),
        ("SPECJAX_WARM_PROGRAMS", "maybe", "one of 0, 1, true"),
        ("SPECJAX_DATA_CACHE", "{file}", "is not a directory"),
        ("SPECJAX_ZOO", "{file}", "is not a directory"),
    ],
)
def test_a_bad_environment_is_one_line_naming_the_variable(tmp_path, name, value, needle):
    f = tmp_path / "file"
    f.write_text("x")
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "experiments/loop_alpha.py", f"--out={out}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, name: value.format(file=f)},
    )
    _one_line(proc, "loop_alpha", f"{name}: got", needle)
    assert not out.exists()


def test_a_library_import_never_reads_the_environment(monkeypatch):
    """A bad value is refused where it is used, naming the variable (the modules read
    no variable when imported)."""
    from specjax.engine import programs
    from specjax.errors import ConfigError
    from specjax.runtime import debug

    monkeypatch.setenv("SPECJAX_MAX_PROGRAMS", "abc")
    monkeypatch.setenv("SPECJAX_CHECKS", "maybe")
    monkeypatch.setattr(programs, "_MAX_PROGRAMS", None)
    with pytest.raises(ConfigError, match=r"^SPECJAX_MAX_PROGRAMS: got 'abc', allowed: an int"):
        programs._max_programs()
    monkeypatch.setattr(debug, "_ENABLED", None)
    with pytest.raises(ConfigError, match=r"^SPECJAX_CHECKS: got 'maybe'"):
        debug.enabled()
    monkeypatch.setattr(debug, "_ENABLED", None)
    monkeypatch.delenv("SPECJAX_CHECKS")
    monkeypatch.delenv("SPECJAX_MAX_PROGRAMS")
    assert programs._max_programs() == 128 and debug.enabled() is False


# ----------------------------------------------------------------------------------------
# The rest of experiments/ on `script_flags.run` (#51): one bad flag each, refused before
# anything is loaded or written.
# ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "script, args, needles",
    [
        ("benchmark", ["--gammas=0"], ["--gammas: got '0'", "integers in [1, 64]"]),
        ("benchmark", ["--drafters=nosuch"], ["--drafters: got 'nosuch'", "prose512"]),
        ("benchmark", ["--zoo=/nonexistent"], ["--zoo: got '/nonexistent'", "no such directory"]),
        ("benchmark_batching", ["--modes=ar,nope"], ["--modes: got 'ar,nope'", "ar, spec"]),
        ("benchmark_batching", ["--new_tokens_max=3"], ["--new_tokens_max: got 3", "[16, 256]"]),
        ("benchmark_peer", ["--drafter=reasoning"], ["--drafter: got 'reasoning'", "code, prose"]),
        ("benchmark_plans", ["--plan_steps=64"], ["--plan_steps / --max_step_tokens / --gamma"]),
        ("cache_read", ["--capacities=16"], ["--capacities: got '16'", "[96, 512]"]),
        ("distributed_generate", ["--rules=nope"], ["--rules: got 'nope'", "'fsdp_tp'"]),
        ("drafter_alpha", ["--features=x=/nonexistent"], ["--features: got 'x=/nonexistent'"]),
        ("drafter_alpha", ["--features=x=/n", "--temperatures=0"], ["--temperatures: got '0'"]),
        ("evaluate_zoo", ["--window=1"], ["--window: got 1", "[2, 512]"]),
        ("profile_round", ["--drafter=code+prose", "--rule=rejection"], ["--rule: got 'rej"]),
        ("profile_round", ["--set_attr=models.nosuch.X=1"], ["--set_attr: got 'models.nos"]),
        ("score_ratio", ["--sizes=320:4"], ["--sizes: got '320:4'"]),
        ("score_ratio", ["--alpha=nan"], ["--alpha: got nan", "[0.0, 1.0]"]),
        ("train_zoo", ["--budget_scale=0"], ["--budget_scale: got 0.0", "(0.0, 1000.0]"]),
        ("train_zoo", ["--reuse=/nonexistent"], ["--reuse: got '/nonexistent'"]),
    ],
)
def test_every_script_refuses_a_bad_flag_in_one_line(tmp_path, script, args, needles):
    out = tmp_path / "run" / ("p0.json" if script == "distributed_generate" else "")
    extra = [f"--workdir={tmp_path / 'work'}"] if script == "train_zoo" else []
    proc = _run(f"{script}.py", *args, *extra, f"--out={out}")
    _one_line(proc, script, *needles)
    assert not any(tmp_path.iterdir())  # nothing written, not even --out's folder


@pytest.mark.parametrize(
    "script", ["benchmark", "cache_read", "evaluate_zoo", "score_ratio", "train_zoo"]
)
def test_a_folder_out_that_is_a_file_is_refused_first(tmp_path, script):
    f = tmp_path / "file"
    f.write_text("x")
    proc = _run(f"{script}.py", f"--out={f}")
    _one_line(proc, script, f"--out: got '{f}'", "is not a directory")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


def test_distributed_generate_refuses_a_folder_for_its_out_file(tmp_path):
    proc = _run("distributed_generate.py", f"--out={tmp_path}")
    _one_line(proc, "distributed_generate", f"--out: got '{tmp_path}'", "is a folder")
    assert not any(tmp_path.iterdir())


def test_train_zoo_refuses_an_out_that_holds_its_workdir(tmp_path):
    out = tmp_path / "zoo"
    proc = _run("train_zoo.py", f"--out={out}", f"--workdir={out / 'work'}")
    _one_line(proc, "train_zoo", "--out / --workdir: got", "neither holds --workdir")
    assert not any(tmp_path.iterdir())


def test_a_bad_spec_zoo_names_the_variable(tmp_path):
    proc = subprocess.run(
        [sys.executable, "experiments/evaluate_zoo.py", f"--out={tmp_path / 'run'}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "SPECJAX_ZOO": str(tmp_path)},
    )
    _one_line(proc, "evaluate_zoo", f"SPECJAX_ZOO: got '{tmp_path}'", "missing manifest.json")
    assert not any(tmp_path.iterdir())


def test_final_writes_leave_the_old_file_when_interrupted(tmp_path, monkeypatch):
    """The results writers go through `results.atomic_write_*`: a write that fails before
    its rename (here fsync, as a kill or a full disk would) leaves the previous file whole
    and no temporary beside it."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    from specjax.runner import plots_kit, results, seed_table

    png, md = tmp_path / "plot.png", tmp_path / "page.md"
    png.write_bytes(b"old png")
    md.write_text("old page")

    def torn(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(results.os, "fsync", torn)
    fig = Figure()
    fig.add_subplot().plot([0, 1], [1, 0])
    with pytest.raises(OSError):
        plots_kit._save(fig, png)
    with pytest.raises(OSError):
        seed_table._atomic(md, "new page")
    assert png.read_bytes() == b"old png" and md.read_text() == "old page"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["page.md", "plot.png"]
    monkeypatch.undo()
    assert plots_kit._save(fig, png) and png.read_bytes().startswith(b"\x89PNG")
    seed_table._atomic(md, "new page")
    assert md.read_text() == "new page"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["page.md", "plot.png"]


def _jax_sees_only_the_cpu(env: dict) -> bool:
    """Whether JAX, started under `env`, finds no GPU or TPU (its C++ noise discarded)."""
    probe = subprocess.run(
        [sys.executable, "-c", "import jax; print(jax.default_backend())"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return probe.stdout.strip() == "cpu"


@pytest.mark.parametrize("platforms", ["cpu", None], ids=["JAX_PLATFORMS=cpu", "unset"])
def test_require_accelerator_without_one_is_one_line(tmp_path, platforms):
    """benchmark.py --require_accelerator where JAX sees only the CPU: one line, exit 2,
    nothing written; unset, JAX also tries libtpu, whose C++ warnings (no TPU chip) must
    not precede the line."""
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
    if platforms is not None:
        env["JAX_PLATFORMS"] = platforms
    elif not _jax_sees_only_the_cpu(env):
        pytest.skip("this machine has an accelerator: --require_accelerator passes")
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "experiments/benchmark.py", "--require_accelerator", f"--out={out}"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    _one_line(
        proc,
        "benchmark",
        "--require_accelerator: got True",
        "false where JAX sees only the CPU",
        f"JAX_PLATFORMS={platforms or 'unset'}",
    )
    assert not any(tmp_path.iterdir())


def test_held_stderr_is_dropped_or_released(capfd):
    """`script_flags.StderrHeld`: what C++ writes to file descriptor 2 inside is dropped
    unless `release` is called (the check passed)."""
    from specjax.runner.script_flags import StderrHeld  # pylint: disable=import-outside-toplevel

    with StderrHeld():
        os.write(2, b"plugin noise\n")
    assert capfd.readouterr().err == ""
    held = StderrHeld()
    with held:
        os.write(2, b"plugin noise\n")
    assert capfd.readouterr().err == ""
    held.release()
    assert capfd.readouterr().err == "plugin noise\n"
