"""A point that fails at run time is recorded with its reason and class; the campaign goes on and exits 1."""

from __future__ import annotations

import copy
import json

from conftest import TINY_MOE_RECIPE


def test_failed_point_is_recorded_and_campaign_goes_on(mbx, write_campaign, tmp_path, cache_env):
    recipe = copy.deepcopy(TINY_MOE_RECIPE)
    recipe["training"]["steps"] = 4
    path = write_campaign(
        {
            "name": "onefails",
            "trainer": {"recipe": recipe},
            # fp8 needs Transformer Engine on a Hopper GPU: on this CPU the trainer refuses it at start-up
            "sweep": {"axes": {"precision": ["fp8", "bf16"]}},
            "wandb": {"mode": "disabled"},
        }
    )
    workspace = tmp_path / "ws"
    result = mbx("campaign", "run", str(path), "--workspace", str(workspace), "--no-report", env=cache_env)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "FAIL 1/2 completed" in result.stdout
    assert "[precision=fp8] did not complete: failed:" in result.stdout
    assert "worth another attempt" not in result.stdout  # fp8 on a CPU is no infrastructure failure: no resume hint

    status = json.loads(mbx("campaign", "status", "onefails", "--workspace", str(workspace), "--json").stdout)["cells"]
    by_precision = {cell["params"]["precision"]: cell for cell in status}
    assert by_precision["bf16"]["state"] == "completed" and by_precision["bf16"]["verdict"] == "pass"
    failed = by_precision["fp8"]
    assert failed["state"] == "failed" and failed["verdict"] == "fail"
    assert "fp8" in failed["reason"]
    assert failed["failure_class"] == "config"
