"""The three training domains, built deterministically into a local cache.

- **code**: Python standard-library sources (``sysconfig.get_paths()['stdlib']``,
  ``*.py`` in sorted order, without tests, idlelib, site-packages and the generated
  ``pydoc_data`` blob), each file preceded by a ``# file: <path>`` line. PSF licence.
- **prose**: the King James Bible from Debian's ``bible-kjv-text`` (public domain),
  fetched with ``apt-get download`` and unpacked with ``dpkg -x`` into the cache (nothing
  is installed system-wide). The text is stored compressed, so ``bible-kjv``'s ``bible``
  program (fetched the same way) dumps it. Cleaned to a ``<Book> <chapter>`` line, one
  verse per line (no verse numbers), and a blank line per chapter.
- **reasoning**: `specjax.data.reasoning.generate_problems`.

Each domain is a list of documents (a file, a chapter, a problem). A document is
held out iff the sha256 of its key (path, chapter name, question) falls in the first
`HELDOUT_FRACTION` of the hash range: the split is stable, independent of document
order and corpus size, and keeps identical reasoning questions on one side.

Build it all with ``python -m specjax.data``. The cache is ``data_cache/`` at the
repository root (``$SPECJAX_DATA_CACHE`` overrides) and holds
``<domain>/{train,heldout}.txt`` plus ``<domain>/meta.json``.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Sequence
from pathlib import Path

from specjax.atomic import atomic_write_text
from specjax.data import reasoning

DOMAINS = ("code", "prose", "reasoning")
SPLITS = ("train", "heldout")
HELDOUT_FRACTION = 0.05
#: Bumped whenever a builder's output changes, so stale caches are rebuilt.
CORPUS_VERSION = 1
#: Reasoning corpus size (about 4.5 MB, comparable to the prose domain) and seed.
REASONING_PROBLEMS = 32768
REASONING_SEED = 0

KJV_PACKAGES = ("bible-kjv-text", "bible-kjv")
KJV_CHAPTERS, KJV_VERSES = 1189, 31102
# Directory names never taken into the code corpus: tests and their data, the IDLE GUI,
# third-party packages, byte-code caches, and pydoc's generated topic strings.
CODE_EXCLUDED_DIRS = frozenset(
    {"test", "tests", "idlelib", "site-packages", "dist-packages", "__pycache__", "pydoc_data"}
)

Document = tuple[str, str]  # (key, text)


class CorpusUnavailableError(RuntimeError):
    """A corpus could not be obtained; the message names the source and the fix."""


def default_cache_dir() -> Path:
    """``$SPECJAX_DATA_CACHE``, else ``data_cache/`` at the repository root.

    For a non-editable install (no repository around the package) the fallback is
    ``~/.cache/specjax/data``.
    """
    from specjax.errors import env_value  # pylint: disable=import-outside-toplevel

    env = env_value("SPECJAX_DATA_CACHE")  # a ConfigError naming the variable if not allowed
    if env is not None:
        return env
    repo = Path(__file__).resolve().parents[2]
    if (repo / "pyproject.toml").is_file():
        return repo / "data_cache"
    return Path.home() / ".cache" / "specjax" / "data"


def is_heldout(key: str) -> bool:
    """Whether the document with this key belongs to the held-out split."""
    h = int.from_bytes(hashlib.sha256(key.encode("utf-8")).digest()[:8], "big")
    return h < HELDOUT_FRACTION * 2**64


def split_documents(docs: Sequence[Document]) -> tuple[list[Document], list[Document]]:
    """Partitions documents into (train, heldout) by `is_heldout` of their key."""
    train = [d for d in docs if not is_heldout(d[0])]
    held = [d for d in docs if is_heldout(d[0])]
    return train, held


# ------------------------------------------------------------------------- code
def stdlib_dir() -> Path:
    """The running interpreter's standard-library directory."""
    return Path(sysconfig.get_paths()["stdlib"])


