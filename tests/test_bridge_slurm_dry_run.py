"""Megatron-Bridge at its own scale on Slurm (issue 33 #7): campaigns/bridge_qwen3_30b_a3b_2x8_slurm.yaml renders
through `mbx campaign run FILE --dry-run` as one 2-node × 8-task array job in the NeMo container whose sbatch script
matches tests/golden/sbatch/bridge_2x8_submitit.sbatch (MBX_UPDATE_GOLDEN=1 rewrites it); nothing is submitted.
Every rank runs Bridge's own run_recipe.py with the campaign's overrides and its own JIT cache root."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from conftest import ROOT
from test_dry_run import _attempt_rows, _fake_slurm_bin, check_golden, normalize

CAMPAIGN = ROOT / "campaigns" / "bridge_qwen3_30b_a3b_2x8_slurm.yaml"


def test_two_nodes_of_eight_run_run_recipe_in_the_nemo_container(tmp_path: Path, mbx):
    fake_bin, marker = _fake_slurm_bin(tmp_path)
    workspace = tmp_path / "ws"
    result = mbx("campaign", "run", str(CAMPAIGN), "--dry-run", "--workspace", str(workspace),
                 env={"PATH": f"{fake_bin}:{os.environ['PATH']}"})  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert not marker.exists() and _attempt_rows(workspace) == 0, "a dry run submits and records nothing"
    script = re.search(r"^# ---- \S+_submission\.sh\n(.*?)\n# ---- ", result.stdout, re.DOTALL | re.MULTILINE)
    table = re.search(r"^# ---- \S+tasks\.json \(read by the ranks; no shell sees it\)\n(\[.*?\n\])$",
                      result.stdout, re.DOTALL | re.MULTILINE)  # fmt: skip
    assert script and table, result.stdout
    text = script.group(1).rstrip() + "\n"
    check_golden("bridge_2x8_submitit.sbatch", normalize(text, workspace))
    for line in ("#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=8", "#SBATCH --gpus-per-node=8", "#SBATCH --exclusive"):
        assert line in text.splitlines(), line
    assert "--container-image=nvcr.io/nvidia/nemo:26.06" in text
    tasks = json.loads(table.group(1))
    assert len(tasks) == 4
    for task in tasks:
        argv = task["argv"]
        assert argv[:4] == ["python", "/opt/Megatron-Bridge/scripts/training/run_recipe.py", "--recipe",
                            "qwen3_30b_a3b_pretrain_16gpu_h100_bf16_config"]  # fmt: skip
        assert "model.expert_model_parallel_size=8" in argv and "train.train_iters=50" in argv
        assert f"logger.save_config_filepath={task['run_dir']}/bridge-config.yaml" in argv
        assert task["env"]["MBX_JIT_CACHE_ROOT"] == f"{task['run_dir']}/jit-cache"
    dispatchers = {next(a for a in t["argv"] if a.startswith("model.moe_token_dispatcher_type=")) for t in tasks}
    assert dispatchers == {"model.moe_token_dispatcher_type=flex", "model.moe_token_dispatcher_type=alltoall"}
