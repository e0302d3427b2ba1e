"""Issue 27's kernel passes alone, side by side with another commit's; writes
results/bench/kernels.{csv,md}.

    make bench-kernels BASELINE=<git ref>
    python -m benchmarks.kernel_ab --baseline REF [--repeats 21]

``make bench-compressors`` times the hook's whole path, where the collectives' calls, Python and the
caches a step leaves move a pass by more than a kernel change does (unchanged code there times
0.96-1.03x its own baseline from one run to the next on this 2-core VM). Here each side is a process
importing its checkout's ``compression`` package (as bench-compressors' sides do) that calls one
pass of one C kernel (Top-K's and AdaComp's compress and decompress, PowerSGD's three passes) over
ResNet-18's matrix-shaped layers, laid end to end in one buffer one float past an aligned address (a
DDP bucket does not align them), from the same seeded inputs. Before each call the inputs are
restored and a 64 MiB buffer is written, so the layers come from memory, not cache, as after
backward's other writes. The sides take turns going first (ABBA). Each reply carries a digest of the
pass's outputs, and the table says whether both sides' outputs are the same bits. One thread;
medians over repeats; nothing here is a test.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

import models
from benchmarks.compressors import ROOT
from core import provenance

if TYPE_CHECKING:
    from benchmarks.compressors import Side

OUT = ROOT / "results" / "bench"
TOPK_RATIOS = (0.99, 0.25, 0.1, 0.02)
ADACOMP_BINS = ((50, 500), (500, 5000), (5000, 50000))  # L_T of conv kernels / of matrices
POWERSGD_RANKS = (1, 2, 4)
REPEATS = 21  # make bench-kernels' repeats
FLUSH = 16 << 20  # floats written between calls: 64 MiB, twice this machine's last-level cache


def resnet18_matrices(width: int) -> tuple[list[tuple[int, int]], list[bool]]:
    """ResNet-18's (CIFAR-10 head, first stage ``width`` channels) matrix-shaped layers as the
    hook views them, (n, -1), and which of them are convolution kernels (AdaComp's conv bins)."""
    model = models.build("resnet18", num_classes=10, width=width)
    params = [p for p in model.parameters() if p.ndim > 1]
    return [(p.shape[0], p[0].numel()) for p in params], [p.ndim >= 3 for p in params]


def _layers(shapes: list[tuple[int, int]], scale: float, seed: int) -> list[torch.Tensor]:
    """Seeded normal matrices of ``shapes`` (times ``scale``), end to end in one buffer that
    starts one float past an aligned address."""
    total = sum(n * m for n, m in shapes)
    flat = torch.empty(total + 1)[1:]
    flat.normal_(generator=torch.Generator().manual_seed(seed)).mul_(scale)
    out, at = [], 0
    for n, m in shapes:
        out.append(flat[at:at + n * m].view(n, m))
        at += n * m
    return out


def passes(width: int) -> dict[str, Callable[[], Callable[[], list[torch.Tensor]]]]:
    """Every pass timed, by key: a maker that prepares its inputs and returns the timed call
    (which returns the tensors it wrote)."""
    from compression import _adacomp_kernel as ada  # noqa: PLC0415 (this side's checkout)
    from compression import _powersgd_kernel as psgd  # noqa: PLC0415
    from compression import _topk_kernel as topk  # noqa: PLC0415
    from compression.exchange import layout  # noqa: PLC0415

    shapes, convs = resnet18_matrices(width)
    grads = _layers(shapes, 1e-3, 0)
    made: dict[str, Callable[[], Callable[[], list[torch.Tensor]]]] = {}

    def topk_compress(ratio: float) -> Callable[[], list[torch.Tensor]]:
        lib, start = topk.kernel(), _layers(shapes, 1e-4, 1)
        errors = [e.clone().view(-1) for e in start]
        ks = [max(1, int(ratio * e.numel())) for e in errors]
        messages = [torch.empty(2 * k, dtype=torch.int32) for k in ks]
        spaces = [torch.empty(topk.workspace_size(e.numel()), dtype=torch.int32) for e in errors]

        def call() -> list[torch.Tensor]:
            for e, g, k, m, w in zip(errors, grads, ks, messages, spaces, strict=True):
                topk.compress(lib, e, g.view(-1), k, m, w)
            return [*errors, *messages]
        return _restored(call, [(e, s.view(-1)) for e, s in zip(errors, start, strict=True)])

    def topk_decompress(ratio: float) -> Callable[[], list[torch.Tensor]]:
        lib = topk.kernel()
        rows = []
        for worker in range(2):  # two workers' messages, from two error memories
            errors = [e.view(-1) for e in _layers(shapes, 1e-4, 2 + worker)]
            part = []
            for e, g in zip(errors, grads, strict=True):
                k = max(1, int(ratio * e.numel()))
                message = torch.empty(2 * k, dtype=torch.int32)
                topk.compress(lib, e, g.view(-1).clone(), k, message,
                              torch.empty(topk.workspace_size(e.numel()), dtype=torch.int32))
                part.append(message)
            rows.append(part)
        parts = [torch.stack(layer) for layer in zip(*rows, strict=True)]
        outs = [torch.empty_like(g).view(-1) for g in grads]

        def call() -> list[torch.Tensor]:
            for out, p in zip(outs, parts, strict=True):
                topk.decompress(lib, out, p, p.shape[1] // 2, 0.5)
            return outs
        return _restored(call, [])

    def powersgd(name: str, rank: int) -> Callable[[], list[torch.Tensor]]:
        lib, start = psgd.kernel(), _layers(shapes, 1e-4, 1)
        errors = [e.clone() for e in start]
        gen = torch.Generator().manual_seed(4)
        qts = [torch.randn(rank, m, generator=gen) for _, m in shapes]
        ps = [torch.randn(n, rank, generator=gen) * 1e-2 for n, _ in shapes]
        owed = [(torch.randn(n, rank, generator=gen) * 1e-2, torch.randn(rank, m, generator=gen))
                for n, m in shapes]
        outs = [torch.empty(n, m) for n, m in shapes]
        if name == "project":
            def call() -> list[torch.Tensor]:
                psgd.project(lib, errors, grads, qts, owed, ps)
                return [*errors, *ps]
            return _restored(call, list(zip(errors, start, strict=True)))
        if name == "back":
            def call() -> list[torch.Tensor]:
                psgd.back(lib, errors, ps, qts)
                return qts
            return _restored(call, [])

        def call() -> list[torch.Tensor]:
            psgd.expand(lib, outs, ps, qts)
            return outs
        return _restored(call, [])

    def adacomp_state(bins: tuple[int, int], seed: int) -> dict[str, Any]:
        """A worker's AdaComp kernel arguments after one step (residues, owed bits and scales
        as it left them; its message), for conv / matrix bin sizes ``bins``."""
        bin_sizes = [bins[0] if conv else bins[1] for conv in convs]
        residues = []
        for e, bin_size in zip(_layers(shapes, 1e-4, seed), bin_sizes, strict=True):
            residue = torch.zeros(-(-e.numel() // bin_size) * bin_size + ada.SLACK)
            residue[:e.numel()] = e.view(-1)
            residues.append(residue[:-ada.SLACK])
        sizes = [ada.group_bytes(g.numel(), b) for g, b in zip(grads, bin_sizes, strict=True)]
        offsets, length = layout([2 * size for size in sizes], header=4 * len(sizes), align=4)
        bins_most = max(-(-g.numel() // b) for g, b in zip(grads, bin_sizes, strict=True))
        args = {"lib": ada.kernel(), "residues": residues, "grads": [g.view(-1) for g in grads],
                "bin_sizes": bin_sizes, "soft": True,
                "owed": [torch.zeros(size, dtype=torch.uint8) for size in sizes],
                "scales": [torch.zeros((), dtype=torch.float32) for _ in sizes],
                "g_max": torch.empty(bins_most), "message": torch.zeros(length, dtype=torch.uint8),
                "offsets": offsets, "sizes": sizes}
        ada.compress(**args)                                 # last step: its G_q owed
        return args

    def adacomp_compress(bins: tuple[int, int]) -> Callable[[], list[torch.Tensor]]:
        args = adacomp_state(bins, 1)
        state = [*args["residues"], *args["owed"], *args["scales"]]

        def call() -> list[torch.Tensor]:
            ada.compress(**args)
            return [*args["residues"], args["message"]]
        return _restored(call, [(t, t.clone()) for t in state])

    def adacomp_decompress(bins: tuple[int, int]) -> Callable[[], list[torch.Tensor]]:
        workers = [adacomp_state(bins, 2 + worker) for worker in range(2)]
        messages = torch.stack([args["message"] for args in workers])
        outs = [torch.empty_like(g).view(-1) for g in grads]
        args = workers[0]

        def call() -> list[torch.Tensor]:
            ada.decompress(args["lib"], outs, args["bin_sizes"], messages, args["offsets"],
                           args["sizes"])
            return outs
        return _restored(call, [])

    for ratio in TOPK_RATIOS:
        made[f"topk compress, ratio {ratio}"] = lambda r=ratio: topk_compress(r)
        made[f"topk decompress (2 workers), ratio {ratio}"] = lambda r=ratio: topk_decompress(r)
    for rank in POWERSGD_RANKS:
        for name in ("project", "back", "expand"):
            made[f"powersgd {name}, rank {rank}"] = lambda n=name, r=rank: powersgd(n, r)
    for bins in ADACOMP_BINS:
        made[f"adacomp compress, L_T {bins[0]}/{bins[1]}"] = lambda b=bins: adacomp_compress(b)
        made[f"adacomp decompress (2 workers), L_T {bins[0]}/{bins[1]}"] = \
            lambda b=bins: adacomp_decompress(b)
    return made


def _restored(call: Callable[[], list[torch.Tensor]],
              inputs: list[tuple[torch.Tensor, torch.Tensor]]) -> Callable[[], Any]:
    """``call`` as the worker times it: the changed inputs restored (pairs: tensor, its start)
    and the caches filled with other data first; returns (seconds, digest of the outputs)."""

    def timed() -> tuple[float, str]:
        for tensor, value in inputs:
            tensor.copy_(value)
        _flush().fill_(1.0)
        start = time.perf_counter()
        outs = call()
        seconds = time.perf_counter() - start
        digest = hashlib.sha256()
        for out in outs:
            digest.update(out.contiguous().view(torch.uint8).numpy().tobytes())
        return seconds, digest.hexdigest()[:16]
    return timed


@cache
def _flush() -> torch.Tensor:
    """The buffer written before every call (one per process)."""
    return torch.empty(FLUSH)


def worker(width: int) -> None:
    """A side's process: the keys on the first line out, then one reply per key read."""
    out = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    sys.stdout = sys.stderr
    torch.set_num_threads(1)
    made = {key: make() for key, make in passes(width).items()}
    print(json.dumps(list(made)), file=out, flush=True)
    for line in sys.stdin:
        print(json.dumps(made[line.strip()]()), file=out, flush=True)


def time_sides(sides: list[Side], repeats: int, warmup: int = 2, only: str = ""
               ) -> tuple[list[dict[str, Any]], list[float]]:
    """Per key both sides can run: their median ms over the measured repeats and whether their
    outputs agreed in every repeat; and the 1-minute load average at every measured repeat."""
    from benchmarks.compressors import alternate  # noqa: PLC0415 (see main)

    keys = [k for k in sides[0].rows if all(k in s.rows for s in sides) and k.startswith(only)]
    replies, load = alternate([(k, sides) for k in keys], repeats, warmup)
    rows = [{"pass": k, **{s.name: statistics.median(
                 t for t, _ in replies[(s.name, k)][warmup:]) * 1e3 for s in sides},
             "same bits": len({d for s in sides for _, d in replies[(s.name, k)]}) == 1}
            for k in keys]
    return rows, load


def write(rows: list[dict[str, Any]], load: list[float], context: dict[str, Any],
          out: Path) -> None:
    """kernels.csv and kernels.md: one row per pass."""
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "kernels.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["pass", "baseline_ms", "this_ms", "speed_up", "same_bits"])
        for row in rows:
            writer.writerow([row["pass"], f"{row['baseline']:.3f}", f"{row['this']:.3f}",
                             f"{row['baseline'] / row['this']:.3f}", row["same bits"]])
    if context["repeats"] == REPEATS:
        only = f" PASSES={context['only']}" if context["only"] else ""
        command = (f"`make bench-kernels BASELINE={context['baseline_ref']}{only}` (python -m "
                   f"benchmarks.kernel_ab)")
    else:
        only = f" --only {context['only']}" if context["only"] else ""
        command = (f"`python -m benchmarks.kernel_ab --baseline {context['baseline_ref']} "
                   f"--repeats {context['repeats']}{only}`")
    lines = [f"Command: {command}, {context['minutes']:.1f} min; this side "
             f"{context['this']}, baseline {context['baseline']}; {context['made_by']}. "
             f"ResNet-18's matrix-shaped layers (width {context['width']}), one thread, inputs "
             f"from memory (caches filled with other data before each call), median of "
             f"{context['repeats']} repeats, the sides taking turns going first; load average "
             f"(1 min) at the repeats: min {min(load):.2f}, median "
             f"{statistics.median(load):.2f}, max {max(load):.2f} on {os.cpu_count()} CPUs.", "",
             "| pass | baseline ms | this ms | speed-up | same bits |", "|---|---:|---:|---:|---|"]
    lines += [f"| {r['pass']} | {r['baseline']:.2f} | {r['this']:.2f} | "
              f"{r['baseline'] / r['this']:.2f}x | {'yes' if r['same bits'] else 'NO'} |"
              for r in rows]
    (out / "kernels.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--baseline", metavar="REF", help="the git commit to compare with")
    parser.add_argument("--repeats", type=int, default=REPEATS)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--width", type=int, default=64,
                        help="ResNet-18's first-stage channels (64: the real one; 8: a check)")
    parser.add_argument("--only", default="", metavar="PREFIX",
                        help="time only the passes whose name starts so (topk, powersgd, adacomp)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args.width)
        return 0
    # The parent's helpers, imported here: a worker runs on the other checkout's benchmarks
    # package first, which may predate them.
    from benchmarks.compressors import Side, checkout, describe  # noqa: PLC0415

    if not args.baseline:
        raise SystemExit("bench-kernels: BASELINE=<git ref> is required (the commit whose "
                         "kernels this one is compared with)")
    started, made_by = time.perf_counter(), provenance.made_here()
    with checkout(args.baseline) as tree:
        width, script = ["--width", str(args.width)], Path(__file__)
        sides = [Side(name, tree_of, width, script, "bench-kernels")
                 for name, tree_of in (("this", ROOT), ("baseline", tree))]
        try:
            rows, load = time_sides(sides, args.repeats, only=args.only)
        finally:
            for side in sides:
                side.close()
    context = {"repeats": args.repeats, "made_by": made_by, "width": args.width,
               "baseline_ref": args.baseline, "only": args.only,
               "baseline": describe(args.baseline),
               "this": describe("HEAD") + (" + uncommitted changes"
                                            if provenance.code_changed() else ""),
               "minutes": (time.perf_counter() - started) / 60}
    write(rows, load, context, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
