"""A sweep's W&B workspace, built as code with wandb-workspaces (``make dashboard SWEEP=table1``).

The sweeps log every run to W&B with group = the sweep, job_type = the method, name =
model-method-seed and the flattened config (conf/sweep_runs.yaml), so a workspace can select a
sweep's runs by their group and group them by ``config.method`` and ``config.variant``. Panels:
test accuracy (or perplexity) per epoch, cumulative and per-epoch data sent, the per-layer levels
and Accordion's critical flags, the endpoints ``accordion_auto`` chose and what it measured, and
the batch size and LR.

    python -m analysis.dashboard table1 [--scale tiny] [--entity E] [--project P]

Runs logged offline reach W&B with ``wandb sync <run dir>/wandb/offline-run-*``; saving the
workspace needs the network and a W&B login (``WANDB_API_KEY``).
"""

from __future__ import annotations

import argparse
import sys

import requests
import wandb_workspaces.reports.v2 as wr
import wandb_workspaces.workspaces as ws

EPOCH = "Step"  # run.py logs each epoch's row at step = epoch
AUTO = "Measured endpoints (scheduler=accordion_auto, accordion_batch_auto)"

SECTIONS: dict[str, list[wr.LinePlot]] = {
    "Test metric": [
        wr.LinePlot(title="test accuracy (%)", x=EPOCH, y=["test/accuracy"]),
        wr.LinePlot(title="test perplexity", x=EPOCH, y=["test/perplexity"]),
        wr.LinePlot(title="train loss", x=EPOCH, y=["train/loss"]),
    ],
    "Data sent": [
        wr.LinePlot(title="cumulative bits sent per worker", x=EPOCH,
                    y=["comm/cumulative_bits"]),
        wr.LinePlot(title="bits sent per worker per epoch", x=EPOCH, y=["comm/bits"]),
    ],
    "Levels and critical regimes": [
        wr.LinePlot(title="level per layer", x=EPOCH, metric_regex="^level/.*"),
        wr.LinePlot(title="critical regime per layer", x=EPOCH, metric_regex="^critical/.*"),
    ],
    AUTO: [
        wr.LinePlot(title="chosen low level per layer", x=EPOCH, metric_regex="^auto/low/.*"),
        wr.LinePlot(title="chosen high level per layer", x=EPOCH, metric_regex="^auto/high/.*"),
        wr.LinePlot(title="gradient noise per layer", x=EPOCH, metric_regex="^auto/noise/.*"),
        wr.LinePlot(title="gradient noise scale B_simple", x=EPOCH,
                    metric_regex="^auto/noise_scale/model$"),
    ],
    "Batch size and LR": [
        wr.LinePlot(title="global batch size", x=EPOCH, y=["batch_size"]),
        wr.LinePlot(title="learning rate", x=EPOCH, y=["lr"]),
    ],
}


def build_workspace(sweep: str, entity: str, project: str, scale: str | None = None
                    ) -> ws.Workspace:
    """The workspace of ``sweep``'s runs (at ``scale``, or all), grouped by method."""
    # The run's W&B group is its sweep (a config key named "sweep" would clash with W&B Sweeps).
    filters = [ws.Metric("Group") == sweep]
    if scale is not None:
        filters.append(ws.Config("scale") == scale)
    runset = ws.RunsetSettings(filters=ws.And(*filters),
                               groupby=[ws.Config("method"), ws.Config("variant")])
    sections = [ws.Section(name=name, panels=list(panels), is_open=True)
                for name, panels in SECTIONS.items()]
    title = f"accordion-bench {sweep}" + (f" ({scale})" if scale else "")
    return ws.Workspace(entity=entity, project=project, name=title, sections=sections,
                        runset_settings=runset)


def main(argv: list[str] | None = None) -> None:
    """Build and save the workspace; print its URL. Without a W&B login or a server to reach,
    one line says what to do (exit status 2)."""
    import wandb

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("sweep", help="the sweep: table1 .. table6, fig9, fig10, adacomp")
    parser.add_argument("--scale", choices=("paper", "tiny"), default=None)
    parser.add_argument("--entity", default=None, help="W&B entity (default: your default one)")
    parser.add_argument("--project", default="accordion-bench")
    args = parser.parse_args(argv)
    try:
        entity = args.entity or wandb.Api().default_entity
        workspace = build_workspace(args.sweep, entity, args.project, args.scale).save()
    except (wandb.errors.Error, requests.RequestException) as exc:
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0].rstrip(".")
        print(f"error: W&B: {reason} (the dashboard is built online: log in with `wandb login` "
              f"or set WANDB_API_KEY, where the W&B server is reachable, then run it again)",
              file=sys.stderr)
        sys.exit(2)
    print(workspace.url)


if __name__ == "__main__":
    main()
