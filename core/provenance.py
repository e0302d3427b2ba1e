"""Which machine and which code made a run: the provenance every run record carries.

At each start of a run (a fresh one, and each resumption), rank 0 collects (:func:`collect`):

- ``git``: the commit of the suite's checkout, whether the tree had uncommitted changes, and a
  SHA-256 of ``git diff HEAD`` (None outside a git checkout);
- ``versions``: Python, torch, torchvision, numpy, hydra, omegaconf, wandb and the suite;
- ``cpu``: model, vendor, logical CPUs, the ISA flags that select code paths (AVX2, AVX-512,
  AMX, FMA) and the widest of them, torch's CPU capability in effect, MKL's and oneDNN's
  versions;
- ``numerics``: the mode and what it left in effect (:func:`core.numerics.state`: capability,
  MKL branch, oneDNN on or off, intra/inter-op threads, the relevant variables);
- ``cuda``: GPU model and count, driver, CUDA, cuDNN and NCCL versions (None without CUDA);
- ``world_size``, ``launcher``, ``hostname``;
- ``fingerprint``: 12 hex digits of a hash of the fields that can change a run's numbers on
  the same commit and config (everything above but git, hostname, world size and launcher),
  and ``machine``, a short label for people.

The record keeps every start in ``starts.jsonl`` (one JSON line each, with the epoch it started
from); ``summary.json`` repeats the last one as ``provenance`` and all of them as ``starts``
(:func:`core.record.write_summary`), and the W&B run's config holds it as ``provenance.*``.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import platform
import socket
import subprocess
from pathlib import Path
from typing import Any

from core import numerics

ROOT = Path(__file__).resolve().parents[1]  # the suite's checkout
ISA_FLAGS = ("fma", "avx", "avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_tile",
             "amx_bf16", "neon", "sve")
PACKAGES = ("torch", "torchvision", "numpy", "hydra-core", "omegaconf", "wandb",
            "accordion-bench")
# Keys whose values are this start's, not the machine's: left out of the fingerprint.
NOT_MACHINE = ("git", "hostname", "world_size", "launcher", "fingerprint", "machine", "epoch")


def collect(mode: str, world_size: int, launcher: str) -> dict[str, Any]:
    """This process's provenance (call after :func:`core.numerics.apply`)."""
    import torch

    prov: dict[str, Any] = {
        "git": git_state(),
        "versions": {"python": platform.python_version(), **_versions()},
        "cpu": _cpu(torch),
        "numerics": {"mode": mode, **numerics.state()},
        "cuda": _cuda(torch),
        "world_size": world_size,
        "launcher": launcher,
        "hostname": socket.gethostname(),
    }
    prov["fingerprint"] = fingerprint(prov)
    prov["machine"] = machine_label(prov)
    return prov


def made_here(mode: str = "native") -> str:
    """This machine and checkout in words, for a benchmark table's heading: the machine's label,
    its fingerprint and the commit (and whether code had uncommitted changes)."""
    prov = collect(mode, 1, "benchmark")
    commit = prov["git"]["commit"]
    code = "no git commit" if commit is None else f"commit {commit[:10]}" + (
        " with uncommitted changes" if code_changed() else "")
    return f"{prov['machine']} (fingerprint {prov['fingerprint']}), {code}"


# What cannot change a number: the results and pages that make targets rewrite (results/, the
# generated blocks of docs/ and the README: tools/docs.py), and markdown anywhere. Git pathspecs.
NOT_CODE = (":!results", ":!docs", ":!*.md")


def code_changed(root: Path = ROOT) -> bool:
    """Whether tracked files other than :data:`NOT_CODE` (the tables benchmarks write, which
    change while one benchmark follows another) differ from HEAD."""
    done = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no",
                           "--", ".", *NOT_CODE], capture_output=True, text=True, check=False)
    return bool(done.stdout.strip())


def fingerprint(prov: dict[str, Any]) -> str:
    """12 hex digits identifying the machine and software that can change the numbers."""
    machine = {k: v for k, v in prov.items() if k not in NOT_MACHINE}
    return hashlib.sha256(json.dumps(machine, sort_keys=True).encode()).hexdigest()[:12]


