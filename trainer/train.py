"""Entry point of the bundled trainer: set up the rank, run the loop, write the run directory.

One process (CPU, or one GPU):
    python -m trainer --recipe recipe.yaml --out runs/x
One node, 8 GPUs (data parallel over NCCL):
    torchrun --nproc-per-node 8 -m trainer --recipe recipe.yaml --out runs/x
Two nodes, run on each node, rendezvous at the first:
    torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint $HEAD_NODE:29500 \\
        -m trainer --recipe recipe.yaml --out runs/x
Two CPU ranks over gloo (what the tests run):
    torchrun --nproc-per-node 2 --rdzv-backend c10d --rdzv-endpoint localhost:29500 \\
        -m trainer --recipe recipe.yaml --out runs/x
FLOPs per step of a recipe (no torch import):
    python -m trainer flops --recipe recipe.yaml --world-size 8
Overrides: --set training.steps=5 --set model.moe.capacity_factor=1.25
Save after step 3, then continue from it (in either model.moe.expert_weights layout):
    python -m trainer --recipe recipe.yaml --out runs/a --set checkpoint.save_at=3
    python -m trainer --recipe recipe.yaml --out runs/b --set checkpoint.load_from=runs/a/checkpoint/step-3

Run directory (global rank 0 writes the shared files):
    env.json       host, GPU, driver/CUDA/torch/NCCL/TE versions, world size (at start)
    recipe.yaml    the resolved recipe (only when absent: the launcher normally writes it)
    metrics.jsonl  one row per step, flushed per line
    status.json    completed | failed (+ one-line reason), written last and atomically
    logs/jit-cache-rank<r>.json   the JIT cache dirs each rank used (every rank)
    checkpoint/step-<N>/          with checkpoint.save_at: N, the state after step N (trainer/checkpoint.py)
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import torch

from trainer import distributed, rundir
from trainer.flops import step_flops
from trainer.loop import Trainer
from trainer.recipe import Recipe
from trainer.rundir import MetricsWriter, one_line
from trainer.te_support import te_version


def environment(world_size: int) -> dict:
    """env.json: what ran where (versions of everything that changes kernel performance)."""
    env = rundir.host_env()
    env.update(world_size=world_size, torch=torch.__version__, cuda=torch.version.cuda,
               gpu_count=torch.cuda.device_count() if torch.cuda.is_available() else 0,
               gpu_name=None, gpu_capability=None, driver=None, nccl=None, transformer_engine=None)
    if torch.cuda.is_available():
        env["gpu_name"] = torch.cuda.get_device_name()
        env["gpu_capability"] = "sm_{}{}".format(*torch.cuda.get_device_capability())
        try:
            version = torch.cuda.nccl.version()  # a tuple in recent torch, an int in old ones
            env["nccl"] = ".".join(map(str, version)) if isinstance(version, tuple) else str(version)
        except Exception:  # noqa: BLE001 (a build without NCCL)
            pass
        env["driver"] = _driver_version()
    # The version from package metadata: importing transformer_engine here loaded the system's older cuDNN
    # before torch's, and attention silently left cuDNN (the MoE proxy ran 8% slower; te_support.import_te).
    env["transformer_engine"] = te_version()
    return env


def _driver_version() -> str | None:
    try:
        import subprocess

        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None
    except (OSError, subprocess.SubprocessError):
        return None


def _flops_or_zero(recipe: Recipe, world_size: int) -> float:
    try:
        return float(step_flops(recipe, world_size).total)
    except ValueError:  # a layout that does not tile the world size
        return 0.0


# Objects kept until the process ends. With gloo, freeing DDP's reducer (the last holder of the process
# group) while gloo's worker thread still drops its last finished work deadlocks: ~ProcessGroupGloo joins that
# thread holding the GIL, and the thread needs the GIL to release the work's tensors. The entry point exits
# through os._exit once everything is written, so these are never freed.
_KEPT_UNTIL_EXIT: list[object] = []


_SIGNALS_SEEN: list[str] = []  # SIGTERMs received, noted whether or not they raised
_RAISE_ON_SIGTERM = [True]  # armed while training; disarmed once a failure is being handled and written


def _raise_on_sigterm(signum: int, _frame: object) -> None:
    # torchrun stops the surviving ranks with SIGTERM when one fails, and Slurm does at the time limit or on a
    # requeue: turn the first into an exception so the run directory still gets its status.json. A later one
    # (srun repeats the signal) only gets noted: raised inside the failure handling it would skip the state
    # assignment and leave a stopped run written as `completed`.
    name = signal.Signals(signum).name
    _SIGNALS_SEEN.append(name)
    if _RAISE_ON_SIGTERM[0]:
        _RAISE_ON_SIGTERM[0] = False
        raise SystemExit(f"terminated by signal {name}")


def _reload(first: Trainer, dist: distributed.Dist, out_dir: Path, on_row: Callable[[dict], None]) -> Trainer:
    """checkpoint.reload_with: a fresh trainer, built from the recipe with its changes, loads the checkpoint the
    first one saved and trains the remaining steps (its rows follow the first's in metrics.jsonl)."""
    if dist.initialized:
        torch.distributed.barrier()  # global rank 0 has written the checkpoint
    saved = rundir.checkpoint_dir(out_dir, first.completed)
    second = Trainer(first.recipe.reloaded(str(saved)), dist, log=lambda line: print(line, flush=True))
    second.skipped, second.nan_steps = first.skipped, first.nan_steps
    _KEPT_UNTIL_EXIT.append(first)  # freed only at exit (see _KEPT_UNTIL_EXIT)
    second.run(on_row=on_row, out_dir=out_dir)
    return second


def main(recipe: Recipe, out_dir: Path, started_at: float | None = None) -> int:
    """Train, write the run directory; 0 on success, 1 on failure (status.json says why)."""
    started_at = started_at or time.time()
    _SIGNALS_SEEN.clear()
    _RAISE_ON_SIGTERM[0] = True
    signal.signal(signal.SIGTERM, _raise_on_sigterm)
    out_dir.mkdir(parents=True, exist_ok=True)
    is_main = int(os.environ.get("RANK", 0)) == 0
    world = int(os.environ.get("WORLD_SIZE", 1))
    trainer: Trainer | None = None
    metrics: MetricsWriter | None = None
    state, reason, rc = "completed", None, 0
    device, gpu_name = "cpu", None
    try:
        dist = distributed.setup(recipe.device)
        device = dist.device.type
        gpu_name = torch.cuda.get_device_name(dist.device) if device == "cuda" else None
        if is_main:
            rundir.write_env(out_dir, environment(dist.world_size))
            rundir.write_recipe(out_dir, recipe.model_dump(mode="json"), only_if_absent=True)
        trainer = Trainer(recipe, dist, log=lambda line: print(line, flush=True))
        print(trainer.describe(), flush=True)
        metrics = MetricsWriter(out_dir) if is_main else None
        trainer.run(on_row=metrics.write if metrics else lambda row: None, out_dir=out_dir)
        if recipe.checkpoint.reload_with is not None:  # the run goes on in a fresh trainer from its checkpoint
            trainer = _reload(trainer, dist, out_dir, metrics.write if metrics else lambda row: None)
    except BaseException as err:  # noqa: BLE001 (Ctrl-C and SystemExit are failures too)
        _RAISE_ON_SIGTERM[0] = False
        state, reason, rc = "failed", one_line(err), 1
        traceback.print_exc(file=sys.stderr)
    finally:
        _RAISE_ON_SIGTERM[0] = False
        if state == "completed" and _SIGNALS_SEEN:  # a signal landed between the failure and its handling
            state, reason, rc = "failed", f"terminated by signal {_SIGNALS_SEEN[0]}", 1
        if metrics is not None:
            metrics.close()
        if is_main:
            rundir.write_status(out_dir, rundir.trainer_status(
                state=state, reason=reason,
                steps_completed=trainer.completed if trainer else 0,
                steps_planned=recipe.training.steps,
                skipped_iterations=trainer.skipped if trainer else 0,
                nan_iterations=trainer.nan_steps if trainer else 0,
                flops_per_step=trainer.flops.total if trainer else _flops_or_zero(recipe, world),
                world_size=world, device=device, gpu_name=gpu_name, torch_version=torch.__version__,
                params=trainer.params if trainer else 0, started_at=started_at, ended_at=time.time(),
                signal=_SIGNALS_SEEN[0] if _SIGNALS_SEEN and state != "completed" else None,
            ), rundir.TRAINER)
        _KEPT_UNTIL_EXIT.append(trainer)
        distributed.teardown()
    print(json.dumps({"state": state, "reason": reason}), file=sys.stderr if rc else sys.stdout, flush=True)
    return rc
