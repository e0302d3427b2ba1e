"""What run.py does to its own process, outside the training code.

- :func:`quiet_other_ranks`: ranks > 0 of a plain run write no Hydra output of their own
  (argv rewritten before Hydra reads it);
- :func:`exit_without_teardown`: the process ends without the interpreter's teardown, where
  gloo's C++ threads abort now and then.
"""

from __future__ import annotations

import logging
import os
import sys


def quiet_other_ranks() -> None:
    """Ranks > 0 write nothing: no Hydra output folder, config copy or log file of their own."""
    rank = int(os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0")))
    multirun = any(a in ("-m", "--multirun") for a in sys.argv)
    if rank > 0 and not multirun:
        extra = ["hydra.output_subdir=null", "hydra/job_logging=disabled",
                 "hydra/hydra_logging=disabled"]
        if not any(a.startswith("hydra.run.dir=") for a in sys.argv):
            extra.append("hydra.run.dir=.")
        sys.argv.extend(extra)


def exit_without_teardown(code: int | str | None) -> None:
    """Exit with ``code`` as ``sys.exit`` would, after flushing logs and streams, but skipping
    the interpreter's teardown: everything is written by then, and gloo's C++ threads, destroyed
    during teardown, abort a rank now and then ("terminate called without an active exception",
    exit -6 after a complete run; pytorch/pytorch#179291 describes the mechanism)."""
    if isinstance(code, str):
        print(code, file=sys.stderr)
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1 if isinstance(code, str) else code or 0)
