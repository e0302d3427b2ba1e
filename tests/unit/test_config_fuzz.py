"""The config surface, fuzzed (hypothesis): every field of every option of every group.

Properties, on configs composed as `run.py` composes them and checked by the real validation
(``training.config.validate``: each group's owner checks its values):

1. a value of the wrong type for a field is refused with a ConfigError naming that field;
2. a number out of a field's range, likewise;
3. an unknown key, in any group or at the top, likewise;
4. any value at all (nested lists and dicts, NaN, huge numbers, interpolations) for any field is
   either refused with one line naming a field, or accepted, and then the run's parts build
   from it (model on the meta device, compressor, scheduler, LR schedule, the resolved config).

The examples are derandomized (the same on every run, so CI is stable); ``HYPOTHESIS_PROFILE=
explore`` draws new random ones (`make stress` does, with more examples). A few cases go through
the real command line as well: exit status 2, one line, no process group.
"""

from __future__ import annotations

import math
import os
import re
import tempfile
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from hydra import compose, initialize_config_dir
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from omegaconf import DictConfig, OmegaConf

import compression
import models
import schedulers
from core.errors import ConfigError
from core.lr import lr_at
from tests.conftest import CONF, TINY, run_cli, with_value
from training import config

settings.register_profile("ci", derandomize=True, database=None, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow], print_blob=True)
settings.register_profile("explore", database=None, deadline=None, max_examples=2000,
                          suppress_health_check=[HealthCheck.too_slow], print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
SCALE = 20 if os.environ.get("HYPOTHESIS_PROFILE") == "explore" else 1  # examples x SCALE

IMAGE_MODEL = ["model=resnet18", "model.width=8"]
# The companions each option is composed with (a model for its data, levels for a scheduler).
COMPANIONS = {
    "model": {"lstm": ["dataset=synthetic_text"], "char_lstm": ["dataset=synthetic_text"],
              "mnist_cnn": ["dataset=synthetic", "dataset.input_shape=[1,28,28]"],
              "alexnet": ["dataset=synthetic", "dataset.input_shape=[3,224,224]"],
              "resnet50": ["dataset=synthetic", "dataset.input_shape=[3,224,224]"]},
    "dataset": {"mnist": ["model=mnist_cnn", "dataset.download=true"],
                "cifar10": [*IMAGE_MODEL, "dataset.download=true"],
                "cifar100": [*IMAGE_MODEL, "dataset.download=true"],
                "imagenet": ["model=resnet50", "dataset.num_classes=2"],
                "wikitext2": ["model=lstm", "dataset.num_classes=null"],
                "shakespeare": ["model=char_lstm", "dataset.num_classes=null"],
                "synthetic_text": ["model=lstm"]},
    "scheduler": {**{name: ["compressor=topk"] for name in ("accordion", "accordion_joint")},
                  # the measured endpoints need 2 workers to measure the noise between
                  "accordion_auto": ["compressor=topk", "trainer.workers=2"],
                  "accordion_batch_auto": ["trainer.workers=2"]},
}
# Fields whose default is null or whose type the default does not tell: their kind.
KINDS = {
    "trainer.micro_batch_size": "int?", "trainer.grad_clip": "float?", "dataset.subset": "int?",
    "dataset.test_subset": "int?", "trainer.num_workers": "int?",
    "dataset.root": "str?", "compressor.block_size": "int?", "logger.entity": "str?",
    "logger.run_name": "str?", "logger.group": "str?", "logger.job_type": "str?",
    "trainer.dist_timeout_s": "float", "trainer.bucket_cap_mb": "float",
    "logger.init_timeout_s": "float", "logger.finish_timeout_s": "float",
    "dataset.rotation": "float", "scheduler.low": "level?", "scheduler.high": "level?",
    "trainer.progress": "choice", "trainer.numerics": "choice",
    "trainer.progress_every_s": "float", "optimizer.schedule.decay_factors": "list_float",
    "optimizer.schedule.milestones": "list_int", "optimizer.schedule.warmup_start_lr": "float",
    "optimizer.weight_decay": "float", "optimizer.momentum": "float", "optimizer.lr": "float",
    "scheduler.eta": "float", "dataset.noise": "float", "dataset.alpha": "float",
    "model.dropout": "float", "model.compression": "float", "dataset.test_fraction": "float",
    "dataset.smooth": "int?", "dataset.label_noise": "float", "scheduler.levels": "list_float?",
    "scheduler.batch_sizes": "list_int?", "scheduler.base_batch": "int?", "optimizer.eps": "float",
    "optimizer.betas": "list_float", "logger.tags": "list_str",
    "trainer.workers": "int?", "compressor.bucket_size": "int?", "compressor.clip": "float?",
    "compressor.clip_norm": "float?", "compressor.momentum": "float",
    "compressor.sample_ratio": "float",
    "scheduler.budget": "float?", "scheduler.epochs": "int?", "scheduler.batches": "list_int?",
    "scheduler.fraction_low": "float", "scheduler.fraction_high": "float",
    "scheduler.probe_sample": "float", "scheduler.rule": "choice",
}
CHOICE_FIELDS = ("trainer.device", "trainer.progress", "trainer.numerics", "logger.mode",
                 "compressor.reduce", "scheduler.lr_scaling", "dataset.eval_split",
                 "model.classifier", "dataset.task", "scheduler.rule")
# Allowed ranges, as the docs and the config files state them: (low, high, low_open,
# high_open); None = unbounded. Integer fields list their bounds as integers.
RANGES = {
    "seed": (0, 4294966), "trainer.epochs": (1, None), "trainer.batch_size": (1, None),
    "trainer.eval_batch_size": (1, None), "trainer.num_workers": (0, 256),
    "trainer.workers": (1, 4096),
    "trainer.micro_batch_size": (1, None), "trainer.grad_clip": (0.0, None, True),
    "trainer.dist_timeout_s": (0.0, 604800.0, True), "trainer.bucket_cap_mb": (0.0, 65536.0, True),
    "trainer.preempt_check_every": (1, None), "trainer.progress_every_s": (0.0, None, True),
    "optimizer.lr": (0.0, None, True), "optimizer.momentum": (0.0, 1.0, False, True),
    "optimizer.weight_decay": (0.0, None), "optimizer.schedule.warmup_epochs": (0, None),
    "optimizer.schedule.warmup_start_lr": (0.0, None, True),
    "compressor.seed": (0, None), "compressor.rank": (1, None),
    "compressor.ratio": (0.0, 1.0, True), "compressor.conv_bin_size": (1, 1 << 24),
    "compressor.fc_bin_size": (1, 1 << 24), "compressor.block_size": (1, 1 << 24),
    "scheduler.eta": (0.0, None, True), "scheduler.interval": (1, None),
    "scheduler.batch_low": (1, None), "scheduler.batch_high": (1, None),
    "dataset.subset": (1, None), "dataset.test_subset": (1, None),
    "dataset.rotation": (0.0, 180.0), "dataset.noise": (0.0, None),
    "dataset.train_size": (1, None), "dataset.test_size": (1, None),
    "dataset.vocab_size": (2, None), "dataset.alpha": (0.0, None, True),
    "dataset.train_tokens": (2, None), "dataset.test_tokens": (2, None), "dataset.bptt": (1, None),
    "dataset.test_fraction": (0.0, 1.0, True, True), "dataset.seed": (0, 2**63 - 1),
    "dataset.num_classes": (1, None),
    "model.width": (1, None), "model.dropout": (0.0, 1.0, False, True),
    "model.compression": (0.0, 1.0, True), "model.reduction": (1, None),
    "model.growth_rate": (1, None), "model.emb_size": (1, None), "model.hidden_size": (1, None),
    "model.num_layers": (1, None), "model.hidden": (1, None), "model.num_classes": (1, None),
    "model.in_channels": (1, None), "logger.init_timeout_s": (0.0, None, True),
    "logger.finish_timeout_s": (0.0, None, True),
    "dataset.modes": (1, None), "dataset.shift": (0, None), "dataset.smooth": (1, None),
    "dataset.label_noise": (0.0, 1.0), "optimizer.schedule.lag": (0, None),
    "scheduler.base_batch": (1, None), "optimizer.eps": (0.0, None, True),
    "compressor.levels": (1, 1 << 16), "compressor.bucket_size": (1, 1 << 24),
    "compressor.clip": (0.0, None, True), "compressor.clip_norm": (0.0, None, True),
    "compressor.momentum": (0.0, 1.0, False, True), "compressor.sample_ratio": (0.0, 1.0, True),
    "scheduler.budget": (0.0, None, True), "scheduler.epochs": (1, None),
    "scheduler.fraction_low": (0.0, None, True), "scheduler.fraction_high": (0.5, None),
    "scheduler.probe_steps": (1, None), "scheduler.probe_sample": (0.0, 1.0, True),
}
FIELD_LINE = re.compile(r"^[A-Za-z_][\w.]*(\[\d+\])?: \S")  # "trainer.epochs: expected ..."


# ---- the composed configs ----------------------------------------------------------------------
def data_root() -> Path:
    """Files the file-based datasets' checks look for (their existence, not their contents)."""
    from data.cifar import _CLASSES

    root = Path(tempfile.mkdtemp(prefix="fuzz-data-"))
    for cls in _CLASSES.values():
        folder = root / cls.base_folder
        folder.mkdir(parents=True, exist_ok=True)
        for name in [n for n, _ in cls.train_list + cls.test_list] + [cls.meta["filename"]]:
            (folder / name).touch()
    for split in ("train", "val"):
        for label in ("a", "b"):
            (root / "imagenet" / split / label).mkdir(parents=True, exist_ok=True)
    (root / "wikitext-2").mkdir(parents=True, exist_ok=True)
    for split in ("train", "valid", "test"):
        (root / "wikitext-2" / f"wiki.{split}.tokens").touch()
    (root / "shakespeare").mkdir(parents=True, exist_ok=True)
    (root / "shakespeare" / "input.txt").write_text("to be or not to be\n")
    return root


@cache
def bases() -> dict[tuple[str, str], DictConfig]:
    """(group, option) -> the config `run.py` would compose for that option."""
    root = data_root()
    out = {}
    with initialize_config_dir(str(CONF), version_base="1.3"):
        for group in GROUPS:
            for option in sorted(p.stem for p in (CONF / group).glob("*.yaml")):
                extra = COMPANIONS.get(group, {}).get(option, IMAGE_MODEL if group != "model"
                                                      else ["dataset=digits"])
                overrides = [f"{group}={option}", *extra]
                if option == "imagenet":
                    overrides.append(f"dataset.root={root / 'imagenet'}")
                elif group == "dataset" and option not in ("digits", "synthetic",
                                                           "synthetic_text"):
                    overrides.append(f"dataset.root={root}")
                cfg = compose("config", overrides=overrides)
                check(cfg)  # every base is valid: the fuzzing changes one thing
                out[(group, option)] = cfg
    return out


GROUPS = ("model", "dataset", "compressor", "scheduler", "optimizer", "trainer", "logger")


def fields() -> list[tuple[str, str, str]]:
    """(group, option, dotted field) for every field of every option file (read from the files,
    without composing), and the top-level keys."""
    out = []
    for group in GROUPS:
        for path in sorted((CONF / group).glob("*.yaml")):
            out += [(group, path.stem, f"{group}.{key}") for key in _flat(config._keys(path))]
    return out + [("trainer", "default", key) for key in ("name", "seed", "resume")]


def _flat(node: dict, prefix: str = "") -> list[str]:
    keys = []
    for key, value in node.items():
        keys += _flat(value, f"{prefix}{key}.") if isinstance(value, dict) and value else \
            [f"{prefix}{key}"]
    return keys


def kind(cfg: DictConfig, field: str) -> str:
    """The field's kind: int, float, bool, str, choice, list_int, list_float, list_str, level
    (a trailing ? when null is allowed)."""
    if field in KINDS:
        return KINDS[field]
    if field == "dataset.num_classes" and cfg.dataset.name in ("imagenet", "wikitext2",
                                                               "shakespeare", "synthetic_text"):
        return "int?"  # null: the data tells
    if field.endswith(".name") or field in CHOICE_FIELDS:
        return "choice"
    value = OmegaConf.select(cfg, field)
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "str"
    if OmegaConf.is_list(value):
        items = list(value)
        return "list_str" if items and isinstance(items[0], str) else "list_int"
    raise AssertionError(f"no kind for {field} = {value!r}: add it to KINDS")


def check(cfg: DictConfig) -> None:
    """The real validation, for one process (its trainer.workers simulated learners, else world
    size 1): it resolves every key and builds the model (on the meta device), the compressor and
    the scheduler; then the LR schedule."""
    config.validate(cfg, world_size=config.world_size(cfg, 1), run_dir=Path("/nonexistent"))
    for epoch in sorted({0, 1, cfg.trainer.epochs - 1, *cfg.optimizer.schedule.milestones}):
        assert math.isfinite(lr_at(cfg.optimizer, epoch))


def refused_naming(cfg: DictConfig, field: str) -> str:
    """The one-line message validation refuses ``cfg`` with; it must name ``field``."""
    with pytest.raises(ConfigError) as caught:
        check(cfg)
    message = str(caught.value)
    assert "\n" not in message and message.startswith(field), (field, message)
    assert message[len(field)] in ": [", (field, message)
    return message


# ---- value strategies -------------------------------------------------------------------------
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70),
                    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12))
