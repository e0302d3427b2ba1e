"""A sweep's runs: expanding its run groups, and the plan printed before anything starts.

A sweep file (conf/sweep/<name>.yaml) lists run groups under ``hydra.sweeper.groups``; each maps
override keys to a value or a list of values (or Hydra sweep syntax: ``0,1,2``, ``range(3)``).
A group's runs are the cross product of its lists; the sweep is the union of its groups, each
crossed with ``hydra.sweeper.params`` (like Hydra's basic sweeper). On the command line,

- a key that some group sets keeps only the matching runs (``model=resnet18``,
  ``method=rank2,rank1``): a filter, so a sweep can be run in part; a group key that the default
  config lacks (``compressor.conv_bin_size``) needs Hydra's ``+`` on the command line, which
  the filter ignores (``+compressor.conv_bin_size=5000``);
- any other key applies to every run (``seed=0``, ``trainer.epochs=5``, ``~dataset.noise``; it
  replaces the same key of ``params``);
- a group's ``scales: [paper]`` runs it at those scales only (``scale`` from the sweep's config).

:func:`make_plan` composes every run's config (through the caller's ``compose``), finds its
deterministic directory, what starting it would do (:mod:`jobs.runs`) and its compute
(model FLOPs on the meta device), and :meth:`Plan.describe` prints that before a sweep launches;
:meth:`Plan.show` prints each run's resolved config, or its difference from the defaults.

Composing is most of a plan's time, so runs that select the same config groups are composed once
(:func:`compose_runs`): their other overrides (``seed=1``, ``trainer.epochs=5``) set values, which
Hydra applies after composing, and are applied the same way to a copy.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import itertools
import json
import os
import statistics
import tempfile
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from hydra._internal.config_loader_impl import ConfigLoaderImpl
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig, OmegaConf, open_dict
from torch.utils.flop_counter import FlopCounterMode

import data
import models
from core.errors import ConfigError
from core.native import cache_dir
from core.record import flatten
from jobs import runs

GROUP_ONLY = ("scales",)  # group keys that select, not override
# Examples (or tokens) in the official files, for the compute estimate of file datasets.
NOMINAL_SIZES = {
    "cifar10": (50_000, 10_000), "cifar100": (50_000, 10_000), "mnist": (60_000, 10_000),
    "imagenet": (1_281_167, 50_000), "wikitext2": (2_088_628, 245_569),
    "shakespeare": (1_003_854, 111_540),
}
GPU_FLOPS = 5e12    # assumed sustained FLOP/s of one GPU (fp32, V100 class), for the estimate
CPU_FLOPS = 20e9    # assumed sustained FLOP/s of one CPU core on the tiny models (measured ~25)
START_S = 15.0      # process start, data and model set-up per run (tiny scale)
SHOW_MODES = ("config", "diff")  # what Plan.show prints per run (make plan SHOW=...)


def _values(key: str, value: Any, parser: OverridesParser, prefix: str = "") -> list[str]:
    """``key=v`` strings for a value: a YAML list, or Hydra's override syntax (``0,1,2``)."""
    if isinstance(value, list | tuple) or OmegaConf.is_list(value):
        return [f"{prefix}{key}={v}" for v in value]
    override = parser.parse_override(f"{key}={value}")
    if override.is_sweep_override():
        return [f"{prefix}{key}={v}" for v in override.sweep_string_iterator()]
    return [f"{prefix}{key}={override.get_value_element_as_str()}"]


