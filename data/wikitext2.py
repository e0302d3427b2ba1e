"""WikiText-2 (Merity et al., 2016), word level, as in PyTorch's ``word_language_model`` example.

``root/wikitext-2/wiki.{train,valid,test}.tokens`` are the files of the official
``wikitext-2-v1.zip`` (the tokenized version, with ``<unk>`` already in the text). The standard
recipe: every line (including empty ones) is split on whitespace and ends with an ``<eos>``
token; one dictionary numbers the words in order of first appearance over train, then valid,
then test (so words seen only in valid/test still get an id, and the embedding has rows for
them). With the official files the vocabulary has 33,278 words and the streams about 2.09M,
218k and 246k tokens. ``num_classes`` (the vocabulary size) is checked against the files when it
is set; a mismatch usually means a truncated or different copy. ``eval_split`` chooses whether
the bundle's ``test`` stream is the test or the validation file; :func:`load_corpus` gives all
three.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from core.errors import ConfigError, check_choice
from data import DataBundle, check_classes, check_vocabulary, read_text, register, root_dir

SPLITS = ("train", "valid", "test")
EOS = "<eos>"


@dataclass
class Corpus:
    """The word list (index = token id) and one 1-D int64 token stream per split."""

    vocabulary: list[str]
    streams: dict[str, torch.Tensor]


def _folder(cfg: Any) -> Path:
    return root_dir(cfg) / "wikitext-2"


def _check(cfg: Any) -> None:
    check_choice(cfg.get("eval_split", "test"), "dataset.eval_split", ("test", "valid"))
    check_classes(cfg.get("num_classes"), optional=True)
    folder = _folder(cfg)
    for split in SPLITS:
        path = folder / f"wiki.{split}.tokens"
        if not path.is_file():
            raise ConfigError(
                f"dataset.root: {path} not found; expected wiki.train.tokens, wiki.valid.tokens "
                f"and wiki.test.tokens under {folder}/ (unzip wikitext-2-v1.zip, the tokenized "
                f"WikiText-2 of Merity et al., e.g. from https://wikitext.smerity.com/)"
            )


def lines(text: str) -> list[str]:
    """The lines of ``text`` as ``for line in file`` yields them (a final newline ends no line)."""
    out = text.split("\n")
    if out[-1] == "":
        out.pop()
    return out


def load_corpus(cfg: Any) -> Corpus:
    """Tokenize the three files with one shared dictionary."""
    ids: dict[str, int] = {}
    streams = {}
    for split in SPLITS:
        tokens: list[int] = []
        for line in lines(read_text(_folder(cfg) / f"wiki.{split}.tokens")):
            for word in line.split():
                tokens.append(ids.setdefault(word, len(ids)))
            tokens.append(ids.setdefault(EOS, len(ids)))
        streams[split] = torch.tensor(tokens, dtype=torch.int64)
    return Corpus(list(ids), streams)


@register("wikitext2", check=_check, fixed={"task": "language_model"})
def build(cfg: Any) -> DataBundle:
    """Train stream and the ``eval_split`` stream; ``num_classes`` = vocabulary size."""
    corpus = load_corpus(cfg)
    size = check_vocabulary(cfg, len(corpus.vocabulary), _folder(cfg))
    test = corpus.streams[cfg.get("eval_split", "test")]
    return DataBundle("language_model", size, corpus.streams["train"], test)