ANY = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
    st.from_regex(r"[a-z]{1,6}", fullmatch=True), inner, max_size=2), max_leaves=6)
TEXT = st.text(max_size=12).filter(lambda s: "${" not in s)
COLLECTIONS = st.lists(st.integers(), min_size=1, max_size=3) | st.dictionaries(
    st.from_regex(r"[a-z]{1,6}", fullmatch=True), st.integers(), min_size=1, max_size=2)
FRACTIONAL = st.floats(allow_nan=False, allow_infinity=False).filter(lambda x: x != int(x))


def representatives(kind_: str) -> list[Any]:
    """One value of each wrong type for the field's kind (the cases every run checks)."""
    base = kind_.rstrip("?")
    null = [] if kind_.endswith("?") or base in ("choice", "level", "list_str") else [None]
    return {"int": ["12", 1.5, [1]], "float": ["0.5", True, {"a": 1}],
            "bool": ["true", 1, [True]], "str": [5, True, ["a"]],
            "choice": ["nope", 3, ["auto"]], "list_int": ["[1]", 3, [True]],
            "list_float": ["[1]", 3, ["a"]], "list_str": ["a", 3, [1]],
            "level": ["0.5", True, [0.5]]}[base] + null


def wrong_types(kind_: str, choices: tuple = ()) -> st.SearchStrategy:
    """Values that are not of the field's kind (null too, where null is not allowed)."""
    nullable = kind_.endswith("?")
    base = kind_.rstrip("?")
    null = st.nothing() if nullable else st.none()
    if base == "int":
        return st.one_of(TEXT, FRACTIONAL, st.booleans(), COLLECTIONS, null)
    if base == "float":
        return st.one_of(TEXT, st.booleans(), COLLECTIONS, null)
    if base == "bool":
        return st.one_of(TEXT, st.integers(), st.floats(allow_nan=False), COLLECTIONS, null)
    if base == "str":
        return st.one_of(st.integers(), st.floats(allow_nan=False), st.booleans(), COLLECTIONS,
                         null)
    if base == "choice":
        return st.one_of(TEXT.filter(lambda s: s not in choices), st.integers(),
                         st.floats(allow_nan=False), COLLECTIONS)
    if base in ("list_int", "list_float"):
        return st.one_of(TEXT, st.integers(), st.lists(TEXT, min_size=1, max_size=3),
                         st.lists(st.booleans(), min_size=1, max_size=2), null)
    if base == "list_str":
        return st.one_of(TEXT, st.integers(), st.lists(st.integers(), min_size=1, max_size=3))
    if base == "level":  # Top-K's ratio (the base configs' compressor)
        return st.one_of(TEXT, st.booleans(), COLLECTIONS)
    raise AssertionError(kind_)


