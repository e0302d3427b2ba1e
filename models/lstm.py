"""Word-level LSTM language model for WikiText-2 (Zaremba et al., 2014; Press & Wolf, 2017).

The model of the Accordion WikiText-2 experiments (Agarwal et al., MLSys 2021): embedding, dropout,
a multi-layer ``nn.LSTM`` with dropout between layers, dropout, and a linear decoder over the
vocabulary, optionally sharing its weight with the embedding ("weight tying"). Defaults are the
"medium" 2-layer 650-unit tied model (28,434,378 parameters for the 33,278-word WikiText-2
vocabulary); the authors' setting is ``num_layers=3, dropout=0.4`` (650 units, tied).
``num_classes`` is the vocabulary size. Inputs are batch-first token ids ``[batch, seq]``.

:class:`LSTMLanguageModel` is also the character-level model (``models/char_lstm.py``).
"""

from __future__ import annotations

import torch
from torch import nn

from core.errors import ConfigError, check_bool, check_int, check_number
from models import check_io, register

INPUT = {"kind": "tokens"}

Hidden = tuple[torch.Tensor, torch.Tensor]


class LSTMLanguageModel(nn.Module):
    """Embedding -> dropout -> LSTM -> dropout -> linear decoder, batch-first."""

    def __init__(self, num_classes: int, emb_size: int = 650, hidden_size: int = 650,
                 num_layers: int = 2, dropout: float = 0.5, tie_weights: bool = True) -> None:
        super().__init__()
        check_lstm(num_classes, emb_size, hidden_size, num_layers, dropout, tie_weights)
        self.num_layers, self.hidden_size = num_layers, hidden_size
        self.encoder = nn.Embedding(num_classes, emb_size)
        self.drop = nn.Dropout(dropout)
        # nn.LSTM's own dropout acts between layers only (and warns when there is just one).
        self.rnn = nn.LSTM(emb_size, hidden_size, num_layers,
                           dropout=dropout if num_layers > 1 else 0.0, batch_first=True)
        self.decoder = nn.Linear(hidden_size, num_classes)
        nn.init.uniform_(self.encoder.weight, -0.1, 0.1)
        nn.init.zeros_(self.decoder.bias)
        if tie_weights:
            self.decoder.weight = self.encoder.weight
        else:
            nn.init.uniform_(self.decoder.weight, -0.1, 0.1)

    def init_hidden(self, batch_size: int, device: torch.device | str | None = None) -> Hidden:
        """Zero ``(h, c)`` states, each ``[num_layers, batch_size, hidden_size]``."""
        weight = self.decoder.weight
        shape = (self.num_layers, batch_size, self.hidden_size)
        return (weight.new_zeros(shape, device=device), weight.new_zeros(shape, device=device))

    def forward(self, x: torch.Tensor, hidden: Hidden | None = None) -> tuple[torch.Tensor, Hidden]:
        """Map token ids ``[batch, seq]`` to logits ``[batch, seq, vocab]`` and the new state."""
        if hidden is None:
            hidden = self.init_hidden(x.size(0), x.device)
        out, hidden = self.rnn(self.drop(self.encoder(x)), hidden)
        return self.decoder(self.drop(out)), hidden


def check_lstm(num_classes: int, emb_size: int, hidden_size: int, num_layers: int,
               dropout: float, tie_weights: bool) -> None:
    """ConfigError naming the ``model.*`` key that an LSTM language model cannot take."""
    check_io(num_classes)
    for field, value in (("emb_size", emb_size), ("hidden_size", hidden_size),
                         ("num_layers", num_layers)):
        check_int(value, f"model.{field}", 1)
    check_number(dropout, "model.dropout", 0, 1, high_open=True)
    if check_bool(tie_weights, "model.tie_weights") and emb_size != hidden_size:
        raise ConfigError(f"model.tie_weights needs model.emb_size == model.hidden_size (got "
                          f"emb_size={emb_size}, hidden_size={hidden_size})")


@register("lstm")
def lstm(num_classes: int, emb_size: int = 650, hidden_size: int = 650, num_layers: int = 2,
         dropout: float = 0.5, tie_weights: bool = True) -> nn.Module:
    """Word-level LSTM LM; ``num_classes`` is the vocabulary size (33,278 for WikiText-2)."""
    return LSTMLanguageModel(num_classes, emb_size=emb_size, hidden_size=hidden_size,
                             num_layers=num_layers, dropout=dropout, tie_weights=tie_weights)
