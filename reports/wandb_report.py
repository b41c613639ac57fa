"""A W&B Report for a campaign, built with wandb-workspaces: the Markdown summary (verdicts, gates) and panels of
the campaign's runs (one per attempt, grouped by point): TFLOP/s, step time, loss and memory per step, window
figures per point, and TFLOP/s against peak memory."""

from __future__ import annotations

import re
from typing import Any

from reports.views import CampaignView
from reports.wandb_settings import WandbSettings

SAFE_NAME = re.compile(r"^[A-Za-z0-9._-]+$")  # campaign names (orchestrator.spec.campaign.NAME_PATTERN)
STEP_PANELS = (
    ("TFLOP/s/GPU per step", "tflops_per_gpu"),
    ("Step time (ms) per step", "step_time_ms"),
    ("Training loss", "loss"),
    ("Peak allocated memory (GiB)", "mem_max_allocated_gib"),
)
WINDOW_BARS = ("window/tflops_per_gpu", "window/step_time_ms", "window/peak_alloc_gib")


def runset(view: CampaignView, settings: WandbSettings) -> Any:
    """The campaign's runs: W&B group = campaign name (reports/wandb_log.py), grouped by point id."""
    import wandb_workspaces.reports.v2 as wr

    if not SAFE_NAME.match(view.name):  # the name goes into a filter expression: only safe characters
        raise ValueError(f"campaign name {view.name!r} cannot be used in a W&B filter")
    return wr.Runset(entity=settings.entity or "", project=settings.project, name=view.name,
                     filters=f"Metric('Group') == '{view.name}'", groupby=["config.mbx.point_id"])  # fmt: skip


def panels() -> list[Any]:
    import wandb_workspaces.reports.v2 as wr

    lines = [wr.LinePlot(title=title, x="Step", y=[key]) for title, key in STEP_PANELS]
    bars = [wr.BarPlot(title=f"Window {key.split('/', 1)[1]} per point", metrics=[wr.SummaryMetric(key)])
            for key in WINDOW_BARS]  # fmt: skip
    pareto = wr.ScatterPlot(title="TFLOP/s/GPU against peak allocated memory",
                            x=wr.SummaryMetric("window/peak_alloc_gib"), y=wr.SummaryMetric("window/tflops_per_gpu"))  # fmt: skip
    return [*lines, *bars, pareto]


def build_report(view: CampaignView, settings: WandbSettings, summary_markdown: str) -> Any:
    """The Report object (nothing is sent: `save()` it to publish)."""
    import wandb_workspaces.reports.v2 as wr

    blocks = [
        wr.H1(f"mbx campaign {view.name}"),
        wr.P(view.description or "A benchmark campaign run with mbx."),
        wr.MarkdownBlock(summary_markdown),
        wr.H2("Runs: one per attempt, grouped by point"),
        wr.PanelGrid(runsets=[runset(view, settings)], panels=panels()),
    ]
    return wr.Report(project=settings.project, entity=settings.entity or "", title=f"mbx: {view.name}",
                     description=view.description[:200], blocks=blocks, width="fluid")  # fmt: skip


def report_spec(report: Any) -> dict[str, Any]:
    """The report as W&B stores it (JSON-able), for offline inspection and tests."""
    return report._to_model().model_dump(by_alias=True, exclude_none=True, mode="json")
