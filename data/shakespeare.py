"""Shakespeare, character level (Karpathy's tiny-shakespeare, as in AdaComp's char-LSTM runs).

``root/shakespeare/input.txt`` is one UTF-8 text file (tiny-shakespeare: 1,115,394 characters,
65 distinct). The vocabulary is the sorted set of characters of the whole file (token id = rank
in that order); the text is split at ``int(len * (1 - test_fraction))`` characters, the start
being the training stream and the rest the test stream (nanoGPT's split for 0.1). Line ends are
read in universal-newline mode, so ``\\r\\n`` counts as one ``\\n``. ``num_classes`` (the
vocabulary size) is checked against the file when it is set.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from core.errors import ConfigError, check_number
from data import DataBundle, check_classes, check_vocabulary, read_text, register, root_dir


def _path(cfg: Any) -> Path:
    return root_dir(cfg) / "shakespeare" / "input.txt"


def _check(cfg: Any) -> None:
    check_number(cfg.get("test_fraction", 0.1), "dataset.test_fraction", 0, 1, low_open=True,
                 high_open=True)
    check_classes(cfg.get("num_classes"), optional=True)
    path = _path(cfg)
    if not path.is_file():
        raise ConfigError(
            f"dataset.root: {path} not found; expected one text file at "
            f"<root>/shakespeare/input.txt (tiny-shakespeare, e.g. https://raw.githubusercontent"
            f".com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt)"
        )


def vocabulary(text: str) -> list[str]:
    """The sorted distinct characters of ``text`` (index = token id)."""
    return sorted(set(text))


@register("shakespeare", check=_check, fixed={"task": "language_model"})
def build(cfg: Any) -> DataBundle:
    """Train/test character streams; ``num_classes`` = number of distinct characters."""
    path = _path(cfg)
    text = read_text(path)
    chars = vocabulary(text)
    size = check_vocabulary(cfg, len(chars), path)
    ids = {c: i for i, c in enumerate(chars)}
    stream = torch.tensor([ids[c] for c in text], dtype=torch.int64)
    cut = int(len(stream) * (1 - float(cfg.get("test_fraction", 0.1))))
    if cut < 2 or len(stream) - cut < 2:
        raise ConfigError(f"dataset.test_fraction: splitting the {len(stream)} characters of "
                          f"{path} leaves {cut} for training and {len(stream) - cut} for test; "
                          f"each needs at least 2")
    return DataBundle("language_model", size, stream[:cut], stream[cut:])
