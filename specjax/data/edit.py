"""The ``edit`` plan prompts: steps that copy their context with small edits.

Routing has room only where the drafters differ by workload. On the three shipped domains
the drafters are near-generalists; on text that copies its own context (rename a variable
in given code, fix a stated bug in given code, fill a template, change a word in a given
passage) prompt lookup's α is high while a distilled drafter's need not be. ``prompts/edit.jsonl``
holds 24 such prompts, six of each kind, derived deterministically from held-out text:
the code corpus's held-out files (CPython standard-library source, PSF licence, read from
the running interpreter as `specjax.data.corpora` does; its split by path hash) and the
shipped ``heldout/prose.txt`` (the KJV, public domain) — the held-out split only, so no drafter
trained on the ``train`` split (the zoo, experiments/train_drafters.py,
experiments/train_eagle.py) has seen the text copied.

Each prompt shows the source, states the edit, and ends with the first line of the edited
copy, so a base model (the zoo) continues the copy as well as an instruction model
(SmolLM2 through its chat template): the continuation mostly copies the prompt with the
edit applied. Kinds: ``rename`` (a local name of a held-out function), ``fix`` (a
comparison planted reversed in a held-out function, the fix stated), ``template`` (an
accessor template filled for names taken from held-out code), ``reword`` (an archaic word
of a held-out passage of two verses replaced by a modern one). Functions with comments or
docstrings are skipped, so every edit is in code.

Regenerate with ``python -m specjax.data --edit`` (`write_edit_prompts`); with Python 3.11 (whose standard
library the corpus was built from) it reproduces the file in the repository byte for byte.
"""

from __future__ import annotations

import ast
import hashlib
import io
import json
import keyword
import re
import tokenize
from pathlib import Path

from specjax.atomic import atomic_file
from specjax.data import corpora

EDIT_DOMAIN = "edit"
EDIT_KINDS = ("rename", "fix", "template", "reword")
PER_KIND = 6
#: The longest source (bytes) a prompt shows: prompt + 4 steps of 32 tokens fit the
#: zoo's 512-position context.
MAX_SOURCE_BYTES = 420
MIN_SOURCE_LINES = 4
MAX_PASSAGE_BYTES = 320

#: Archaic word -> modern word (``reword``), tried in this order.
_MODERN = {
    "unto": "to",
    "thee": "you",
    "thou": "you",
    "thy": "your",
    "hath": "has",
    "saith": "says",
    "shalt": "shall",
    "ye": "you",
}
#: Comparison operators planted reversed (``fix``), tried in this order.
_REVERSED = (
    (" == ", " != "),
    (" != ", " == "),
    (" <= ", " > "),
    (" >= ", " < "),
    (" < ", " >= "),
    (" > ", " <= "),
    (" is not ", " is "),
    (" not in ", " in "),
    ("+ 1", "- 1"),
    ("return True", "return False"),
)


def _key(*parts: str) -> bytes:
    return hashlib.sha256(":".join(("edit",) + parts).encode()).digest()


def _functions(files) -> list[tuple[str, str, str]]:
    """(path, name, source) of every short function of ``files`` ((path, source) pairs),
    dedented, without blank lines or docstrings, in a fixed hash order."""
    out = []
    for path, src in files:
        try:
            tree = ast.parse(src)
        except SyntaxError:
            continue
        lines = src.splitlines(keepends=True)
        for node in ast.walk(tree):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            if node.decorator_list:
                continue
            body = lines[node.lineno - 1 : node.end_lineno]
            indent = len(body[0]) - len(body[0].lstrip())
            if any(ln.strip() and len(ln) - len(ln.lstrip()) < indent for ln in body):
                continue
            body = [ln[indent:] if ln.strip() else "\n" for ln in body]
            fn = "".join(body)
            if (
                len(body) < MIN_SOURCE_LINES
                or len(fn.encode()) > MAX_SOURCE_BYTES
                or any(not ln.strip() for ln in body)
                or "#" in fn
                or '"""' in fn
                or "'''" in fn
            ):
                continue
            out.append((path, node.name, fn))
    return sorted(out, key=lambda f: _key(f[0], f[1]))