def out_of_range(spec: tuple) -> st.SearchStrategy:
    """Numbers outside ``spec`` (see RANGES), NaN and inf included for real-valued fields."""
    low, high, low_open, high_open = (*spec, False, False)[:4]
    if isinstance(low, int) and not isinstance(low, float):
        below = st.integers(max_value=low - 1)
        return below if high is None else below | st.integers(min_value=high + 1)
    below = st.floats(max_value=low, exclude_max=not low_open, allow_nan=False)
    bad = below | st.just(math.nan) | st.just(math.inf) | st.just(-math.inf)
    if high is not None:
        bad = bad | st.floats(min_value=high, exclude_min=not high_open, allow_nan=False)
    return bad


# ---- the properties ----------------------------------------------------------------------------
FIELDS = fields()


def _choices(field: str) -> tuple:
    """The values a choice field allows."""
    import data

    names = {"model": models.available, "dataset": data.available,
             "compressor": compression.available, "scheduler": schedulers.available,
             "optimizer": lambda: ["sgd", "adam"], "logger": lambda: ["wandb", "none"]}
    if field.endswith(".name"):
        return tuple(names[field.split(".")[0]]())
    return {"trainer.device": ("auto", "cpu", "cuda"), "trainer.progress": ("auto",),
            "trainer.numerics": ("portable", "native"),
            "logger.mode": ("offline", "online", "disabled"), "compressor.reduce": ("mean", "sum"),
            "scheduler.lr_scaling": ("linear", "sqrt", "none"),
            "dataset.eval_split": ("test", "valid"), "model.classifier": ("cifar10", "cifar100"),
            "dataset.task": ("classification", "language_model"),
            "scheduler.rule": ("noise", "noise_abs", "budget")}[field]


