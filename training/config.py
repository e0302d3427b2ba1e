"""Check the composed config before any process group starts.

Every check raises :class:`~core.errors.ConfigError` with one line naming the field and what
is allowed. Hydra itself rejects unknown config-group options (listing the choices).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

import compression
import data
import models
import schedulers
from core import lr
from core.errors import ConfigError, check_int
from training import checkpoint, tasks


def validate(cfg: Any, world_size: int, run_dir: Path) -> None:
    """Validate ``cfg`` for a job of ``world_size`` ranks writing to ``run_dir``."""
    _check_trainer(cfg.trainer, world_size)
    lr.check(cfg.optimizer)
    if cfg.model.name not in models.available():
        raise ConfigError(f"model.name: unknown model {cfg.model.name!r}; choose one of "
                          f"{models.available()}")
    data.check(cfg.dataset)
    _check_model_fits_data(cfg.model.name, cfg.dataset)
    compressor = compression.build_compressor(cfg.compressor)
    schedulers.build(cfg.scheduler).validate(compressor, cfg.trainer.batch_size, world_size)
    if cfg.logger.name == "wandb" and cfg.logger.mode not in ("offline", "online", "disabled"):
        raise ConfigError(f"logger.mode: expected offline, online or disabled, got "
                          f"{cfg.logger.mode!r}")
    if cfg.resume:
        checkpoint.check_resumable(run_dir, cfg, world_size)


def check_batches(cfg: Any, bundle: Any, world_size: int) -> None:
    """ConfigError if a batch the run may use does not fit the loaded data (before the process
    group starts)."""
    sizes = schedulers.build(cfg.scheduler).batch_sizes(cfg.trainer.batch_size)
    tasks.check_batches(bundle, sizes, cfg.trainer.eval_batch_size, world_size)


def _check_model_fits_data(model: str, dataset: Any) -> None:
    """A model for token streams needs a language-model dataset; an image model, images of its
    own height and width (channels adapt through ``model.in_channels``)."""
    spec = models.input_kind(model)
    wanted = "language_model" if spec["kind"] == "tokens" else "classification"
    if dataset.task != wanted:
        raise ConfigError(f"model.name: {model} takes {spec['kind']} but dataset {dataset.name} "
                          f"is a {dataset.task} dataset; pick a {wanted} dataset or another model")
    if spec["kind"] == "image":
        need, have = list(spec["shape"])[1:], list(dataset.input_shape)[1:]
        if need != have:
            raise ConfigError(f"model.name: {model} expects {need[0]}x{need[1]} images but dataset "
                              f"{dataset.name} has {have[0]}x{have[1]} (dataset.input_shape); "
                              f"pick a model made for {have[0]}x{have[1]} inputs")


def _check_trainer(t: Any, world_size: int) -> None:
    check_int(t.epochs, "trainer.epochs", 1)
    check_int(t.batch_size, "trainer.batch_size", 1)
    check_int(t.eval_batch_size, "trainer.eval_batch_size", 1)
    check_int(t.num_workers, "trainer.num_workers", 0)
    if t.batch_size % world_size:
        raise ConfigError(f"trainer.batch_size: the global batch {t.batch_size} must be divisible "
                          f"by the world size {world_size}")
    micro = t.micro_batch_size
    if micro is not None and (isinstance(micro, bool) or not isinstance(micro, int) or micro < 1):
        raise ConfigError(f"trainer.micro_batch_size: expected null or an integer >= 1, got "
                          f"{micro!r}")
    if t.device not in ("auto", "cpu", "cuda"):
        raise ConfigError(f"trainer.device: expected auto, cpu or cuda, got {t.device!r}")
    if t.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("trainer.device: cuda requested but no CUDA device is available")
    if t.grad_clip is not None and not float(t.grad_clip) > 0:
        raise ConfigError(f"trainer.grad_clip: expected null or a number > 0, got {t.grad_clip}")
    if not float(t.dist_timeout_s) > 0:
        raise ConfigError(f"trainer.dist_timeout_s: expected > 0, got {t.dist_timeout_s}")
    if not float(t.bucket_cap_mb) > 0:
        raise ConfigError(f"trainer.bucket_cap_mb: expected > 0, got {t.bucket_cap_mb}")
    if t.progress not in ("auto", True, False):
        raise ConfigError(f"trainer.progress: expected auto, true or false, got {t.progress!r}")

