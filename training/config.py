"""Check the composed config before any process group starts.

Every check raises :class:`~core.errors.ConfigError` with one line naming the field and what
is allowed; the values of each group are checked by their owner (models, data, compression,
schedulers, core.lr, training.wandb_logger; the trainer's here). Hydra itself rejects an
unknown option of a group (listing the choices) and an override of a key that is not in the
config; a key added with ``+`` (``+trainer.foo=1``), or by a config file, is refused here:
the keys of each group are those of its option file in ``conf/`` (for the model, compressor and
scheduler: the parameters of their code), and the top-level ones those of ``conf/config.yaml``
and the groups.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import torch
import yaml
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

import compression
import data
import models
import schedulers
from core import numerics
from core.errors import (
    ConfigError,
    check_bool,
    check_choice,
    check_int,
    check_number,
    check_str,
)
from core.record import CHECKPOINT
from jobs import signals
from training import checkpoint, optim, tasks, wandb_logger

CONF = Path(__file__).resolve().parents[1] / "conf"
# Groups whose option file (conf/<group>/<name>.yaml) lists their keys.
KEYED_BY_FILE = ("dataset", "optimizer", "trainer", "logger")
# seed * 1000 + rank seeds NumPy, which takes seeds below 2**32.
SEED_MAX = (2**32 - 1000) // 1000
MAX_WORKERS = 256           # DataLoader processes per rank
MAX_TIMEOUT_S = 7 * 86400   # a collective waiting a week is a hang
MAX_BUCKET_MB = 65536       # DDP's bucket size in bytes must fit its integers
MAX_SIMULATED = 4096        # simulated learners in one process (memory grows with them)


def world_size(cfg: Any, processes: int) -> int:
    """The job's data-parallel workers: ``trainer.workers`` simulated learners in this one
    process, or (``trainer.workers: null``) its ``processes`` ranks. Checked first, before
    :func:`validate` checks the batch against it."""
    workers = cfg.trainer.get("workers")
    if workers is None:
        return processes
    check_int(workers, "trainer.workers", 1, MAX_SIMULATED)
    if processes > 1:
        raise ConfigError(f"trainer.workers: {workers} simulated learners run in one process, "
                          f"but this is one of {processes} ranks; start it without torchrun "
                          f"(launcher=simulated), or set trainer.workers=null for real ranks")
    return int(workers)


def validate(cfg: Any, world_size: int, run_dir: Path) -> None:
    """Validate ``cfg`` for a job of ``world_size`` ranks writing to ``run_dir``."""
    check_known_keys(cfg)
    _check_resolves(cfg, skip=("model",))  # the model's keys come from the data's: see below
    # Read a resolved copy (the model's keys still interpolated): each interpolation is then
    # parsed once, not at every read.
    cfg = OmegaConf.create({key: OmegaConf.to_container(cfg[key], resolve=key != "model")
                            if OmegaConf.is_config(cfg[key]) else cfg[key] for key in cfg})
    check_str(cfg.name, "name")
    check_int(cfg.seed, "seed", 0, SEED_MAX)
    if not (isinstance(cfg.resume, bool) or cfg.resume == "auto"):
        raise ConfigError(f"resume: expected true, false or auto, got {cfg.resume!r}")
    _check_trainer(cfg.trainer, world_size)
    optim.check(cfg.optimizer)
    data.check(cfg.dataset)  # before the model: the model's sizes come from the data's
    _check_model_fits_data(cfg.model, cfg.dataset)
    _check_resolves(cfg, only="model")
    model = cfg.model
    if cfg.dataset.get("num_classes", 0) is None and model.get("num_classes") is None:
        model = OmegaConf.merge(model, {"num_classes": 2})  # the data's files will tell
    models.check(model)
    compressor = compression.build_compressor(cfg.compressor)
    compression.overlap.from_config(cfg.observe)
    schedulers.build(cfg.scheduler).validate(compressor, cfg.trainer.batch_size, world_size)
    wandb_logger.check(cfg.logger)
    if cfg.variant not in cfg.variants:
        raise ConfigError(f"variant: {cfg.method or 'this run'} has no {cfg.variant!r} "
                          f"implementation; choose one of {list(cfg.variants)}")
    if cfg.resume is True and not (run_dir / CHECKPOINT).is_file():
        raise ConfigError(f"resume: no {CHECKPOINT} in {run_dir}; pass the run's directory as "
                          f"hydra.run.dir=<dir> to resume it")


def prepare(cfg: Any, bundle: Any, world_size: int, run_dir: Path) -> None:
    """After the data has loaded, still before any process group starts: take
    ``dataset.num_classes`` from the data where it is null, check every batch the run may use
    against the data, and whether the checkpoint can continue ``cfg`` (``resume=true``; with
    ``resume=auto`` rank 0 checks it once it has seen the run directory)."""
    if cfg.dataset.get("num_classes", 0) is None:
        cfg.dataset.num_classes = bundle.num_classes
    sizes = schedulers.build(cfg.scheduler).batch_sizes(cfg.trainer.batch_size)
    tasks.check_batches(bundle, sizes, cfg.trainer.eval_batch_size, world_size)
    if cfg.resume is True:
        checkpoint.check_resumable(run_dir, cfg, world_size)


def _check_resolves(cfg: Any, skip: tuple[str, ...] = (), only: str | None = None) -> None:
    """Every interpolation of the top-level keys (but ``skip``; or of ``only``) resolves: a
    ``${...}`` to a missing key or a bad resolver is a one-line error, not a traceback."""
    for key in [only] if only is not None else [k for k in cfg if k not in skip]:
        try:
            value = cfg[key]
            if OmegaConf.is_config(value):
                OmegaConf.to_container(value, resolve=True, throw_on_missing=True)
        except OmegaConfBaseException as exc:
            lines = str(exc).strip().splitlines() or [type(exc).__name__]
            raise ConfigError(f"{getattr(exc, 'full_key', None) or key}: {lines[0]}") from exc


def check_known_keys(cfg: Any) -> None:
    """ConfigError naming the first key that no config file declares (see the module doc)."""
    raw = OmegaConf.to_container(cfg, resolve=False) if OmegaConf.is_config(cfg) else cfg
    top = set(_keys(CONF / "config.yaml")) | {p.name for p in CONF.iterdir() if p.is_dir()}
    for key in raw:
        if key not in top:
            raise ConfigError(f"{key}: unknown key; expected one of {sorted(top)}")
    for group in KEYED_BY_FILE:
        node = raw.get(group)
        if not isinstance(node, dict):
            raise ConfigError(f"{group}: expected the {group} group's keys, got {node!r}")
        option = CONF / group / f"{node.get('name', 'default')}.yaml"
        files = [option] if option.is_file() else sorted((CONF / group).glob("*.yaml"))
        schema: dict[str, Any] = {}
        for path in files:
            schema.update(_keys(path))
        _check_node(node, schema, group)


def _check_node(node: dict[str, Any], schema: dict[str, Any], prefix: str) -> None:
    for key, value in node.items():
        if key not in schema:
            raise ConfigError(f"{prefix}.{key}: unknown key; expected one of {sorted(schema)}")
        if isinstance(schema[key], dict) and schema[key]:
            if not isinstance(value, dict):
                raise ConfigError(f"{prefix}.{key}: expected the keys {sorted(schema[key])}, got "
                                  f"{value!r}")
            _check_node(value, schema[key], f"{prefix}.{key}")


@cache
def _keys(path: Path) -> dict[str, Any]:
    """The keys an option file declares (nested ones as dicts), with those of the options its
    ``defaults`` list names in the same folder (read once per process: do not modify)."""
    text = yaml.safe_load(path.read_text()) or {}
    keys: dict[str, Any] = {}
    for item in text.pop("defaults", None) or []:
        if isinstance(item, str) and item != "_self_" and (path.parent / f"{item}.yaml").is_file():
            keys.update(_keys(path.parent / f"{item}.yaml"))
    keys.update(text)
    return keys


def _check_model_fits_data(model_cfg: Any, dataset: Any) -> None:
    """A model for token streams needs a language-model dataset; an image model, images of its
    own height and width (channels adapt through ``model.in_channels``)."""
    model = model_cfg.name
    spec = models.input_kind(model)  # an unknown name: refused, naming model.name
    wanted = "language_model" if spec["kind"] == "tokens" else "classification"
    if dataset.task != wanted:
        raise ConfigError(f"model.name: {model} takes {spec['kind']} but dataset {dataset.name} "
                          f"is a {dataset.task} dataset; pick a {wanted} dataset or another model")
    if spec["kind"] == "image":
        need, have = list(spec["shape"])[1:], list(dataset.input_shape)[1:]
        if "image_size" in model_cfg:  # a model built for another size than its default
            need = [model_cfg.image_size] * 2
        if need != have:
            raise ConfigError(f"model.name: {model} expects {need[0]}x{need[1]} images but dataset "
                              f"{dataset.name} has {have[0]}x{have[1]} (dataset.input_shape); "
                              f"pick a model made for {have[0]}x{have[1]} inputs")


def _check_trainer(t: Any, world_size: int) -> None:
    check_int(t.epochs, "trainer.epochs", 1)
    if t.get("workers") is not None:  # (world_size() checked it already when run.py starts)
        check_int(t.workers, "trainer.workers", 1, MAX_SIMULATED)
    check_int(t.batch_size, "trainer.batch_size", 1)
    check_int(t.eval_batch_size, "trainer.eval_batch_size", 1)
    if t.num_workers is not None:  # null: from the CPUs the rank has (training/tasks.py)
        check_int(t.num_workers, "trainer.num_workers", 0, MAX_WORKERS)
    if t.batch_size % world_size:
        raise ConfigError(f"trainer.batch_size: the global batch {t.batch_size} must be divisible "
                          f"by the world size {world_size}")
    if t.micro_batch_size is not None:
        check_int(t.micro_batch_size, "trainer.micro_batch_size", 1)
    check_choice(t.device, "trainer.device", ("auto", "cpu", "cuda"))
    if t.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("trainer.device: cuda requested but no CUDA device is available")
    check_bool(t.amp, "trainer.amp")
    if t.grad_clip is not None:
        check_number(t.grad_clip, "trainer.grad_clip", 0, low_open=True)
    check_number(t.dist_timeout_s, "trainer.dist_timeout_s", 0, MAX_TIMEOUT_S, low_open=True)
    check_number(t.bucket_cap_mb, "trainer.bucket_cap_mb", 0, MAX_BUCKET_MB, low_open=True)
    if t.progress != "auto" and not isinstance(t.progress, bool):
        raise ConfigError(f"trainer.progress: expected auto, true or false, got {t.progress!r}")
    check_number(t.progress_every_s, "trainer.progress_every_s", 0, low_open=True)
    numerics.check_mode(t.numerics)
    check_bool(t.deterministic, "trainer.deterministic")
    signals.check_names(t.preempt_signals)
    check_int(t.preempt_check_every, "trainer.preempt_check_every", 1)