def expand(groups: Iterable[dict[str, Any]], params: dict[str, Any], arguments: Sequence[str],
           scale: str | None = None) -> list[list[str]]:
    """Every run's overrides: each group's product x params, filtered and extended by the
    command line's ``arguments`` (see the module docstring)."""
    parser = OverridesParser.create()
    groups = [dict(g) for g in groups] or [{}]
    group_keys = {k for g in groups for k in g if k not in GROUP_ONLY}
    axes = {key: _values(key, value, parser) for key, value in (params or {}).items()}
    filters: dict[str, set[str]] = {}
    for arg in arguments:
        if "=" not in arg:  # ~key: Hydra deletes the key from every run
            axes[arg.lstrip("~")] = [arg]
            continue
        key_part, value = arg.split("=", 1)
        key = key_part.lstrip("+~")
        if key in group_keys:  # matched against the group's own key=value: no +/~ prefix
            filters[key] = set(_values(key, value, parser))
        else:
            axes.pop(key, None)  # the command line replaces a param; new keys go last
            axes[key] = _values(key, value, parser, prefix=key_part[: len(key_part) - len(key)])
    jobs: list[list[str]] = []
    for group in groups:
        if "scales" in group and scale not in list(group["scales"]):
            continue
        own = {k: _values(k, v, parser) for k, v in group.items() if k not in GROUP_ONLY}
        rest = [v for k, v in axes.items() if k not in own]
        for combo in itertools.product(*own.values(), *rest):
            if all(not allowed.isdisjoint(combo) for allowed in filters.values()):
                jobs.append(list(combo))
    if not jobs:
        shown = " ".join(f"{k}={','.join(sorted(v.split('=', 1)[1] for v in vals))}"
                         for k, vals in sorted(filters.items()))
        raise ConfigError(f"sweep: no run matches {shown or 'the sweep'}; the sweep's groups "
                          f"set {sorted(group_keys)}")
    return jobs


@dataclass
class Job:
    """One run of the plan."""

    overrides: list[str]
    cfg: DictConfig
    run_dir: Path
    action: runs.Action | None   # None: refused (the directory holds another config)
    problem: str | None = None   # why it is refused
    flops: float = 0.0


@dataclass
class Plan:
    """A sweep's runs and what launching it would do."""

    name: str
    scale: str | None
    workers: int                 # processes per run (ranks; 1 for simulated learners)
    jobs: list[Job] = field(default_factory=list)
    parallel: int = 1            # runs launched at once
    measured: Rates | None = None  # this machine's measured rates (tiny scale)

    def todo(self) -> list[Job]:
        """The runs a launch starts (all but the completed and the refused ones)."""
        return [j for j in self.jobs if j.action not in (runs.Action.SKIP, None)]

    def count(self, action: runs.Action | None) -> int:
        """How many runs would do ``action``."""
        return sum(1 for j in self.jobs if j.action is action)

    def describe(self) -> str:
        """The plan in a few lines: runs by state, compute, conflicts."""
        a = runs.Action
        flops = sum(j.flops for j in self.todo())
        lines = [f"sweep {self.name} ({self.scale or 'no'} scale): {len(self.jobs)} runs: "
                 f"{self.count(a.SKIP)} complete, {self.count(a.RESUME)} to resume, "
                 f"{self.count(a.RERUN)} failed to rerun, {self.count(a.START)} to start"
                 + (f", {self.count(None)} refused" if self.count(None) else ""),
                 f"  compute of the {len(self.todo())} to run: {flops / 1e15:.3g} PFLOP, "
                 f"about {self._device_time(flops)}"]
        if self.scale == "tiny" and self.measured is not None and any(
                str(j.cfg.model.name) in self.measured.per_model for j in self.todo()):
            lines.append(self._measured_time())
        return "\n".join(lines)

    def cores(self) -> int:
        """The CPU cores a tiny launch keeps busy: a core per process, runs side by side."""
        return self.workers * self.parallel

    def core_minutes(self, measured: bool = False, every: bool = False) -> float:
        """CPU core-minutes of the runs to do at tiny scale (``every``: of all the plan's runs,
        complete ones too): their FLOPs at the assumed rate (or, ``measured``, at
        :attr:`measured`'s rate of their model, else the median of all), plus the start-up of
        each process."""
        todo = self.jobs if every else self.todo()
        if measured and self.measured is not None:
            rates, overall = self.measured.per_model, self.measured.overall
            seconds = sum(j.flops / rates.get(str(j.cfg.model.name), (overall, 0))[0]
                          for j in todo)
        else:
            seconds = sum(j.flops for j in todo) / CPU_FLOPS
        return (seconds + len(todo) * START_S * self.workers) / 60

    def _measured_time(self) -> str:
        """The tiny estimate again at the FLOP rates this machine's complete runs reached."""
        assert self.measured is not None
        rates, todo, overall = self.measured.per_model, self.todo(), self.measured.overall
        minutes, cores = self.core_minutes(measured=True), self.cores()
        used = sorted({str(j.cfg.model.name) for j in todo} & rates.keys())
        assumed = sum(str(j.cfg.model.name) not in rates for j in todo)
        return (f"  at the rates measured here ({self.measured.machine}; median GFLOP/s per core "
                f"of the complete tiny runs below {self.measured.root}: "
                + ", ".join(f"{m} {rates[m][0] / 1e9:.1f} ({rates[m][1]} runs)" for m in used)
                + f"): about {minutes / cores:.0f} min on {_count(cores, 'core')}"
                + (f" ({assumed} runs of models without records at the median of all "
                   f"{sum(n for _, n in rates.values())}: {overall / 1e9:.1f})" if assumed else ""))

    def show(self, mode: str, defaults: DictConfig | None = None) -> str:
        """Each run's resolved config (``mode="config"``: what its ``config.yaml`` will hold) or
        the keys where it differs from ``defaults`` (``mode="diff"``: ``key: default -> run``,
        values as JSON)."""
        if mode not in SHOW_MODES:
            raise ConfigError(f"hydra.sweeper.show: {mode!r}; expected one of {list(SHOW_MODES)}")
        base = flatten(resolved(defaults)) if defaults is not None else {}
        blocks = []
        for num, job in enumerate(self.jobs, 1):
            action = job.action.value if job.action is not None else "refused"
            head = f"run {num}/{len(self.jobs)}: {job.run_dir} ({action})"
            if mode == "config":
                body = OmegaConf.to_yaml(resolved(job.cfg)).rstrip("\n").split("\n")
            else:
                ours = flatten(resolved(job.cfg))
                body = [f"{key}: {_shown(base, key)} -> {_shown(ours, key)}"
                        for key in sorted(base.keys() | ours.keys())
                        if base.get(key, ...) != ours.get(key, ...)]
            blocks.append("\n".join([head, *("  " + line for line in body)]))
        return "\n".join(blocks)

    def _device_time(self, flops: float) -> str:
        if self.scale == "tiny":
            minutes, cores = self.core_minutes(), self.cores()
            return (f"{minutes:.0f} CPU core-minutes ({minutes / cores:.0f} min on "
                    f"{_count(cores, 'core')}; {CPU_FLOPS / 1e9:.0f} GFLOP/s per core assumed)")
        hours = flops / GPU_FLOPS / 3600
        return (f"{hours:.0f} GPU-hours ({hours / self.workers:.0f} h on "
                f"{_count(self.workers, 'GPU')}, "
                f"one run after another; {GPU_FLOPS / 1e12:.0f} TFLOP/s per GPU assumed)")


