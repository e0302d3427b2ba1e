"""Small C kernels for the CPU hot loops: built once, cached, loaded with ctypes. In core (the
lowest layer) since both the compressors and core/exact_ops.py (from ``core/kernels/``) build
theirs with it.

The compressors' C sources are package data in ``compression/kernels/``: ``<name>.c`` for each
kernel, which includes ``prelude.h`` (headers, ``X86``, ``use_avx2()``). A kernel is plain C (no
torch headers, no ninja): it compiles in a fraction of a second with the system C compiler and
is cached as ``$XDG_CACHE_HOME/accordion-bench/<name>_<hash>.so``, keyed by the hash of its
sources, compiler and flags (older builds of the same kernel are removed). Constants that Python
and C share are defined here or in the kernel's Python module and handed to the compiler as
``-D`` flags.
Without a compiler, :meth:`Library.get` warns once and returns None, and the compressor runs its
eager torch path, which the kernel must match bit for bit (the tests check it).
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import torch

# -ffp-contract=off: no fused multiply-adds, so every float operation rounds as torch's does.
FLAGS = ("-O3", "-shared", "-fPIC", "-std=gnu11", "-ffp-contract=off", "-fno-fast-math")

STALE_S = 7 * 24 * 3600  # a build of other sources unused this long is removed

Signature = tuple[list[Any], Any]  # ctypes argtypes, restype

# The C sources, shipped with the package.
KERNELS = Path(__file__).resolve().parents[1] / "compression" / "kernels"  # Library's default
# Set in the environment, this variable makes use_avx2() (kernels/prelude.h) false: the tests'
# way to run the portable loops on any machine.
PORTABLE_ENV = "ACCORDION_BENCH_PORTABLE"
# Set in the environment, this variable makes use_avx512() false: the tests' way to run the AVX2
# paths on a CPU with AVX-512.
NO_AVX512_ENV = "ACCORDION_BENCH_NO_AVX512"


def compiler() -> str | None:
    """The C compiler kernels are built with: ``$CC``, else ``cc`` or ``gcc`` on the PATH."""
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")


def cache_dir() -> Path:
    """Where built kernels are kept."""
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "accordion-bench"


class Library:
    """The kernel ``name`` built from ``<directory>/<name>.c`` (by default ``kernels/``, the
    compressors'), exporting ``functions`` (name: signature); ``defines``: the constants it
    shares with Python (each a ``-D`` flag)."""

    def __init__(self, name: str, functions: dict[str, Signature],
                 defines: dict[str, int] | None = None, directory: Path = KERNELS) -> None:
        self.name, self.functions, self.directory = name, functions, directory
        macros = {"PORTABLE_ENV": f'"{PORTABLE_ENV}"', "NO_AVX512_ENV": f'"{NO_AVX512_ENV}"',
                  **(defines or {})}
        self.flags = (*FLAGS, *(f"-D{macro}={value}" for macro, value in macros.items()))
        self._lib: ctypes.CDLL | None = None
        self._tried = False

    def get(self) -> ctypes.CDLL | None:
        """The loaded library, built on first use; None (with one warning) if it cannot be."""
        if not self._tried:
            self._tried = True
            try:
                path = self._build()
                self._lib = self._load(path)
                self._remove_others(path)
            except (OSError, RuntimeError, subprocess.CalledProcessError) as exc:
                detail = getattr(exc, "stderr", "") or exc
                warnings.warn(f"{self.name}: the C kernel could not be built ({detail}); using "
                              f"the slower eager torch path", RuntimeWarning, stacklevel=3)
        return self._lib

    def reset(self) -> None:
        """Forget the loaded library: the next :meth:`get` builds (or finds) it again."""
        self._lib, self._tried = None, False

    def sources(self) -> dict[str, str]:
        """The C files the kernel is built from (file name: text): its ``.c`` and the headers."""
        files = [self.directory / f"{self.name}.c", *sorted(self.directory.glob("*.h"))]
        return {path.name: path.read_text(encoding="utf-8") for path in files}

    def _build(self) -> Path:
        cc = compiler()
        if cc is None:
            raise RuntimeError("no C compiler (cc, gcc or $CC) found")
        sources = self.sources()
        key = [*(part for item in sources.items() for part in item), cc, *self.flags]
        tag = hashlib.sha256("\0".join(key).encode()).hexdigest()
        cache = cache_dir()
        path = cache / f"{self.name}_{tag[:16]}.so"
        if path.exists():
            return path
        cache.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=cache) as tmp:
            for name, text in sources.items():  # compile exactly the text that was hashed
                (Path(tmp) / name).write_text(text, encoding="utf-8")
            src, lib = Path(tmp) / f"{self.name}.c", Path(tmp) / f"{self.name}.so"
            subprocess.run([cc, *self.flags, str(src), "-o", str(lib)], check=True,
                           capture_output=True, text=True)
            os.replace(lib, path)  # atomic: ranks building at once all load a whole file
        return path

    def _remove_others(self, path: Path) -> None:
        """Remove this kernel's builds unused for STALE_S (a loaded library stays mapped when
        unlinked). Recent ones stay: another checkout of other sources may be using them."""
        now = time.time()
        for old in path.parent.glob(f"{self.name}_*.so"):
            with contextlib.suppress(FileNotFoundError):
                if old != path and now - old.stat().st_atime > STALE_S:
                    old.unlink()

    def _load(self, path: Path) -> ctypes.CDLL:
        lib = ctypes.CDLL(str(path))
        for fn, (argtypes, restype) in self.functions.items():
            getattr(lib, fn).argtypes = argtypes
            getattr(lib, fn).restype = restype
        return lib


def pointers(tensors: list[torch.Tensor]) -> ctypes.Array:
    """The tensors' data pointers, as a C array."""
    return (ctypes.c_void_p * len(tensors))(*(t.data_ptr() for t in tensors))


def int64s(values: list[int]) -> ctypes.Array:
    """``values`` as a C array of int64."""
    return (ctypes.c_int64 * len(values))(*values)


def usable(dtype: torch.dtype, *tensors: torch.Tensor) -> bool:
    """Whether a kernel can take these tensors: contiguous CPU ones of ``dtype``."""
    return all(t.device.type == "cpu" and t.dtype == dtype and t.is_contiguous()
               for t in tensors)