def code_documents(root: Path | None = None) -> list[Document]:
    """Standard-library ``*.py`` files as ``(relative path, "# file: ...\\n" + source)``.

    Args:
        root: The library directory (default: `stdlib_dir`).

    Returns:
        Documents in sorted path order; files that are not UTF-8 are skipped.
    """
    root = Path(root) if root is not None else stdlib_dir()
    if not root.is_dir():
        raise CorpusUnavailableError(
            f"code corpus unavailable: standard-library directory {root} not found "
            "(fix: run with a CPython that ships its library sources)"
        )
    docs = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if CODE_EXCLUDED_DIRS & set(rel.parts[:-1]):
            continue
        try:
            text = path.read_bytes().decode("utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        text = text.replace("\r\n", "\n")
        if not text.strip():
            continue  # empty __init__.py files add nothing but headers
        if not text.endswith("\n"):
            text += "\n"
        docs.append((rel.as_posix(), f"# file: {rel.as_posix()}\n{text}"))
    if not docs:
        raise CorpusUnavailableError(f"code corpus unavailable: no *.py files under {root}")
    return docs


# ------------------------------------------------------------------------ prose
_CHAPTER = re.compile(r"^(?:[1-3] )?[A-Z][A-Za-z ]* \d+$")
_VERSE = re.compile(r"^\s+\d+ (.*)$")


def parse_kjv_dump(dump: str) -> list[Document]:
    """Parses ``bible -l 100000 gen1:1-rev22:21`` output into chapters.

    The dump has a ``Genesis 1`` style line per chapter and ``  <n> <text>`` per verse.

    Returns:
        ``("Genesis 1", "Genesis 1\\n<verse>\\n...<verse>\\n\\n")`` per chapter.

    Raises:
        ValueError: On a line that is neither, or text before the first chapter.
    """
    chapters: list[tuple[str, list[str]]] = []
    for lineno, line in enumerate(dump.splitlines(), 1):
        if not line.strip():
            continue
        m = _VERSE.match(line)
        if m:
            if not chapters:
                raise ValueError(f"KJV dump line {lineno}: verse before any chapter heading")
            chapters[-1][1].append(" ".join(m.group(1).split()))
        elif _CHAPTER.match(line):
            chapters.append((line.strip(), []))
        else:
            raise ValueError(f"KJV dump line {lineno}: unexpected text {line[:60]!r}")
    return [
        (name, name + "\n" + "".join(v + "\n" for v in verses) + "\n") for name, verses in chapters
    ]


def _run(cmd: Sequence[str], cwd: Path, what: str, fix: str) -> str:
    try:
        res = subprocess.run(list(cmd), cwd=cwd, capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.SubprocessError) as e:
        raise CorpusUnavailableError(
            f"{what}: `{' '.join(cmd)}` could not run ({e}); {fix}"
        ) from None
    if res.returncode != 0:
        err = " ".join((res.stderr or res.stdout).split())[-200:]
        raise CorpusUnavailableError(
            f"{what}: `{' '.join(cmd)}` exited {res.returncode} ({err}); {fix}"
        )
    return res.stdout


#: The apt-get executable (a module constant so tests can point it elsewhere).
APT_GET = "apt-get"


def kjv_documents(cache: Path) -> list[Document]:
    """Fetches (once) and parses the KJV text; see the module docstring.

    Raises:
        CorpusUnavailableError: If the packages cannot be downloaded, unpacked or
            dumped, naming the package and the fix.
    """
    src = cache / "_src" / "kjv"
    dump_path = src / "kjv_dump.txt"
    what = f"prose corpus unavailable (Debian packages {' + '.join(KJV_PACKAGES)})"
    if not dump_path.is_file():
        debs = src / "debs"
        debs.mkdir(parents=True, exist_ok=True)
        fix = (
            f"fix: run `{APT_GET} update` on a Debian/Ubuntu machine with package "
            f"sources, or copy the .deb files of {' and '.join(KJV_PACKAGES)} into {debs}"
        )
        missing = [p for p in KJV_PACKAGES if not list(debs.glob(f"{p}_*.deb"))]
        if missing:
            _run([APT_GET, "download", *missing], debs, what, fix)
        root = src / "root"
        shutil.rmtree(root, ignore_errors=True)
        for deb in sorted(debs.glob("*.deb")):
            _run(
                ["dpkg", "-x", str(deb), str(root)],
                src,
                what,
                "fix: install dpkg (Debian/Ubuntu), or delete the cached .deb files",
            )
        binary, data = root / "usr/bin/bible", root / "usr/lib"
        if not binary.is_file() or not (data / "bible.data").is_file():
            raise CorpusUnavailableError(
                f"{what}: {binary} or {data}/bible.data missing after unpacking; fix: "
                f"delete {debs} and retry"
            )
        # -l: no line wrapping; -p: read the unpacked data file, not /usr/lib.
        dump = _run(
            [str(binary), "-p", str(data), "-l", "100000", "gen1:1-rev22:21"],
            src,
            what,
            "fix: the `bible` binary needs libreadline (apt-get install libreadline8)",
        )
        atomic_write_text(dump_path, dump)
    try:
        docs = parse_kjv_dump(dump_path.read_text(encoding="utf-8"))
    except ValueError as e:
        raise CorpusUnavailableError(f"{what}: {e}; fix: delete {src} and retry") from None
    n_verses = sum(d[1].count("\n") - 2 for d in docs)
    if (len(docs), n_verses) != (KJV_CHAPTERS, KJV_VERSES):
        raise CorpusUnavailableError(
            f"{what}: dump has {len(docs)} chapters / {n_verses} verses, expected "
            f"{KJV_CHAPTERS} / {KJV_VERSES}; fix: delete {src} and retry"
        )
    return docs


# -------------------------------------------------------------------- reasoning
def reasoning_documents(n_problems: int | None = None, seed: int | None = None) -> list[Document]:
    """Generated problems keyed by their question (duplicates share a split).

    Defaults (`REASONING_PROBLEMS`, `REASONING_SEED`) are read at call time.
    """
    n_problems = REASONING_PROBLEMS if n_problems is None else n_problems
    seed = REASONING_SEED if seed is None else seed
    return [(p.question, p.format()) for p in reasoning.generate_problems(n_problems, seed)]


# ------------------------------------------------------------------------ cache
def domain_documents(name: str, cache: Path | None = None) -> list[Document]:
    """All documents of a domain, in corpus order (before the split)."""
    cache = Path(cache) if cache is not None else default_cache_dir()
    if name == "code":
        return code_documents()
    if name == "prose":
        return kjv_documents(cache)
    if name == "reasoning":
        return reasoning_documents()
    raise ValueError(f"unknown domain {name!r} (expected one of {DOMAINS})")


def build_domain(name: str, cache: Path | None = None, force: bool = False) -> dict:
    """Builds ``<cache>/<name>/{train,heldout}.txt`` unless already current.

    Args:
        name: One of `DOMAINS`.
        cache: Cache directory (default `default_cache_dir`).
        force: Rebuild even if the cached files are current.

    Returns:
        The domain's metadata (sizes in bytes, document counts, sha256s, source).
    """
    if name not in DOMAINS:
        raise ValueError(f"unknown domain {name!r} (expected one of {DOMAINS})")
    cache = Path(cache) if cache is not None else default_cache_dir()
    out = cache / name
    meta_path = out / "meta.json"
    if not force and meta_path.is_file() and all((out / f"{s}.txt").is_file() for s in SPLITS):
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
        if (meta.get("corpus_version"), meta.get("source")) == (CORPUS_VERSION, _source(name)):
            return meta
    docs = domain_documents(name, cache)
    train, held = split_documents(docs)
    out.mkdir(parents=True, exist_ok=True)
    meta = {
        "domain": name,
        "corpus_version": CORPUS_VERSION,
        "heldout_fraction": HELDOUT_FRACTION,
        "source": _source(name),
    }
    if name == "code":
        meta["python_version"] = sys.version.split()[0]
    for split, part in (("train", train), ("heldout", held)):
        text = "".join(t for _, t in part)
        atomic_write_text(out / f"{split}.txt", text)
        data = text.encode("utf-8")
        meta[split] = {
            "documents": len(part),
            "bytes": len(data),
            "sha256": hashlib.sha256(data).hexdigest(),
        }
    atomic_write_text(meta_path, json.dumps(meta, indent=1) + "\n")
    return meta


def _source(name: str) -> str:
    """A one-line description of where a domain comes from (stored in meta.json)."""
    if name == "code":
        return "CPython standard library sources (PSF License)"
    if name == "prose":
        return "King James Version, Debian bible-kjv-text (public domain)"
    return f"specjax.data.reasoning.generate_problems({REASONING_PROBLEMS}, seed={REASONING_SEED})"


def load_domain(
    name: str, split: str = "train", max_bytes: int | None = None, cache: Path | None = None
) -> str:
    """The text of one domain's split, building the cache on first use.

    Args:
        name: ``"code"``, ``"prose"`` or ``"reasoning"``.
        split: ``"train"`` or ``"heldout"`` (held-out text is never in ``"train"``).
        max_bytes: If given, only a prefix of at most this many UTF-8 bytes, cut at the
            last newline inside it (so no line or character is split).
        cache: Cache directory (default `default_cache_dir`).

    Returns:
        The text.

    Raises:
        ValueError: Unknown domain or split.
        CorpusUnavailableError: The source cannot be obtained (message says how to fix).
    """
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r} (expected one of {SPLITS})")
    cache = Path(cache) if cache is not None else default_cache_dir()
    build_domain(name, cache)
    path = cache / name / f"{split}.txt"
    if max_bytes is None:
        return path.read_text(encoding="utf-8")
    with path.open("rb") as f:
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:
        data = data[: data.rfind(b"\n", 0, max_bytes) + 1]
    return data.decode("utf-8")
