"""Model zoo: every registered network trains one step on its input, and has the listed size."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch import nn

import models

# Exact parameter counts (docs/models-datasets.md's model table lists the same numbers).
# (name, num_classes, kwargs) -> parameters.
PARAM_COUNTS: dict[tuple[str, int, tuple[tuple[str, Any], ...]], int] = {
    ("resnet18", 10, ()): 11_173_962,
    ("vgg19bn", 10, ()): 20_565_834,
    ("vgg19bn", 100, (("classifier", "cifar100"),)): 39_327_652,
    ("senet18", 10, ()): 11_260_354,
    ("densenet", 10, ()): 1_000_618,
    ("googlenet", 10, ()): 6_166_250,
    ("alexnet", 1000, ()): 61_100_840,
    ("resnet50", 1000, ()): 25_557_032,
    ("lstm", 33278, ()): 28_434_378,
    ("lstm", 33278, (("num_layers", 3), ("dropout", 0.4))): 31_819_578,
    ("char_lstm", 65, ()): 3_457_729,
    ("mnist_cnn", 10, ()): 431_080,
    ("cifar10_cnn", 10, ()): 89_578,
}

# 224x224 ImageNet networks (about 1-2 s each for a CPU forward + backward at batch 2).
IMAGENET = {"alexnet", "resnet50"}
VOCAB, SEQ, BATCH = 50, 7, 2


@pytest.fixture(autouse=True, scope="module")
def _one_thread() -> Iterator[None]:
    # Batch-2 passes are too small to gain from intra-op threads, and on a shared 2-core machine
    # two threads contending with other processes run several times slower than one.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _n_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def test_every_model_listed() -> None:
    assert set(models.available()) == {key[0] for key in PARAM_COUNTS}


@pytest.mark.parametrize("name", models.available())
def test_forward_backward(name: str) -> None:
    torch.manual_seed(0)
    spec = models.input_kind(name)
    if spec["kind"] == "tokens":
        model = models.build(name, num_classes=VOCAB)
        x = torch.randint(0, VOCAB, (BATCH, SEQ))
        out, (h, c) = model(x)
        assert out.shape == (BATCH, SEQ, VOCAB)
        assert h.shape == c.shape == (model.num_layers, BATCH, model.hidden_size)
    else:
        assert spec["kind"] == "image"
        num_classes = 10
        model = models.build(name, num_classes=num_classes)
        out = model(torch.randn(BATCH, *spec["shape"]))
        assert out.shape == (BATCH, num_classes)
    out.float().pow(2).mean().backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None]
    assert not missing, f"no gradient for {missing}"
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())


@pytest.mark.parametrize(("key", "expected"), list(PARAM_COUNTS.items()),
                         ids=[f"{k[0]}-{k[1]}{'-' if k[2] else ''}"
                              + "-".join(f"{a}={b}" for a, b in k[2]) for k in PARAM_COUNTS])
def test_parameter_count(key: tuple[str, int, tuple[tuple[str, Any], ...]], expected: int) -> None:
    name, num_classes, kwargs = key
    assert _n_params(models.build(name, num_classes=num_classes, **dict(kwargs))) == expected


@pytest.mark.parametrize("name", ["resnet18", "senet18", "vgg19bn", "googlenet"])
def test_width_narrows_every_layer(name: str) -> None:
    # The tiny scale's width 8: every channel count x 8/64; at 64 the paper's network (above).
    full, narrow = (models.build(name, num_classes=10, width=w) for w in (64, 8))
    full_convs = [m for m in full.modules() if isinstance(m, nn.Conv2d)]
    narrow_convs = [m for m in narrow.modules() if isinstance(m, nn.Conv2d)]
    assert len(full_convs) == len(narrow_convs)
    for big, small in zip(full_convs[1:], narrow_convs[1:], strict=True):
        assert small.out_channels == max(1, big.out_channels * 8 // 64)
    assert _n_params(narrow) < _n_params(full) / 20
    out = narrow(torch.randn(BATCH, 3, 32, 32))
    out.pow(2).mean().backward()
    assert out.shape == (BATCH, 10)


@pytest.mark.parametrize("name", models.available())
def test_input_spec(name: str) -> None:
    spec = models.input_kind(name)
    assert spec["kind"] in ("image", "tokens")
    if spec["kind"] == "image":
        assert len(spec["shape"]) == 3


@pytest.mark.parametrize("name", [n for n in models.available()
                                  if models.input_kind(n)["kind"] == "image"])
def test_in_channels(name: str) -> None:
    model = models.build(name, num_classes=10, in_channels=1)
    first_conv = next(m for m in model.modules() if isinstance(m, nn.Conv2d))
    assert first_conv.in_channels == 1
    shape = models.input_kind(name)["shape"]
    if name not in IMAGENET:
        model.eval()
        with torch.no_grad():
            assert model(torch.randn(1, 1, *shape[1:])).shape == (1, 10)


def test_unknown_model_names_the_field() -> None:
    with pytest.raises(ValueError, match="model.name"):
        models.build("no_such_net", num_classes=10)
    with pytest.raises(ValueError, match="model.name"):
        models.input_kind("no_such_net")


def test_vgg_unknown_classifier() -> None:
    with pytest.raises(ValueError, match="model.classifier"):
        models.build("vgg19bn", num_classes=10, classifier="imagenet")


def test_vgg_dropout() -> None:
    # The authors' 0.5 by default; any probability in [0, 1), one line naming the field else.
    assert {m.p for m in models.build("vgg19bn", num_classes=10).modules()
            if isinstance(m, nn.Dropout)} == {0.5}
    none = models.build("vgg19bn", num_classes=100, classifier="cifar100", dropout=0.0)
    assert [m.p for m in none.modules() if isinstance(m, nn.Dropout)] == [0.0, 0.0, 0.0]
    with pytest.raises(ValueError, match=r"model\.dropout: expected a number in \[0, 1\)"):
        models.build("vgg19bn", num_classes=10, dropout=1.0)


def test_vgg_heads() -> None:
    small = models.build("vgg19bn", num_classes=10)
    big = models.build("vgg19bn", num_classes=100, classifier="cifar100")
    widths = [m.out_features for m in small.classifier if isinstance(m, nn.Linear)]
    assert widths == [512, 512, 10]
    widths = [m.out_features for m in big.classifier if isinstance(m, nn.Linear)]
    assert widths == [4096, 4096, 100]


def test_lstm_tie_weights_size_mismatch() -> None:
    with pytest.raises(ValueError, match=r"emb_size.*hidden_size|hidden_size.*emb_size"):
        models.build("lstm", num_classes=VOCAB, emb_size=32, hidden_size=64)
    # Untied, the sizes may differ.
    model = models.build("lstm", num_classes=VOCAB, emb_size=32, hidden_size=64, tie_weights=False)
    assert model(torch.randint(0, VOCAB, (BATCH, SEQ)))[0].shape == (BATCH, SEQ, VOCAB)


def test_lstm_tied_shares_embedding() -> None:
    model = models.build("lstm", num_classes=VOCAB, emb_size=16, hidden_size=16)
    assert model.decoder.weight is model.encoder.weight
    untied = models.build("char_lstm", num_classes=VOCAB)
    assert untied.decoder.weight is not untied.encoder.weight


def test_lstm_authors_setting() -> None:
    model = models.build("lstm", num_classes=VOCAB, emb_size=650, hidden_size=650, num_layers=3,
                         dropout=0.4, tie_weights=True)
    assert model.rnn.num_layers == 3 and model.rnn.hidden_size == 650
    assert model.rnn.dropout == pytest.approx(0.4) and model.drop.p == pytest.approx(0.4)


@pytest.mark.parametrize("name", ["lstm", "char_lstm"])
def test_lstm_hidden_state(name: str) -> None:
    torch.manual_seed(0)
    model = models.build(name, num_classes=VOCAB, emb_size=16, hidden_size=16, dropout=0.0).eval()
    h, c = model.init_hidden(BATCH, torch.device("cpu"))
    assert h.shape == c.shape == (model.num_layers, BATCH, 16)
    assert not h.any() and not c.any()
    x = torch.randint(0, VOCAB, (BATCH, 2 * SEQ))
    with torch.no_grad():
        whole, _ = model(x)
        first, state = model(x[:, :SEQ], model.init_hidden(BATCH, "cpu"))
        second, _ = model(x[:, SEQ:], state)
    # Carrying the state across two chunks equals one pass over the whole sequence.
    torch.testing.assert_close(torch.cat([first, second], dim=1), whole)
