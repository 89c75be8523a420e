"""``python -m specjax.data [--force] [--ship] [--edit]``: build the corpus cache and
summarise it.

``--force`` rebuilds every domain; ``--ship`` also regenerates the held-out texts and
prompts shipped in ``specjax/data/{heldout,prompts}`` (maintainers only), the ``edit``
prompts included; ``--edit`` regenerates only ``prompts/edit.jsonl`` (`specjax.data.edit`:
from the code corpus's held-out files and the shipped held-out prose, no cache needed).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from specjax.data import corpora, edit, shipped


def main(argv: Sequence[str] | None = None) -> None:
    """Builds every domain, prints sizes, and optionally rewrites the shipped files."""
    argv = list(sys.argv[1:] if argv is None else argv)
    unknown = set(argv) - {"--force", "--ship", "--edit"}
    if unknown:
        raise SystemExit(
            f"unknown arguments {sorted(unknown)}; usage: python -m specjax.data [--force] "
            "[--ship] [--edit]"
        )
    if argv == ["--edit"]:
        print("wrote", edit.write_edit_prompts())
        return
    for name in corpora.DOMAINS:
        meta = corpora.build_domain(name, force="--force" in argv)
        print(
            f"{name:9s} train {meta['train']['bytes']:>10,d} B "
            f"({meta['train']['documents']} docs)  heldout "
            f"{meta['heldout']['bytes']:>9,d} B ({meta['heldout']['documents']} docs)  "
            f"cache {corpora.default_cache_dir() / name}"
        )
    if "--ship" in argv:
        for path in shipped.write_shipped_files():
            print("wrote", path)
        print("wrote", edit.write_edit_prompts())


if __name__ == "__main__":
    main()
