"""Helpers of the trainer tests: tiny recipes, running `python -m trainer` / torchrun for real, several runs in one
spawned gloo world (`train_on_ranks`), reading run dirs."""

from __future__ import annotations

import copy
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import yaml

from trainer import rundir

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # the in-process unit tests import trainer.* from the checkout
    sys.path.insert(0, str(ROOT))

# A few milliseconds per CPU step: GQA (4 q / 2 kv heads), SwiGLU, MoE every 2nd layer with a shared expert.
TINY_MOE = {
    "model": {
        "vocab_size": 200,
        "hidden_size": 32,
        "num_layers": 2,
        "num_attention_heads": 4,
        "num_query_groups": 2,
        "ffn_hidden_size": 64,
        "moe": {"num_experts": 4, "top_k": 2, "ffn_hidden_size": 32, "layer_freq": 2, "num_shared_experts": 1},
    },
    "training": {"seq_length": 16, "micro_batch_size": 2, "global_batch_size": 4, "steps": 6, "seed": 7},
    "optimizer": {"lr": 3e-3, "warmup_steps": 2},
    "device": "cpu",
}


def recipe_dict(**overrides: object) -> dict:
    """TINY_MOE with dotted-key overrides, e.g. recipe_dict(**{"training.seed": 8})."""
    data = copy.deepcopy(TINY_MOE)
    for key, value in overrides.items():
        node = data
        *parents, last = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    return data


def write_recipe(path: Path, data: dict) -> Path:
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def trainer_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    env.setdefault("OMP_NUM_THREADS", "1")
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_PROCID"):
        env.pop(var, None)
    env.update(extra or {})
    return env


def run_trainer(out: Path, recipe: dict, *args: str, env: dict[str, str] | None = None, timeout: float = 300
                ) -> subprocess.CompletedProcess:
    """`python -m trainer --recipe <out>.yaml --out <out> ARGS` in a fresh process."""
    out.parent.mkdir(parents=True, exist_ok=True)
    recipe_path = write_recipe(out.parent / f"{out.name}.yaml", recipe)
    cmd = [sys.executable, "-m", "trainer", "--recipe", str(recipe_path), "--out", str(out), *args]
    return subprocess.run(cmd, cwd=ROOT, env=trainer_env(env), capture_output=True, text=True, timeout=timeout)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


# MASTER_PORTs of the spawned worlds come from below the kernel's ephemeral range (32768-60999 here): a rank keeps
# its finished runs' process groups until it exits (trainer.train._KEPT_UNTIL_EXIT), and every gloo listener they
# open takes an ephemeral port, which could otherwise land on a port picked for a later run.
WORLD_PORTS = range(10000, 20000)


RunSpec = tuple[str, str, int, dict[str, str]]  # out dir, recipe file, MASTER_PORT, extra env
AfterRuns = Callable[[int, int, int], None]  # (rank, world, a MASTER_PORT of its own): a rank's work after its runs


def _rank_runs(rank: int, world: int, runs: list[RunSpec]) -> None:
    """Rank `rank` of each run in turn, through the trainer's entry point (`trainer.__main__.run`, what
    `python -m trainer` calls) with torchrun's variables; a port per run, as the trainer joins a new process
    group every time (the old ones stay until the process exits)."""
    import signal

    import trainer.__main__ as entry

    for out, recipe_path, port, env in runs:
        saved = dict(os.environ)
        os.environ.update({"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world),
                           "LOCAL_WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                           **env})  # fmt: skip
        try:
            code = entry.run(["--recipe", recipe_path, "--out", out])
        finally:
            os.environ.clear()
            os.environ.update(saved)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the trainer's handler: spawn's SIGTERM must kill
        if code:
            raise RuntimeError(f"rank {rank} of {out} exited {code}")


def _rank_main(rank: int, world: int, runs: list[RunSpec], after: AfterRuns | None, after_port: int) -> None:
    """A spawned rank: its runs, then `after`; it ends as `python -m trainer` does, without interpreter teardown,
    which can deadlock on the distributed objects the trainer keeps until exit."""
    from trainer.__main__ import exit_now

    _rank_runs(rank, world, runs)
    if after is not None:
        after(rank, world, after_port)
    exit_now(0)


def _new_port(taken: set[int]) -> int:
    """A port of WORLD_PORTS that is free now and not in `taken` (which gains it)."""
    import random

    while True:
        port = random.choice(WORLD_PORTS)
        if port in taken:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        taken.add(port)
        return port


def spawn_ranks(target: Callable[..., None], args: tuple, world: int, timeout_s: float = 300) -> None:
    """torch.multiprocessing.spawn(target, args, world) with a deadline: the ranks are killed and the test fails
    when they have not all finished after `timeout_s`."""
    import torch.multiprocessing

    context = torch.multiprocessing.spawn(target, args=args, nprocs=world, join=False)
    deadline = time.monotonic() + timeout_s
    while not context.join(timeout=1):
        if time.monotonic() > deadline:
            for process in context.processes:
                process.kill()
            raise AssertionError(f"{world} spawned ranks still running after {timeout_s:.0f} s")


def train_on_ranks(folder: Path, world: int, runs: dict[str, tuple[dict, dict[str, str]]],
                   after: AfterRuns | None = None) -> dict[str, list[dict]]:
    """Train every {name: (recipe, extra env)} on `world` spawned gloo ranks, one run after another (one torch
    import per rank for all of them), then call `after` in every rank (picklable: a module-level function or a
    functools.partial of one); each run must complete. Metrics rows by name."""
    folder.mkdir(parents=True, exist_ok=True)
    ports: set[int] = set()
    specs = [(str(folder / name), str(write_recipe(folder / f"{name}.yaml", recipe)), _new_port(ports), env)
             for name, (recipe, env) in runs.items()]  # fmt: skip
    spawn_ranks(_rank_main, (world, specs, after, _new_port(ports)), world)
    for name in runs:
        assert status(folder / name)["state"] == "completed", name
    return {name: metrics(folder / name) for name in runs}


def run_torchrun(out: Path, recipe: dict, nproc: int, env: dict[str, str] | None = None, timeout: float = 300
                 ) -> subprocess.CompletedProcess:
    """`torchrun --nproc-per-node N --rdzv-backend c10d --rdzv-endpoint localhost:PORT -m trainer ...`."""
    out.parent.mkdir(parents=True, exist_ok=True)
    recipe_path = write_recipe(out.parent / f"{out.name}.yaml", recipe)
    torchrun = Path(sys.executable).with_name("torchrun")
    cmd = [str(torchrun), "--nproc-per-node", str(nproc), "--rdzv-backend", "c10d",
           "--rdzv-endpoint", f"localhost:{free_port()}", "-m", "trainer", "--recipe", str(recipe_path),
           "--out", str(out)]
    return subprocess.run(cmd, cwd=ROOT, env=trainer_env(env), capture_output=True, text=True, timeout=timeout)


def metrics(out: Path) -> list[dict]:
    return rundir.read_metrics(out)


def status(out: Path) -> dict | None:
    return rundir.read_status(out)


def losses(out: Path) -> list[float | None]:
    return [row["loss"] for row in metrics(out)]


def explain(proc: subprocess.CompletedProcess) -> str:
    return f"exit {proc.returncode}\n--- stdout\n{proc.stdout[-3000:]}\n--- stderr\n{proc.stderr[-5000:]}"