def _count(n: int, noun: str) -> str:
    """``1 core``, ``2 cores``."""
    return f"{n} {noun}" + ("" if n == 1 else "s")


@dataclass
class Rates:
    """FLOP/s of one core that a machine's complete tiny runs reached, per model name."""

    machine: str                            # provenance.machine_label: CPU, ISA, cores, numerics
    root: Path                              # where the records were read
    per_model: dict[str, tuple[float, int]]  # model name: (median FLOP/s, runs)
    overall: float = CPU_FLOPS               # the median of every run (for other models)


def measured_rates(root: Path, machine: str) -> Rates:
    """The rates of the complete tiny runs below ``root`` whose last start ran on ``machine``
    (a :func:`core.provenance.machine_label`): :func:`run_flops` of each run's config over its
    recorded ``total_time_s`` and its processes (one for simulated learners, else one per
    rank, each on a core of its own as sweeps run them), the median per model. Runs that shared
    their cores with another sweep lower it."""
    found: dict[str, list[float]] = {}
    cache: dict[str, float] = {}
    for summary in sorted(root.rglob("summary.json")) if root.is_dir() else []:
        with contextlib.suppress(OSError, ValueError, KeyError, IndexError, TypeError):
            record = json.loads(summary.read_text())
            start = record["starts"][-1]
            if record["status"] != "completed" or start["machine"] != machine \
                    or float(record["total_time_s"]) <= 0:
                continue
            processes = 1 if start["launcher"] == "simulated" else int(start["world_size"])
            cfg = OmegaConf.load(summary.parent / "config.yaml")
            if cfg.get("scale") == "tiny":
                rate = run_flops(cfg, cache) / float(record["total_time_s"]) / processes
                found.setdefault(str(cfg.model.name), []).append(rate)
    every = [r for v in found.values() for r in v]
    return Rates(machine, root, {m: (float(statistics.median(v)), len(v))
                                 for m, v in sorted(found.items())},
                 float(statistics.median(every)) if every else CPU_FLOPS)