@pytest.mark.slow
@pytest.mark.parametrize(("group", "option", "field"), FIELDS,
                         ids=[f"{o}:{f}" for _, o, f in FIELDS])
def test_each_wrong_type_is_refused_naming_the_field(group, option, field):
    cfg = bases()[(group, option)]
    for value in representatives(kind(cfg, field)):
        refused_naming(with_value(cfg, field, value), field)


@pytest.mark.slow
@settings(max_examples=100 * SCALE)
@given(where=st.sampled_from(FIELDS), data=st.data())
def test_wrong_type_is_refused_naming_the_field(where, data):
    group, option, field = where
    cfg = bases()[(group, option)]
    kind_ = kind(cfg, field)
    value = data.draw(wrong_types(kind_, _choices(field) if kind_ == "choice" else ()),
                      label="value")
    refused_naming(with_value(cfg, field, value), field)


RANGED = [(g, o, f) for g, o, f in FIELDS if f in RANGES]  # (kinds are checked below)


def edges(spec: tuple) -> list[float]:
    """The nearest values outside ``spec``'s range (and NaN, inf for real-valued fields)."""
    low, high, low_open, high_open = (*spec, False, False)[:4]
    if isinstance(low, int) and not isinstance(low, float):
        return [low - 1] + ([] if high is None else [high + 1])
    out = [low if low_open else math.nextafter(low, -math.inf), math.nan, math.inf]
    return out + ([] if high is None else [high if high_open else math.nextafter(high, math.inf)])