def machine_label(prov: dict[str, Any]) -> str:
    """E.g. ``Intel(R) Xeon(R) Processor (AVX512) x2, portable`` or ``... + 4x NVIDIA H100``."""
    cpu, cuda = prov["cpu"], prov.get("cuda")
    label = f"{cpu['model']} ({cpu['isa']}) x{cpu['logical_cpus']}, " \
            f"{prov['numerics']['mode']}"
    if cuda:
        label += f" + {cuda['device_count']}x {cuda['device']}"
    return label


def git_state(root: Path = ROOT) -> dict[str, Any]:
    """``{"commit", "dirty", "diff_sha256"}`` of the checkout at ``root`` (untracked files count
    as changes; their names, not contents, enter the hash; :data:`NOT_CODE` does not: a sweep's
    own reports and refreshed pages leave the next run's checkout clean); Nones outside a git
    checkout."""
    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(["git", "-C", str(root), *args], capture_output=True,
                                 timeout=30, check=True)
        except (OSError, subprocess.SubprocessError):
            return None
        return out.stdout.decode(errors="replace")

    commit = git("rev-parse", "HEAD")
    if commit is None:
        return {"commit": None, "dirty": None, "diff_sha256": None}
    diff = (git("diff", "HEAD", "--binary", "--", ".", *NOT_CODE) or "") + (
        git("ls-files", "--others", "--exclude-standard", "--", ".", *NOT_CODE) or "")
    return {"commit": commit.strip(), "dirty": bool(diff),
            "diff_sha256": hashlib.sha256(diff.encode()).hexdigest() if diff else None}


def _versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for package in PACKAGES:
        try:
            out[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            out[package] = None
    return out


def _cpu(torch: Any) -> dict[str, Any]:
    info = _cpuinfo()
    config = torch.__config__.show()
    flags = [f for f in ISA_FLAGS if f in info.get("flags", "").split()]
    return {"model": info.get("model name") or platform.processor() or platform.machine(),
            "vendor": info.get("vendor_id"),
            "arch": platform.machine(),
            "logical_cpus": os.cpu_count(),
            "flags": flags,
            "isa": next((name for flag, name in (("avx512f", "AVX512"), ("avx2", "AVX2"),
                                                 ("sve", "SVE"), ("neon", "NEON"))
                         if flag in flags), platform.machine()),
            "capability": torch.backends.cpu.get_cpu_capability(),
            "mkl": _after(config, "Math Kernel Library Version "),
            "onednn": _after(config, "MKL-DNN v")}


def _cpuinfo() -> dict[str, str]:
    """The first processor's fields of /proc/cpuinfo (empty where there is none)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return {}
    fields: dict[str, str] = {}
    for line in text.split("\n\n")[0].splitlines():
        key, _, value = line.partition(":")
        fields[key.strip()] = value.strip()
    return fields


def _after(text: str, marker: str) -> str | None:
    """The word after ``marker`` in ``text`` (None if absent)."""
    start = text.find(marker)
    return None if start < 0 else text[start + len(marker):].split()[0]


def _cuda(torch: Any) -> dict[str, Any] | None:
    if not torch.cuda.is_available():
        return None
    nccl = torch.cuda.nccl.version() if torch.distributed.is_nccl_available() else None
    return {"device": torch.cuda.get_device_name(0),
            "device_count": torch.cuda.device_count(),
            "driver": _driver(),
            "cuda": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version(),
            "nccl": ".".join(map(str, nccl)) if isinstance(nccl, tuple) else nccl,
            "tf32_matmul": torch.backends.cuda.matmul.allow_tf32,
            "tf32_cudnn": torch.backends.cudnn.allow_tf32}


def _driver() -> str | None:
    """The NVIDIA driver's version (None if unknown)."""
    try:
        return Path("/proc/driver/nvidia/version").read_text().split("Kernel Module")[1].split()[0]
    except (OSError, IndexError):
        return None
