"""`specjax.atomic` and the writers of the layers below the runner (#51): every file is
written to a hidden temporary beside it, fsynced, then renamed, so a kill or an error
before the rename leaves the old file whole under the real name and no temporary there.

Deterministic: the rename is made to fail (what a kill before it leaves behind), or the
writer is killed (SIGKILL) with half its bytes written."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from specjax import atomic

REPO = Path(__file__).resolve().parent.parent


def _names(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_a_write_replaces_the_file_with_the_umask_s_permissions(tmp_path):
    path = tmp_path / "f.json"
    path.write_text("old")
    atomic.atomic_write_text(path, "new ✓")
    assert path.read_text(encoding="utf-8") == "new ✓"
    umask = os.umask(0o022)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask  # not mkstemp's 0o600
    assert _names(tmp_path) == ["f.json"]


def test_an_error_while_writing_leaves_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / "f.bin"
    path.write_bytes(b"old")
    with pytest.raises(RuntimeError, match="midway"):
        with atomic.atomic_file(path) as f:
            f.write(b"half")
            raise RuntimeError("midway")
    assert path.read_bytes() == b"old" and _names(tmp_path) == ["f.bin"]


_HALF_WRITTEN = r"""
import os, signal, sys
from specjax import atomic
with atomic.atomic_file(sys.argv[1]) as f:
    f.write(b"new bytes, the first half")
    f.flush()
    os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_writer_killed_midway_leaves_the_old_file_and_a_hidden_temporary(tmp_path):
    path = tmp_path / "f.bin"
    path.write_bytes(b"old")
    proc = subprocess.run(
        [sys.executable, "-c", _HALF_WRITTEN, str(path)], cwd=REPO, capture_output=True
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert path.read_bytes() == b"old"
    (tmp,) = [n for n in _names(tmp_path) if n != "f.bin"]
    assert tmp.startswith(".f.bin.") and tmp.endswith(".tmp")


# ----------------------------------------------------------------------------------------
# The writers below the runner
# ----------------------------------------------------------------------------------------


def _params_file(path: Path) -> None:
    from specjax.train import checkpoints  # pylint: disable=import-outside-toplevel

    checkpoints.save_params_file(str(path), {"w": np.arange(6, dtype=np.float32)})


def _generated(path: Path) -> None:
    from specjax.train.distill import Generated  # pylint: disable=import-outside-toplevel

    z = np.zeros((2, 3), np.int32)
    Generated(
        z, np.ones(2, np.int32), z, z.astype(bool), z[..., None], z[..., None] * 1.0, 1.0
    ).save(path)


def _features(path: Path) -> None:
    from specjax.train.distill_eagle import Features  # pylint: disable=import-outside-toplevel

    z = np.zeros((2, 3), np.int32)
    Features(z, np.ones(2, np.int32), np.ones(2, np.int32), np.zeros((2, 3, 4), np.float16)).save(
        path
    )


def _safetensors(path: Path) -> None:
    from specjax.models import safetensors_io  # pylint: disable=import-outside-toplevel

    header = {"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}
    safetensors_io.write_file(path, header, [("w", lambda: np.ones(4, np.float32))])


def _tokenizer(path: Path) -> None:
    from specjax.tokenizers.byte import ByteTokenizer  # pylint: disable=import-outside-toplevel

    ByteTokenizer(["<eos>"]).save(path)


WRITERS = {
    "checkpoints.save_params_file": (_params_file, "params.npz"),
    "distill.Generated.save": (_generated, "gen.npz"),
    "distill_eagle.Features.save": (_features, "features.npz"),
    "safetensors_io.write_file": (_safetensors, "model.safetensors"),
    "Tokenizer.save": (_tokenizer, "tokenizer.json"),
}


@pytest.mark.parametrize("name", list(WRITERS))
def test_a_writer_stopped_before_its_rename_leaves_the_old_file(tmp_path, monkeypatch, name):
    """The rename fails (a kill there leaves the same): the old file is whole under the real
    name and the temporary is gone; the temporary was written beside the file, hidden."""
    write, filename = WRITERS[name]
    path = tmp_path / filename
    path.write_bytes(b"the old file")
    renames = []

    def failing_replace(src, dst):
        renames.append((Path(src), Path(dst)))
        raise OSError(28, "No space left on device (injected)")

    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(OSError, match="injected"):
        write(path)
    monkeypatch.undo()
    assert path.read_bytes() == b"the old file"
    assert _names(tmp_path) == [filename]
    ((src, dst),) = renames
    assert dst == path and src.parent == path.parent and src.name.startswith(f".{filename}.")
    write(path)  # and without the failure, the new file
    assert path.read_bytes() != b"the old file" and _names(tmp_path) == [filename]
