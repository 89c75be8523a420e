"""Data: the reasoning generator (determinism, correct arithmetic), the split, the
corpus builders on small fixtures, the shipped held-out texts and prompts, and errors.
Tests that build the real corpora are marked slow."""

from __future__ import annotations

import json
import re
import sys

import pytest

from specjax.data import (
    DOMAINS,
    THINK_CLOSE,
    THINK_OPEN,
    CorpusUnavailableError,
    corpora,
    generate_problems,
    generate_reasoning,
    load_domain,
    load_heldout,
    load_prompts,
    reasoning,
    shipped,
)

# ----------------------------------------------------------------- reasoning
_EXPR = r"\d+(?:\s*[-+*/]\s*\d+)*"
_CHAIN = re.compile(rf"{_EXPR}(?:\s*=\s*{_EXPR})+")
_CMP = re.compile(r"^(\d+) ([<>]) (\d+)[.,]")


def _eval(expr: str) -> float:
    assert re.fullmatch(_EXPR, expr.strip()), expr
    return eval(expr)  # noqa: S307 -- digits and + - * / only (checked above)


def _check_equations(line: str) -> int:
    """Every 'a = b = c' chain in the line holds; returns how many were checked."""
    chains = _CHAIN.findall(line)
    for chain in chains:
        values = [_eval(part) for part in chain.split("=")]
        assert all(v == values[0] for v in values), line
    m = _CMP.match(line)
    if m:
        a, op, b = int(m.group(1)), m.group(2), int(m.group(3))
        assert (a > b) if op == ">" else (a < b), line
    return len(chains) + bool(m)