def _names(fn: str) -> list[tuple[str, int]]:
    """(identifier, occurrences) of ``fn``'s NAME tokens, no keyword or builtin-looking
    dunder, most frequent first (ties: first seen)."""
    counts: dict[str, int] = {}
    try:
        for tok in tokenize.generate_tokens(io.StringIO(fn).readline):
            if tok.type == tokenize.NAME and not keyword.iskeyword(tok.string):
                counts[tok.string] = counts.get(tok.string, 0) + 1
    except (tokenize.TokenError, IndentationError):
        return []
    return sorted(counts.items(), key=lambda kv: -kv[1])


def _rename(fn: str, old: str, new: str) -> str:
    """``fn`` with every NAME token ``old`` (not attributes after a dot, not inside
    strings) replaced by ``new``."""
    toks = list(tokenize.generate_tokens(io.StringIO(fn).readline))
    lines = fn.splitlines(keepends=True)
    edits = []
    for i, tok in enumerate(toks):
        if tok.type == tokenize.NAME and tok.string == old:
            if i and toks[i - 1].type == tokenize.OP and toks[i - 1].string == ".":
                continue
            edits.append(tok.start)
    for row, col in reversed(edits):
        ln = lines[row - 1]
        lines[row - 1] = ln[:col] + new + ln[col + len(old) :]
    return "".join(lines)


def _split_first(text: str) -> tuple[str, str]:
    first, _, rest = text.partition("\n")
    return first + "\n", rest


def _rename_prompts(funcs) -> list[dict]:
    out = []
    for path, name, fn in funcs:
        params = set()
        tree = ast.parse(fn)
        f = tree.body[0]
        for a in f.args.args + f.args.kwonlyargs:
            params.add(a.arg)
        cands = [
            (n, c) for n, c in _names(fn) if n in params and n not in ("self", "cls") and c >= 3
        ]
        if not cands:
            continue
        old = cands[0][0]
        new = f"new_{old}"
        if new in fn:
            continue
        edited = _rename(fn, old, new)
        first, _ = _split_first(edited)
        prompt = (
            f"# Rename `{old}` to `{new}` in this function:\n{fn}"
            f"# The same function with `{old}` renamed to `{new}`:\n{first}"
        )
        out.append({"kind": "rename", "source": f"{path}:{name}", "prompt": prompt})
        if len(out) == PER_KIND:
            break
    return out


def _fix_prompts(funcs, taken) -> list[dict]:
    out = []
    for path, name, fn in funcs:
        if f"{path}:{name}" in taken:
            continue
        first, rest = _split_first(fn)
        for good, bad in _REVERSED:
            if good not in rest:
                continue
            buggy = first + rest.replace(good, bad, 1)
            prompt = (
                f"# This function has a bug: `{bad.strip()}` should be `{good.strip()}`.\n"
                f"{buggy}# The fixed function:\n{first}"
            )
            out.append({"kind": "fix", "source": f"{path}:{name}", "prompt": prompt})
            break
        if len(out) == PER_KIND:
            break
    return out


def _template_prompts(funcs) -> list[dict]:
    """Accessor templates filled for three attribute names of a held-out function."""
    shapes = (
        "def get_{name}(self):\n    return self._{name}\n",
        "def set_{name}(self, value):\n    self._{name} = value\n",
        "@property\ndef {name}(self):\n    return self._{name}\n",
    )
    out, seen = [], set()
    for path, name, fn in funcs:
        attrs = []
        for m in re.finditer(r"self\.([a-z][a-z0-9_]{2,})\b", fn):
            a = m.group(1).lstrip("_")
            if a and a not in attrs and not a.startswith("get") and "__" not in a:
                attrs.append(a)
        if len(attrs) < 3 or tuple(attrs[:3]) in seen:
            continue
        attrs = attrs[:3]
        seen.add(tuple(attrs))
        shape = shapes[len(out) % len(shapes)]
        filled = "".join(shape.format(name=a) for a in attrs)
        first, _ = _split_first(filled)
        prompt = (
            f"# Template:\n{shape.format(name='NAME')}"
            f"# Fill the template for each name: {', '.join(attrs)}\n{first}"
        )
        out.append({"kind": "template", "source": f"{path}:{name}", "prompt": prompt})
        if len(out) == PER_KIND:
            break
    return out


