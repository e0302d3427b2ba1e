"""``trainer.numerics``: which numeric code paths a run's CPU work takes.

Training amplifies last-bit differences: the same tiny run, seed and config ended at 89.0% or
96.4% test accuracy depending only on the environment's CPU dispatch knobs and thread count.
Each of these knobs selects other float code, so other rounding:

- ATen's vectorized kernels (elementwise ops, reductions, the normal sampler that draws the
  generated datasets and the initial weights) come in builds for the CPU's vector unit
  (``torch.backends.cpu.get_cpu_capability()``: DEFAULT, AVX2, AVX512), chosen at their first
  use unless ``ATEN_CPU_CAPABILITY`` names one;
- MKL's GEMM (linear layers, im2col convolutions, PowerSGD's products) picks a code branch per
  CPU unless conditional numerical reproducibility fixes it (``MKL_CBWR``; ``mkl_cbwr_set``,
  only before MKL's first call);
- oneDNN's convolutions pick kernels per ISA and cache size (``ONEDNN_MAX_CPU_ISA`` limits the
  ISA, not the blocking);
- NNPACK, where oneDNN is off, takes float32 convolutions with a batch of 16 or more
  (``use_nnpack`` in ATen's ``Convolution.cpp``) through its own kernels, built per ISA (AVX2 or
  portable SIMD) and unavailable on some CPUs; a micro-batch of 4 took ATen's im2col path while
  its batch of 32 took NNPACK's, so the two disagreed by 1e-3 after an epoch;
- more threads split reductions and GEMMs differently.

``portable`` (the default for CPU runs) pins them all, in every process, before the first
operation that would read them: ATen's DEFAULT kernels (compiled for the x86-64 baseline, no
FMA), MKL's COMPATIBLE branch, oneDNN and NNPACK off (convolutions through ATen's im2col and
MKL's GEMM at every batch size), one intra-op and one inter-op thread. ReLU's derivative, ten
times slower in ATen's DEFAULT build than in its AVX2 one, runs as a C loop with the same bits
(:mod:`core.exact_ops`). The same run then gives the same bits on any x86-64 machine with the
same software versions, at a cost measured by ``make bench-numerics``.
``native`` leaves every knob to the machine (fastest; the default at paper scale, where the
work runs on GPUs and the CPU knobs barely touch the numbers). What was in effect goes into
every run record (:mod:`core.provenance`).

Out of reach of these knobs: another architecture (ARM), other library versions, and glibc's
libm, whose ``exp``/``log`` have FMA variants chosen per CPU (results may differ in rare last
bits between CPUs with and without FMA).
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path
from typing import Any

from core.errors import ConfigError

MODES = ("portable", "native")
# What the environment of every process of a portable run holds (for the processes it starts,
# e.g. DataLoader workers, and as the record of what was asked).
PORTABLE_ENV = {"ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "COMPATIBLE",
                "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
# mkl_cbwr.h: the branch setting and two of its values; 0 is success.
_CBWR_BRANCH, _CBWR_COMPATIBLE, _CBWR_SUCCESS = 1, 3, 0
_CBWR_NAMES = {0: "OFF", 1: "BRANCH_OFF", 2: "AUTO", 3: "COMPATIBLE", 4: "SSE2", 6: "SSSE3",
               7: "SSE4_1", 8: "SSE4_2", 9: "AVX", 10: "AVX2", 12: "AVX512", 14: "AVX512_E1"}


def check_mode(mode: Any, field: str = "trainer.numerics") -> str:
    """``mode`` if it is one of :data:`MODES`; a ConfigError naming ``field`` otherwise."""
    if mode not in MODES:
        raise ConfigError(f"{field}: {mode!r} is not one of {list(MODES)}")
    return str(mode)


def apply(mode: str) -> None:
    """Put this process under ``mode`` (call before any torch operation runs). For
    ``portable``: a ConfigError (one line) if a knob can no longer be pinned in this process
    (an operation ran before, or torch's MKL is missing): see :func:`needs_restart`."""
    if check_mode(mode) == "native":
        return
    import torch

    os.environ.update(PORTABLE_ENV)
    missed = _pin(torch)
    if missed:
        raise ConfigError(f"trainer.numerics: portable could not pin {', '.join(missed)} in this "
                          f"process (torch ran before the setting); start the process with "
                          f"{' '.join(f'{k}={v}' for k, v in PORTABLE_ENV.items())}")
    from core import exact_ops  # after the pins, as torch itself: it imports torch at the top

    exact_ops.install()  # ATen's slowest DEFAULT kernels as C loops with the same bits


def _pin(torch: Any) -> list[str]:
    """Pin every knob; the ones that could not be pinned."""
    missed = []
    if torch.backends.cpu.get_cpu_capability() != "DEFAULT":
        missed.append(f"ATen's CPU capability ({torch.backends.cpu.get_cpu_capability()})")
    cbwr = _mkl_cbwr()
    if cbwr is not None and cbwr[1](_CBWR_COMPATIBLE) != _CBWR_SUCCESS \
            and cbwr[0](_CBWR_BRANCH) != _CBWR_COMPATIBLE:
        missed.append(f"MKL's branch ({_CBWR_NAMES.get(cbwr[0](_CBWR_BRANCH), '?')})")
    torch.backends.mkldnn.enabled = False
    torch.backends.nnpack.set_flags(False)
    torch.set_num_threads(1)
    if torch.get_num_interop_threads() != 1:
        try:
            torch.set_num_interop_threads(1)
        except RuntimeError:
            missed.append(f"inter-op threads ({torch.get_num_interop_threads()})")
    return missed


def state() -> dict[str, Any]:
    """The knobs as they are in this process (for the run record)."""
    import torch

    cbwr = _mkl_cbwr()
    return {"cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "mkl_cbwr": None if cbwr is None else _CBWR_NAMES.get(cbwr[0](_CBWR_BRANCH), "?"),
            "mkldnn_enabled": bool(torch.backends.mkldnn.enabled),
            "nnpack_enabled": bool(torch._C._get_nnpack_enabled()),
            "intra_op_threads": torch.get_num_threads(),
            "inter_op_threads": torch.get_num_interop_threads(),
            "env": {k: os.environ.get(k) for k in (*PORTABLE_ENV, "ONEDNN_MAX_CPU_ISA",
                                                     "DNNL_MAX_CPU_ISA")}}


def _mkl_cbwr() -> tuple[Any, Any] | None:
    """``(mkl_cbwr_get, mkl_cbwr_set)`` of the MKL inside torch's CPU library (exported as
    ``mkl_serv_cbwr_*``), or None where torch has no MKL (ARM builds)."""
    import torch

    library = Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"
    try:
        lib = ctypes.CDLL(str(library))
        get, set_ = lib.mkl_serv_cbwr_get, lib.mkl_serv_cbwr_set
    except (OSError, AttributeError):
        return None
    for fn in (get, set_):
        fn.argtypes, fn.restype = [ctypes.c_int], ctypes.c_int
    return get, set_