@pytest.mark.slow
@pytest.mark.parametrize(("group", "option", "field"), RANGED,
                         ids=[f"{o}:{f}" for _, o, f in RANGED])
def test_each_range_edge_is_refused_naming_the_field(group, option, field):
    for value in edges(RANGES[field]):
        refused_naming(with_value(bases()[(group, option)], field, value), field)


@pytest.mark.slow
@settings(max_examples=100 * SCALE)
@given(where=st.sampled_from(RANGED), data=st.data())
def test_out_of_range_is_refused_naming_the_field(where, data):
    group, option, field = where
    value = data.draw(out_of_range(RANGES[field]), label="value")
    refused_naming(with_value(bases()[(group, option)], field, value), field)


def test_every_numeric_field_has_a_stated_range():
    numeric = {f for g, o, f in FIELDS
               if kind(bases()[(g, o)], f).rstrip("?") in ("int", "float")}
    assert numeric - set(RANGES) == set()


IDENTIFIER = st.from_regex(r"[a-z][a-z_]{0,10}", fullmatch=True)
PLACES = ["", "model.", "dataset.", "compressor.", "scheduler.", "optimizer.",
          "optimizer.schedule.", "trainer.", "logger."]


@pytest.mark.slow
@settings(max_examples=40 * SCALE)
@given(base=st.sampled_from([(g, o) for g, o, f in FIELDS if f.endswith(".name")]),
       place=st.sampled_from(PLACES), key=IDENTIFIER, value=SCALARS)