def _expected_answer(template: str, q: str) -> str:
    """Re-derives the answer from the question text alone."""
    nums = [int(x) for x in re.findall(r"\d+", q)]
    if template in ("sum", "add_sub", "product"):
        return str(int(_eval(re.fullmatch(r"What is (.*)\?", q).group(1))))
    if template == "buy_bags":
        a, bags, per = nums
        return str(a + bags * per)
    if template == "give_get":
        a, b, c = nums
        return str(a - b + c)
    if template == "shop":
        c1, c2, n1, n2 = nums
        return str(n1 * c1 + n2 * c2)
    if template == "share":
        n, k = nums
        return f"{n // k} each, {n % k} left"
    if template == "to_small_unit":
        small, a, big, b = re.fullmatch(
            r"How many (\w+) are in (\d+) (\w+) and (\d+) \w+\?", q
        ).groups()
        f = {(u[0], u[1]): u[2] for u in reasoning.UNITS}[(big, small)]
        return str(int(a) * f + int(b))
    if template == "to_big_unit":
        big, small, m = re.fullmatch(r"How many (\w+) and (\w+) is (\d+) \w+\?", q).groups()
        f = {(u[0], u[1]): u[2] for u in reasoning.UNITS}[(big, small)]
        return f"{int(m) // f} {big} {int(m) % f} {small}"
    if template == "compare":
        m = re.fullmatch(r"(\w+) has (\d+) bags of (\d+) \w+ and (\w+) has (\d+) \w+\. .*", q)
        n1, bags, per, n2, c = m.groups()
        x, c = int(bags) * int(per), int(c)
        return f"{n1 if x > c else n2}, by {abs(x - c)}"
    if template == "clock":
        h, mm, d = nums
        t = h * 60 + mm + d
        return f"{t // 60}:{t % 60:02d}"
    if template == "percent":
        p, n = nums
        assert n * p % 100 == 0
        return str(n * p // 100)
    if template == "average":
        assert sum(nums) % len(nums) == 0
        return str(sum(nums) // len(nums))
    raise AssertionError(f"untested template {template}")


def test_reasoning_deterministic():
    assert generate_reasoning(200, seed=3) == generate_reasoning(200, seed=3)
    assert generate_reasoning(200, seed=3) != generate_reasoning(200, seed=4)
    # A prefix of a longer run is the shorter run.
    assert generate_reasoning(300, seed=3).startswith(generate_reasoning(200, seed=3))
    assert generate_reasoning(0, seed=1) == ""
    with pytest.raises(ValueError):
        generate_problems(-1, seed=0)


def test_reasoning_answers_correct():
    probs = generate_problems(3000, seed=7)
    assert {p.template for p in probs} == set(reasoning.TEMPLATES)
    for p in probs:
        assert _expected_answer(p.template, p.question) == p.answer, p
        assert sum(_check_equations(s) for s in p.steps) >= 1, p
        assert all("\n" not in s and s.strip() for s in p.steps)


def test_reasoning_text_format_parses_back():
    text = generate_reasoning(500, seed=11)
    paragraphs = text.split("\n\n")
    assert paragraphs[-1] == ""
    probs = generate_problems(500, seed=11)
    for para, p in zip(paragraphs[:-1], probs, strict=True):
        lines = para.split("\n")
        assert lines[0] == f"Q: {p.question}"
        assert lines[1] == THINK_OPEN and lines[-2] == THINK_CLOSE
        assert lines[-1] == f"A: {p.answer}"
        for line in lines[2:-2]:
            _check_equations(line)


# ------------------------------------------------------------------ split / builders
def test_split_is_stable_and_disjoint():
    keys = [f"doc{i}" for i in range(20000)]
    frac = sum(map(corpora.is_heldout, keys)) / len(keys)
    assert abs(frac - corpora.HELDOUT_FRACTION) < 0.01
    docs = [(k, k + "\n") for k in keys]
    train, held = corpora.split_documents(docs)
    assert {k for k, _ in train}.isdisjoint({k for k, _ in held})
    assert len(train) + len(held) == len(docs)
    assert corpora.split_documents(docs[::-1])[1] == held[::-1]  # order-independent


def test_code_documents_filters_and_orders(tmp_path):
    for rel in (
        "b.py",
        "a.py",
        "pkg/__init__.py",
        "pkg/mod.py",
        "test/test_x.py",
        "pkg/tests/t.py",
        "idlelib/i.py",
        "site-packages/s.py",
        "c.txt",
        "pydoc_data/topics.py",
    ):
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("" if rel == "pkg/__init__.py" else f"x = '{rel}'\r\n")
    (tmp_path / "latin.py").write_bytes(b"x = '\xe9'\n")
    docs = corpora.code_documents(tmp_path)
    assert [k for k, _ in docs] == ["a.py", "b.py", "pkg/mod.py"]
    assert docs[0][1] == "# file: a.py\nx = 'a.py'\n"
    with pytest.raises(CorpusUnavailableError, match="not found"):
        corpora.code_documents(tmp_path / "missing")


KJV_SAMPLE = """
Genesis 1

  1 In the beginning God created the heaven and the earth.
  2 And the earth was without form, and void.

1 Samuel 2

  1 And Hannah prayed, and said,  My heart rejoiceth in the LORD.
"""


def test_parse_kjv_dump():
    docs = corpora.parse_kjv_dump(KJV_SAMPLE)
    assert [k for k, _ in docs] == ["Genesis 1", "1 Samuel 2"]
    assert docs[0][1] == (
        "Genesis 1\nIn the beginning God created the heaven and the "
        "earth.\nAnd the earth was without form, and void.\n\n"
    )
    assert docs[1][1].splitlines()[1] == (
        "And Hannah prayed, and said, My heart rejoiceth in the LORD."
    )
    with pytest.raises(ValueError, match="line 2"):
        corpora.parse_kjv_dump("Genesis 1\n???\n")
    with pytest.raises(ValueError, match="before any chapter"):
        corpora.parse_kjv_dump("  1 verse\n")


def test_prose_unavailable_error_is_clear(tmp_path, monkeypatch):
    monkeypatch.setattr(corpora, "APT_GET", str(tmp_path / "no-apt-get"))
    with pytest.raises(CorpusUnavailableError) as e:
        load_domain("prose", cache=tmp_path)
    msg = str(e.value)
    assert "\n" not in msg
    assert "bible-kjv-text" in msg and "fix:" in msg and "apt-get" in msg


def test_load_domain_small_reasoning(tmp_path, monkeypatch):
    monkeypatch.setattr(corpora, "REASONING_PROBLEMS", 400)
    monkeypatch.setenv("SPECJAX_DATA_CACHE", str(tmp_path))
    assert corpora.default_cache_dir() == tmp_path
    train, held = load_domain("reasoning"), load_domain("reasoning", "heldout")
    meta = json.loads((tmp_path / "reasoning" / "meta.json").read_text())
    assert meta["train"]["bytes"] == len(train.encode()) and meta["heldout"]["documents"] > 0
    q_train = {ln for ln in train.splitlines() if ln.startswith("Q: ")}
    q_held = {ln for ln in held.splitlines() if ln.startswith("Q: ")}
    assert q_held and q_train.isdisjoint(q_held)
    assert len(q_train) + len(q_held) == len({p.question for p in generate_problems(400, 0)})
    part = load_domain("reasoning", max_bytes=1000)
    assert len(part.encode()) <= 1000 and part.endswith("\n") and train.startswith(part)
    assert load_domain("reasoning", max_bytes=10**9) == train
    # Cached: a second call reads the files (a changed size rebuilds).
    (tmp_path / "reasoning" / "train.txt").write_text("sentinel\n")
    assert load_domain("reasoning") == "sentinel\n"
    monkeypatch.setattr(corpora, "REASONING_PROBLEMS", 401)
    assert load_domain("reasoning") != "sentinel\n"


def test_load_domain_errors(tmp_path):
    with pytest.raises(ValueError, match="unknown domain 'poetry'"):
        load_domain("poetry", cache=tmp_path)
    with pytest.raises(ValueError, match="unknown split 'test'"):
        load_domain("code", split="test", cache=tmp_path)


# ------------------------------------------------------------------ shipped files
@pytest.mark.parametrize("domain", DOMAINS)
def test_shipped_heldout(domain):
    text = load_heldout(domain)
    assert 20_000 <= len(text.encode()) <= 40_000
    if domain == "code":
        keys = re.findall(r"^# file: (\S+)$", text, flags=re.M)
    elif domain == "prose":
        keys = [c.split("\n", 1)[0] for c in text.split("\n\n") if c]
    else:
        keys = re.findall(r"^Q: (.*)$", text, flags=re.M)
    assert keys and all(map(corpora.is_heldout, keys)), "shipped text must be held out"


def test_shipped_reasoning_heldout_is_correct():
    paragraphs = [p for p in load_heldout("reasoning").split("\n\n") if p]
    by_question = {
        p.question: p for p in generate_problems(corpora.REASONING_PROBLEMS, corpora.REASONING_SEED)
    }
    for para in paragraphs:
        q = para.split("\n", 1)[0][3:]
        assert by_question[q].format() == para + "\n\n"


def test_prompts():
    prompts = load_prompts()
    assert len({p["id"] for p in prompts}) == len(prompts)
    for domain in DOMAINS:
        mine = load_prompts((domain,))
        assert len(mine) == shipped.PROMPTS_PER_DOMAIN
        assert mine == [p for p in prompts if p["domain"] == domain]
        for p in mine:
            assert p["prompt"].strip() and p["prompt"].endswith("\n")
            assert 1 <= p["prompt"].count("\n") <= 3
            if domain == "reasoning":
                assert p["prompt"].startswith("Q: ") and p["prompt"].count("\n") == 1
                assert corpora.is_heldout(p["prompt"][3:-1])
            elif domain == "prose":
                assert corpora.is_heldout(p["source"])
                assert p["prompt"].split("\n", 1)[0] == p["source"]
            else:
                assert corpora.is_heldout(p["source"])
                assert re.match(r"\s*(async )?def ", p["prompt"])
    assert load_prompts("prose") == load_prompts(("prose",))


def test_shipped_errors():
    with pytest.raises(ValueError, match="unknown domain"):
        load_heldout("poetry")
    with pytest.raises(ValueError, match="unknown domain"):
        load_prompts(("code", "poetry"))


def test_code_prompt_selection():
    src = (
        "def short():\n    return 1\n\n"
        "def f(a,\n      b):\n    x = a\n    y = b\n    z = 1\n    return x\n"
    )
    assert shipped.code_prompt(src) == "def f(a,\n      b):\n    x = a\n"
    assert shipped.code_prompt("def (:\n") is None


# ------------------------------------------------------------------ real corpora
@pytest.mark.slow
@pytest.mark.parametrize("domain", DOMAINS)
def test_real_corpora(domain):
    train = load_domain(domain)
    held = load_domain(domain, "heldout")
    assert len(train.encode()) > 1_000_000 and len(held.encode()) > 50_000
    shipped_text = load_heldout(domain)
    sep = {"code": "\n# file: ", "prose": "\n\n", "reasoning": "\n\n"}[domain]
    pieces = [p for p in shipped_text.split(sep) if len(p) > 40]
    assert len(pieces) > 3
    for piece in pieces:
        assert piece in held and piece not in train


@pytest.mark.slow
@pytest.mark.skipif(
    sys.version_info[:2] != (3, 11),
    reason="shipped files were cut from the Python 3.11 standard library",
)
def test_shipped_files_reproduce(tmp_path):
    shipped.write_shipped_files(package_dir=tmp_path)
    for domain in DOMAINS:
        assert (tmp_path / "heldout" / f"{domain}.txt").read_text() == load_heldout(domain)
        got = [
            json.loads(ln)
            for ln in (tmp_path / "prompts" / f"{domain}.jsonl").read_text().splitlines()
        ]
        assert got == load_prompts((domain,))
