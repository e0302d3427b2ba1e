"""Every sweep's runs, composed by Hydra and resolved, in one YAML file per sweep and scale.

    python -m tools.sweep_configs OUT_DIR          # every conf/sweep/*.yaml at each scale
    diff -r before/ after/                          # a change of conf/ that moves no run

Run it before and after restructuring ``conf/``: a refactor that keeps every sweep's runs
identical leaves the two folders equal. Each run is its resolved config without Hydra's own node
(what ``config.yaml`` of the run directory holds) and the run directory; a sweep that cannot be
composed at a scale records the error instead.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir
from omegaconf import DictConfig, OmegaConf

from jobs import sweeps

CONF = Path(__file__).resolve().parent.parent / "conf"
SCALES = ("paper", "tiny", None)  # None: the sweep's own default (the claim sweeps set theirs)


def resolved_run(cfg: DictConfig) -> dict[str, Any]:
    """A composed run as plain data: its directory and its config without Hydra's node."""
    return {"run_dir": f"{cfg.hydra.sweep.dir}/{cfg.hydra.sweep.subdir}",
            "config": sweeps.resolved(cfg)}


def sweep_runs(name: str, scale: str | None) -> list[dict[str, Any]] | str:
    """Every run of sweep ``name`` at ``scale``, or the error that stops its composition."""
    arguments = [f"sweep={name}"] + ([f"scale={scale}"] if scale else [])
    try:
        master = compose("config", overrides=arguments, return_hydra_config=True)
        jobs = sweeps.expand(master.hydra.sweeper.groups, master.hydra.sweeper.params,
                             arguments, master.get("scale"))
        return [resolved_run(compose("config", overrides=job, return_hydra_config=True))
                for job in jobs]
    except Exception as exc:  # recorded: the same error before and after is what counts
        return f"{type(exc).__name__}: {exc}"


def main(argv: list[str] | None = None) -> None:
    """Write ``<out>/<sweep>-<scale>.yaml`` for every sweep file and scale."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--sweeps", nargs="*", help="only these sweeps (default: all)")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    names = args.sweeps or sorted(p.stem for p in (CONF / "sweep").glob("*.yaml"))
    with initialize_config_dir(str(CONF), version_base="1.3"):
        for name in names:
            for scale in SCALES:
                runs = sweep_runs(name, scale)
                path = args.out / f"{name}-{scale or 'default'}.yaml"
                path.write_text(OmegaConf.to_yaml(OmegaConf.create({"runs": runs}))
                                if isinstance(runs, list) else runs + "\n")
                print(f"{path}: {len(runs) if isinstance(runs, list) else runs}")


if __name__ == "__main__":
    main()