def rates_here(root: Path, numerics: str) -> Rates:
    """:func:`measured_rates` of the runs below ``root`` that ran on this machine under
    ``numerics`` (trainer.numerics)."""
    from core import provenance

    return measured_rates(root, provenance.machine_label(provenance.collect(numerics, 1, "plan")))


def make_plan(name: str, scale: str | None, workers: int, job_overrides: list[list[str]],
              compose: Callable[[list[str]], DictConfig],
              is_group: Callable[[str], bool] | None = None, parallel: int = 1,
              measured: Rates | None = None) -> Plan:
    """Compose every run (:func:`compose_runs`) and find what launching it would do
    (``workers``: processes per run, ``parallel``: runs at once; ``measured``: this machine's
    rates, for a second estimate of a tiny plan's time)."""
    plan = Plan(name, scale, workers, parallel=parallel, measured=measured)
    flops_cache: dict[str, float] = {}
    for num, (overrides, cfg) in enumerate(zip(job_overrides,
                                               compose_runs(job_overrides, compose, is_group),
                                               strict=True)):
        with open_dict(cfg):
            cfg.hydra.job.num = num
        run_dir = Path(str(cfg.hydra.sweep.dir)) / str(cfg.hydra.sweep.subdir)
        job = Job(overrides, cfg, run_dir, None)
        try:
            job.action = runs.decide(cfg, run_dir, int(cfg.trainer.get("workers") or workers))
        except ConfigError as exc:
            job.problem = str(exc)
        job.flops = run_flops(cfg, flops_cache)
        plan.jobs.append(job)
    return plan


def compose_runs(job_overrides: list[list[str]], compose: Callable[[list[str]], DictConfig],
                 is_group: Callable[[str], bool] | None = None) -> list[DictConfig]:
    """Every run's config, composing once per selection of config groups.

    ``is_group(key)`` tells a config group from a config key (Hydra's test: the config repository's
    ``group_exists``). An override that selects a group (``model=resnet18``) changes what is
    composed; any other (``seed=1``, ``trainer.epochs=5``, a dict value) sets a value, which Hydra
    applies to the composed config with ``ConfigLoaderImpl._apply_overrides_to_config``. Runs of
    the same groups are composed once and get their values applied the same way to a copy: the
    run's config is Hydra's, except that ``hydra.overrides.task`` and
    ``hydra.job.override_dirname`` list only the group overrides. Without ``is_group`` every run
    is composed whole.
    """
    if is_group is None:
        return [compose(list(overrides)) for overrides in job_overrides]
    parser = OverridesParser.create()
    bases: dict[tuple[str, ...], DictConfig] = {}
    out = []
    for overrides in job_overrides:
        groups: list[str] = []
        values = []
        for override in parser.parse_overrides(list(overrides)):
            if isinstance(override.value(), dict) or not is_group(override.key_or_group):
                values.append(override)  # Hydra's own split (hydra/_internal/defaults_list.py)
            else:
                groups.append(override.input_line)
        if (key := tuple(groups)) not in bases:
            bases[key] = compose(groups)
        cfg = copy.deepcopy(bases[key])
        # Hydra's own step (private; hydra-core is pinned to 1.3.x, and tests/unit/test_plan.py
        # compares the result with Hydra's whole composition).
        ConfigLoaderImpl._apply_overrides_to_config(values, cfg)
        out.append(cfg)
    return out


def resolved(cfg: DictConfig) -> dict[str, Any]:
    """A composed config as plain data, interpolations resolved, without Hydra's own node: what
    a run records in ``config.yaml``."""
    task = OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"])
    out = OmegaConf.to_container(task, resolve=True)
    assert isinstance(out, dict)
    return out


def _shown(flat: dict[str, Any], key: str) -> str:
    return json.dumps(flat[key]) if key in flat else "(absent)"