def _passages(text: str) -> list[tuple[str, list[str]]]:
    """(chapter, verses) of ``heldout/prose.txt``, in order."""
    out = []
    for block in text.split("\n\n"):
        lines = [ln for ln in block.splitlines() if ln.strip()]
        if len(lines) >= 2:
            out.append((lines[0], lines[1:]))
    return out


def _reword(chapter: str, verses: list[str]) -> dict | None:
    """The first two verses of a chapter (together at most `MAX_PASSAGE_BYTES`) where an
    archaic word of `_MODERN` occurs at least twice, once in the first verse."""
    for start in range(len(verses) - 1):
        part = verses[start : start + 2]
        body = "".join(v + "\n" for v in part)
        if len(body.encode()) > MAX_PASSAGE_BYTES:
            continue
        for old, new in _MODERN.items():
            pat = re.compile(rf"\b{old}\b")
            if len(pat.findall(body)) < 2 or not pat.search(part[0]):
                continue
            first, _ = _split_first(pat.sub(new, body))
            prompt = f'{chapter}\n{body}The same verses with "{old}" changed to "{new}":\n{first}'
            src = f"{chapter}:{start + 1}-{start + len(part)}"
            return {"kind": "reword", "source": src, "prompt": prompt}
    return None


def _reword_prompts(text: str) -> list[dict]:
    out = []
    for chapter, verses in sorted(_passages(text), key=lambda c: _key(c[0])):
        rec = _reword(chapter, verses)
        if rec is not None:
            out.append(rec)
        if len(out) == PER_KIND:
            break
    return out


def heldout_code_files() -> list[tuple[str, str]]:
    """(path, source) of the code corpus's held-out files (the running interpreter's
    standard library, `specjax.data.corpora`: the split by path hash)."""
    return list(corpora.split_documents(corpora.code_documents())[1])


def build_edit_prompts(code_files, prose_text: str) -> list[dict]:
    """The ``edit`` prompts (``{"id", "domain", "kind", "prompt", "source"}``) from held-out
    code files ((path, source) pairs, `heldout_code_files`) and the shipped held-out prose:
    `PER_KIND` of each of `EDIT_KINDS`, interleaved by kind. Raises ValueError when a kind
    finds too few sources."""
    funcs = _functions(code_files)
    rename = _rename_prompts(funcs)
    fix = _fix_prompts(funcs, {p["source"] for p in rename})
    groups = [rename, fix, _template_prompts(funcs), _reword_prompts(prose_text)]
    for kind, g in zip(EDIT_KINDS, groups):
        if len(g) < PER_KIND:
            raise ValueError(f"edit prompts: {len(g)} of kind {kind!r}; need {PER_KIND}")
    out = []
    for i in range(PER_KIND):
        for g in groups:
            rec = g[i]
            out.append(
                {
                    "id": f"{EDIT_DOMAIN}-{len(out):02d}",
                    "domain": EDIT_DOMAIN,
                    "kind": rec["kind"],
                    "prompt": rec["prompt"],
                    "source": rec["source"],
                }
            )
    return out


def write_edit_prompts(package_dir: Path | None = None) -> Path:
    """Writes ``prompts/edit.jsonl`` from the held-out code files and the package's
    shipped held-out prose (Python 3.11's standard library reproduces the file in the
    repository byte for byte)."""
    package_dir = Path(package_dir) if package_dir is not None else Path(__file__).parent
    code = heldout_code_files()
    prose = (Path(__file__).parent / "heldout" / "prose.txt").read_text(encoding="utf-8")
    path = package_dir / "prompts" / f"{EDIT_DOMAIN}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_file(path, "w") as f:
        for rec in build_edit_prompts(code, prose):
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")
    return path
