"""`mbx report --wandb-report`: a W&B Report of a real campaign built with wandb-workspaces (no server): its
blocks carry the Markdown summary and panels over the campaign's runs; `--markdown` prints only Markdown."""

from __future__ import annotations

import copy
import json
from pathlib import Path

from conftest import TINY_MOE_RECIPE


def _blocks(spec: dict) -> list[dict]:
    return spec["spec"]["blocks"]


def test_wandb_report_of_a_real_campaign(mbx, write_campaign, tmp_path: Path, cache_env) -> None:
    recipe = copy.deepcopy(TINY_MOE_RECIPE)
    recipe["training"]["steps"] = 4
    path = write_campaign({"name": "wbr", "description": "a <b>tiny</b> run", "trainer": {"recipe": recipe},
                           "wandb": {"mode": "disabled", "project": "mbx-tests"}})  # fmt: skip
    workspace = tmp_path / "ws"
    run = mbx("campaign", "run", str(path), "--workspace", str(workspace), "--no-report", env=cache_env)
    assert run.returncode == 0, run.stdout + run.stderr

    result = mbx("report", "wbr", "--workspace", str(workspace), "--markdown", "--wandb-report")
    assert result.returncode == 0, result.stderr
    assert "report:" not in result.stdout and result.stdout.lstrip().startswith("#"), (
        "stdout is only Markdown"
    )
    assert "report:" in result.stderr and "not published: wandb.mode is disabled" in result.stderr

    spec = json.loads((workspace / "wbr" / "report" / "wandb-report.json").read_text())
    assert spec["displayName"] == "mbx: wbr" and spec["project"]["name"] == "mbx-tests"
    kinds = [b["type"] for b in _blocks(spec)]
    assert {"heading", "markdown-block", "panel-grid"} <= set(kinds)
    markdown = next(b for b in _blocks(spec) if b["type"] == "markdown-block")["content"]
    assert markdown.strip() == result.stdout.strip(), "the report carries the same summary as --markdown"
    grid = next(b for b in _blocks(spec) if b["type"] == "panel-grid")
    (runset,) = grid["metadata"]["runSets"]
    (flt,) = runset["filters"]["filters"]
    assert flt["key"] == {"section": "run", "name": "group"} and flt["value"] == "wbr"
    assert runset["grouping"][0]["section"] == "config"
    panels = json.dumps(
        grid["metadata"]["panelBankSection"] if "panelBankSection" in grid["metadata"] else grid
    )
    for metric in ("tflops_per_gpu", "step_time_ms", "loss", "window/peak_alloc_gib"):
        assert metric in panels, metric