def check_directories(plan: Plan) -> None:
    """ConfigError if any run's directory holds another config: a sweep's runs share one config
    apart from their axes, so nothing of it is launched (the first such run is named)."""
    refused = [j for j in plan.jobs if j.action is None]
    if refused:
        others = f" (and {len(refused) - 1} more runs)" if len(refused) > 1 else ""
        raise ConfigError(f"{refused[0].problem}{others}")


def check_data(plan: Plan) -> None:
    """ConfigError (one line: the file and the expected layout) for the first missing dataset."""
    seen: set[str] = set()
    for job in plan.todo():
        key = OmegaConf.to_yaml(job.cfg.dataset)
        if key not in seen:
            seen.add(key)
            data.check(job.cfg.dataset)


def run_flops(cfg: DictConfig, cache: dict[str, float] | None = None) -> float:
    """Estimated FLOPs of one run: 3x the forward pass per training example (or token), 1x per
    test example, every epoch (model FLOPs counted on the meta device; no data is loaded)."""
    cache = {} if cache is None else cache
    key = OmegaConf.to_yaml(cfg.model) + OmegaConf.to_yaml(cfg.dataset)
    if key not in cache:
        cache[key] = _forward_flops(cfg)
    train, test = _sizes(cfg.dataset)
    return float(cfg.trainer.epochs) * cache[key] * (3 * train + test)


def _forward_flops(cfg: DictConfig) -> float:
    """FLOPs of one example's forward pass (one token's, for language models), kept in
    :func:`flops_cache` across plans: counting them imports torch._dynamo (FlopCounterMode is a
    dispatch mode), about a second of every plan otherwise."""
    kwargs = OmegaConf.to_container(cfg.model, resolve=True)
    assert isinstance(kwargs, dict)
    language = cfg.dataset.task == "language_model"
    shape = [int(cfg.dataset.bptt)] if language else list(cfg.dataset.input_shape)
    key = hashlib.sha256(json.dumps([torch.__version__, _models_digest(), kwargs, language, shape],
                                    sort_keys=True, default=str).encode()).hexdigest()
    known = _read_flops_cache()
    if key not in known:
        known[key] = _count_flops(kwargs, language, shape)
        _write_flops_cache(known)
    return known[key]


def _count_flops(kwargs: dict[str, Any], language: bool, shape: list[int]) -> float:
    with torch.device("meta"):
        model = models.build(**kwargs)
        x = torch.zeros(1, *shape, dtype=torch.long) if language else torch.empty(1, *shape)
    with FlopCounterMode(display=False) as counter:
        model(x)
    return counter.get_total_flops() / (shape[0] if language else 1)


def _models_digest() -> str:
    """A hash of the models' sources: a cached count stands only for the code that made it."""
    digest = hashlib.sha256()
    for path in sorted(Path(models.__file__).parent.glob("*.py")):
        digest.update(path.name.encode() + path.read_bytes())
    return digest.hexdigest()


def flops_cache() -> Path:
    """The file of forward FLOPs counted so far, beside the C kernels' builds (keyed by the
    torch version, the models' sources, the model's config and the input's shape)."""
    return cache_dir() / "flops.json"


def _read_flops_cache() -> dict[str, float]:
    try:
        known = json.loads(flops_cache().read_text())
    except (OSError, ValueError):
        return {}
    return known if isinstance(known, dict) else {}


def _write_flops_cache(known: dict[str, float]) -> None:
    """Best effort, atomically (a plan beside another may write at the same time)."""
    path = flops_cache()
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False) as tmp:
            json.dump(known, tmp)
        os.replace(tmp.name, path)


def _sizes(dataset: DictConfig) -> tuple[int, int]:
    """(training examples or tokens, test examples or tokens) the run reads each epoch."""
    if "train_size" in dataset:
        train, test = int(dataset.train_size), int(dataset.test_size)
    elif "train_tokens" in dataset:
        train, test = int(dataset.train_tokens), int(dataset.test_tokens)
    else:
        train, test = NOMINAL_SIZES.get(dataset.name, (1437, 360))  # digits otherwise
    subset = dataset.get("subset")
    return (min(train, int(subset)) if subset else train), test
