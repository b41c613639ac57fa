"""Expert parallelism past one node (issue 24 #6): campaigns/moe_ep_2x8_slurm.yaml renders through
`mbx campaign run FILE --dry-run --launcher submitit` as one 2-node × 8-task array job whose sbatch script
matches tests/golden/sbatch/moe_ep_2x8_submitit.sbatch (MBX_UPDATE_GOLDEN=1 rewrites it), nothing submitted."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import yaml
from conftest import ROOT
from test_dry_run import _attempt_rows, _fake_slurm_bin, check_golden, normalize

from trainer.recipe import Recipe, launch_problems

CAMPAIGN = ROOT / "campaigns" / "moe_ep_2x8_slurm.yaml"


def _render(tmp_path: Path, mbx) -> tuple[str, list[dict], Path]:
    fake_bin, marker = _fake_slurm_bin(tmp_path)
    workspace = tmp_path / "ws"
    result = mbx("campaign", "run", str(CAMPAIGN), "--dry-run", "--launcher", "submitit", "--workspace",
                 str(workspace), env={"PATH": f"{fake_bin}:{os.environ['PATH']}"})  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert not marker.exists() and _attempt_rows(workspace) == 0, "a dry run submits and records nothing"
    assert "dry run: nothing submitted (2 attempt(s) rendered)" in result.stdout
    script = re.search(r"^# ---- \S+_submission\.sh\n(.*?)\n# ---- ", result.stdout, re.DOTALL | re.MULTILINE)
    table = re.search(r"^# ---- \S+tasks\.json \(read by the ranks; no shell sees it\)\n(\[.*?\n\])$",
                      result.stdout, re.DOTALL | re.MULTILINE)
    assert script and table, result.stdout
    return script.group(1).rstrip() + "\n", json.loads(table.group(1)), workspace


def test_two_nodes_of_eight_render_one_array_with_the_golden_script(tmp_path, mbx):
    script, tasks, workspace = _render(tmp_path, mbx)
    check_golden("moe_ep_2x8_submitit.sbatch", normalize(script, workspace))
    for line in ("#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=8", "#SBATCH --gpus-per-node=8",
                 "#SBATCH --array=0-1%1", "#SBATCH --time=20", "#SBATCH --exclusive"):
        assert line in script.splitlines(), line
    # one srun task per GPU: 16 ranks, each `python3 -u -m trainer` (no torchrun inside Slurm)
    assert "srun --unbuffered --kill-on-bad-exit=1 python3 -u " in script and "launchers/node/rank.py" in script
    assert len(tasks) == 2
    for task in tasks:
        assert task["argv"][:4] == ["python3", "-u", "-m", "trainer"]
        assert task["env"]["NCCL_NVLS_ENABLE"] == "0" and task["env"]["MBX_TRAINER_PROFILE"] == "6:1"
    campaign = yaml.safe_load(CAMPAIGN.read_text())
    (capacity,) = campaign["sweep"]["zip"]
    for factor, pad in zip(capacity["model.moe.capacity_factor"], capacity["model.moe.pad_to_capacity"],
                           strict=True):
        data = campaign["trainer"]["recipe"]
        data["model"]["moe"].update(capacity_factor=factor, pad_to_capacity=pad)
        recipe = Recipe.model_validate(data)
        assert recipe.parallel.expert == 8 and recipe.global_batch(16) == 256
        assert launch_problems(recipe, world_size=16, gpu_arch="sm_90") == []  # fusion, TE, EP: all accepted


def test_ep_groups_are_the_nodes_and_expert_data_parallel_crosses_them():
    """srun's block distribution puts ranks 8n..8n+7 on node n; the trainer's EP groups are runs of EP = 8
    consecutive ranks (trainer.expert_parallel.build), so every all-to-all stays inside a node and only the
    expert-data-parallel pairs {j, j+8} (and the dense DP all-reduce) cross the network."""
    ep, nodes, per_node = 8, 2, 8
    node_of = {rank: rank // per_node for rank in range(nodes * per_node)}
    ep_groups = [list(range(first, first + ep)) for first in range(0, nodes * per_node, ep)]
    edp_groups = [list(range(j, nodes * per_node, ep)) for j in range(ep)]
    assert all(len({node_of[r] for r in group}) == 1 for group in ep_groups)
    assert all({node_of[r] for r in group} == {0, 1} for group in edp_groups)
