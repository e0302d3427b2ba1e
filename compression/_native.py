"""Small C kernels for the compressors' CPU hot loops: built once, cached, loaded with ctypes.

Each kernel's source follows :data:`PRELUDE` (headers, ``X86``, ``use_avx2()``).
A kernel is plain C (no torch headers, no ninja): it compiles in a fraction of a second with the
system C compiler and is cached as ``$XDG_CACHE_HOME/accordion-bench/<name>_<hash>.so``, keyed
by the hash of its source, compiler and flags (older builds of the same kernel are removed).
Without a compiler, :meth:`Library.get` warns once and returns None, and the compressor runs its
eager torch path, which the kernel must match bit for bit (the tests check it).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
import warnings
from pathlib import Path
from typing import Any

import torch

# -ffp-contract=off: no fused multiply-adds, so every float operation rounds as torch's does.
FLAGS = ("-O3", "-shared", "-fPIC", "-std=gnu11", "-ffp-contract=off", "-fno-fast-math")

Signature = tuple[list[Any], Any]  # ctypes argtypes, restype

# What every kernel's C source starts with: the headers, X86 where the AVX2 code paths can be
# built, and use_avx2(): whether to take them (the CPU has AVX2, and PORTABLE_ENV is not set:
# the tests' way to run the portable loops on any machine).
PORTABLE_ENV = "ACCORDION_BENCH_PORTABLE"
PRELUDE = r"""
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define X86 1
#endif
static int use_avx2(void) {
    static int cached = -1;
    if (cached < 0) {
        cached = 0;
#ifdef X86
        cached = __builtin_cpu_supports("avx2") && !getenv("ACCORDION_BENCH_PORTABLE");
#endif
    }
    return cached;
}
"""


def compiler() -> str | None:
    """The C compiler kernels are built with: ``$CC``, else ``cc`` or ``gcc`` on the PATH."""
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")


def cache_dir() -> Path:
    """Where built kernels are kept."""
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "accordion-bench"


class Library:
    """The kernel ``name`` built from C ``source``, exporting ``functions`` (name: signature)."""

    def __init__(self, name: str, source: str, functions: dict[str, Signature]) -> None:
        self.name, self.source, self.functions = name, PRELUDE + source, functions
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

    def _build(self) -> Path:
        cc = compiler()
        if cc is None:
            raise RuntimeError("no C compiler (cc, gcc or $CC) found")
        tag = hashlib.sha256((self.source + cc + " ".join(FLAGS)).encode()).hexdigest()
        cache = cache_dir()
        path = cache / f"{self.name}_{tag[:16]}.so"
        if path.exists():
            return path
        cache.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=cache) as tmp:
            src, lib = Path(tmp) / f"{self.name}.c", Path(tmp) / f"{self.name}.so"
            src.write_text(self.source)
            subprocess.run([cc, *FLAGS, str(src), "-o", str(lib)], check=True,
                           capture_output=True, text=True)
            os.replace(lib, path)  # atomic: ranks building at once all load a whole file
        return path

    def _remove_others(self, path: Path) -> None:
        """Remove this kernel's older builds (a loaded library stays mapped when unlinked)."""
        for old in path.parent.glob(f"{self.name}_*.so"):
            if old != path:
                old.unlink(missing_ok=True)

    def _load(self, path: Path) -> ctypes.CDLL:
        lib = ctypes.CDLL(str(path))
        for fn, (argtypes, restype) in self.functions.items():
            getattr(lib, fn).argtypes = argtypes
            getattr(lib, fn).restype = restype
        return lib


def usable(dtype: torch.dtype, *tensors: torch.Tensor) -> bool:
    """Whether a kernel can take these tensors: contiguous CPU ones of ``dtype``."""
    return all(t.device.type == "cpu" and t.dtype == dtype and t.is_contiguous()
               for t in tensors)
