"""A zoo is published with renames (`specjax.atomic.publish_dir`, experiments/train_zoo.py's
last step): at every instant a complete zoo is at --out, or (between two renames) the old
one beside it, which the next build puts back (`recover_dir`). Deterministic: the failures
and the kills (SIGKILL, no cleanup) are injected at each step; no sleeps (#51)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from specjax import atomic

REPO = Path(__file__).resolve().parent.parent


def _zoo(root: Path, tag: str) -> Path:
    """A stand-in zoo: a manifest, a model file and a tokenizer, tagged old or new."""
    (root / "models").mkdir(parents=True)
    (root / "tokenizers").mkdir()
    (root / "manifest.json").write_text(f'{{"zoo": "{tag}"}}\n')
    (root / "models" / "verifier.npz").write_bytes(tag.encode() * 1000)
    (root / "tokenizers" / "verifier.json").write_text(f'{{"tok": "{tag}"}}\n')
    return root


def _tree(root: Path) -> dict[str, bytes] | None:
    if not root.is_dir():
        return None
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


def _setup(tmp_path: Path, old: bool = True) -> tuple[Path, Path, dict, dict | None]:
    work = _zoo(tmp_path / "work" / "zoo", "new")
    out = tmp_path / "pub" / "zoo"
    if old:
        _zoo(out, "old")
    return work, out, _tree(work), _tree(out)


def _leftovers(out: Path) -> list[str]:
    return sorted(p.name for p in out.parent.iterdir() if p.name != out.name)


@pytest.mark.parametrize("same_fs", [True, False], ids=["rename", "copy"])
@pytest.mark.parametrize("old", [True, False], ids=["over-a-zoo", "no-zoo-before"])
def test_publish_puts_the_new_zoo_in_place_and_nothing_beside_it(
    tmp_path, monkeypatch, same_fs, old
):
    work, out, new_tree, _ = _setup(tmp_path, old)
    monkeypatch.setattr(atomic, "_same_filesystem", lambda a, b: same_fs)
    atomic.publish_dir(work, out)
    assert _tree(out) == new_tree
    assert _leftovers(out) == [] and not work.exists()


@pytest.mark.parametrize("step", [1, 2, 3], ids=["stage", "old-aside", "new-in"])
def test_an_error_at_a_step_of_publish_leaves_the_old_zoo(tmp_path, monkeypatch, step):
    """An OSError at the `step`-th rename (the new zoo staged beside --out, the old one moved
    aside, the new one renamed in): the old zoo at --out, nothing staged left beside it."""
    work, out, _, old_tree = _setup(tmp_path)
    real_rename, calls = os.rename, [0]

    def rename(src, dst):
        calls[0] += 1
        if calls[0] == step:
            raise OSError(28, "No space left on device (injected)")
        return real_rename(src, dst)

    monkeypatch.setattr(os, "rename", rename)
    with pytest.raises(OSError, match="injected"):
        atomic.publish_dir(work, out)
    monkeypatch.setattr(os, "rename", real_rename)
    assert _tree(out) == old_tree
    assert _leftovers(out) == []


# The publisher: dies (SIGKILL) at a step of `publish`.
_KILLED = r"""
import os, shutil, signal, sys
from pathlib import Path
from specjax import atomic

point, work, out = sys.argv[1:]
real_rename, real_fsync, real_rmtree = os.rename, os.fsync, shutil.rmtree
renames = [0]
def die():
    os.kill(os.getpid(), signal.SIGKILL)
def rename(src, dst):
    renames[0] += 1
    if point == f"before-rename-{renames[0]}":
        die()
    real_rename(src, dst)
    if point == f"after-rename-{renames[0]}":
        die()
def fsync(fd):
    if point == "staging-fsync":
        die()
    real_fsync(fd)
def rmtree(path, *a, **k):
    if point == "removing-the-old" and Path(path).name.endswith(".old"):
        (Path(path) / "manifest.json").unlink()  # half removed
        die()
    real_rmtree(path, *a, **k)
os.rename, os.fsync, shutil.rmtree = rename, fsync, rmtree
atomic.publish_dir(Path(work), Path(out))
"""

# point -> what the next build finds at --out after `recover_dir`
KILLS = {
    "before-rename-1": "old",  # nothing moved yet
    "after-rename-1": "old",  # the new zoo staged beside --out
    "staging-fsync": "old",
    "after-rename-2": "old",  # the old zoo aside, --out missing: renamed back
    "after-rename-3": "new",  # the new zoo in, the old one still aside
    "removing-the-old": "new",  # the old one half removed
}


@pytest.mark.parametrize("point", list(KILLS))
def test_a_kill_at_a_step_of_publish_leaves_a_complete_zoo(tmp_path, point):
    """Killed at `point`: --out holds the old or the new zoo, whole, or (between the two
    renames only) is missing with the old zoo whole beside it; the next build's
    `recover_dir` leaves the old zoo (killed before the new one was renamed in) or the
    new one, and nothing beside it."""
    work, out, new_tree, old_tree = _setup(tmp_path)
    killer = tmp_path / "killed.py"
    killer.write_text(_KILLED)
    proc = subprocess.run(
        [sys.executable, str(killer), point, str(work), str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    at_out = _tree(out)
    if at_out is None:
        assert point == "after-rename-2"
        assert _tree(atomic.backup_name(out)) == old_tree
    else:
        assert at_out in (old_tree, new_tree)
    atomic.recover_dir(out)
    assert _tree(out) == (old_tree if KILLS[point] == "old" else new_tree)
    assert _leftovers(out) == []
    print(
        f"killed at {point}: --out {'missing' if at_out is None else 'whole'}; "
        f"recovered the {KILLS[point]} zoo"
    )