def test_unknown_key_is_refused_naming_it(base, place, key, value):
    cfg = bases()[base]
    node = OmegaConf.select(cfg, place[:-1]) if place else cfg
    if key in node or _declared(cfg, place, key):
        return
    refused_naming(with_value(cfg, f"{place}{key}", value), f"{place}{key}")


def _declared(cfg: DictConfig, place: str, key: str) -> bool:
    """Whether ``key`` may be set at ``place`` though the composed config lacks it: a group's
    name at the top, a parameter of the model's code."""
    if not place:
        return (CONF / key).is_dir()
    if place == "model.":
        import inspect

        from models import REGISTRY
        return key in inspect.signature(REGISTRY.entries[cfg.model.name]).parameters
    return False


@pytest.mark.slow
@settings(max_examples=120 * SCALE)
@given(where=st.sampled_from(FIELDS), value=ANY)
def test_any_value_is_refused_in_one_line_or_runs(where, value):
    group, option, field = where
    cfg = with_value(bases()[(group, option)], field, value)
    try:
        check(cfg)
    except ConfigError as exc:
        assert "\n" not in str(exc) and FIELD_LINE.match(str(exc)), str(exc)


@pytest.mark.parametrize("text", ["${oops}", "${model.nope}", "${oc.env:NOPE_NOT_SET}"])
def test_broken_interpolation_is_one_line(text):
    cfg = with_value(bases()[("trainer", "default")], "trainer.epochs", text)
    refused_naming(cfg, "trainer.epochs")


# ---- through the command line ---------------------------------------------------------------
# WORLD_SIZE=2 with no rendezvous: had a process group started, the run would hang or fail to
# connect instead of exiting with status 2.
NO_GROUP = {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": "1"}


@pytest.mark.slow
@pytest.mark.parametrize(("override", "line"), [
    ("compressor=powersgd compressor.rank=-1",
     "error: compressor.rank: expected an integer >= 1, got -1"),
    ("+trainer.foo=1", "error: trainer.foo: unknown key; expected one of "),
    ("optimizer.lr=fast", "error: optimizer.lr: expected a number in (0, inf), got 'fast'"),
    ("trainer.epochs=${oops}", "error: trainer.epochs: Interpolation key 'oops' not found"),
    ("model.width=[8]", "error: model.width: expected an integer >= 1, got [8]"),
])
def test_cli_bad_field_is_one_line_exit_2_before_any_group(tmp_path, override, line):
    proc = run_cli([*TINY, *override.split(), f"hydra.run.dir={tmp_path}"], env=NO_GROUP,
                   timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    (got,) = proc.stderr.strip().splitlines()
    assert got.startswith(line), got
