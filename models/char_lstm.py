"""Character-level LSTM for Shakespeare, as in AdaComp (Chen et al., AAAI 2018).

The same network as the word-level model (:class:`models.lstm.LSTMLanguageModel`) with
character-model defaults: a 128-dimensional embedding, two LSTM layers of 512 units, no dropout,
untied decoder. ``num_classes`` is the character vocabulary size (65 for Karpathy's
tiny-shakespeare: 3,457,729 parameters).
"""

from __future__ import annotations

from torch import nn

from models import register
from models.lstm import LSTMLanguageModel, check_lstm

INPUT = {"kind": "tokens"}


@register("char_lstm")
def char_lstm(num_classes: int, emb_size: int = 128, hidden_size: int = 512, num_layers: int = 2,
              dropout: float = 0.0, tie_weights: bool = False) -> nn.Module:
    """Character-level LSTM; same interface as ``lstm`` (``forward``, ``init_hidden``)."""
    check_lstm(num_classes, emb_size, hidden_size, num_layers, dropout, tie_weights)
    return LSTMLanguageModel(num_classes, emb_size=emb_size, hidden_size=hidden_size,
                             num_layers=num_layers, dropout=dropout, tie_weights=tie_weights)
