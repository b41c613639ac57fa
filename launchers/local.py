"""Local backend: each attempt runs as processes on this machine (torchrun when it has several ranks)."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

from pydantic import Field

from launchers.base import JobState, Launcher, LauncherSettings, LaunchSpec, Rendered, Submitted
from launchers.jobenv import runtime_env
from launchers.registry import register


class LocalSettings(LauncherSettings):
    """Settings of the local backend (`launchers.local` in a campaign)."""

    parallel: int = Field(1, ge=1, description="Attempts running at once on this machine.")
    python: str = Field(sys.executable, description="Interpreter that runs the trainer and torchrun.")


def _proc_start_time(pid: int) -> str | None:
    """The kernel's start time of a process (clock ticks since boot), to tell a live job from a reused pid."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def _alive(job_id: str) -> bool:
    pid_text, _, start = job_id.partition("@")
    pid = int(pid_text)
    current = _proc_start_time(pid)
    if current is None or current != start:
        return False
    state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    return state != "Z"


def rank_command(spec: LaunchSpec, python: str) -> list[str]:
    """argv that runs the attempt's ranks on one node: the program alone for one rank, under torchrun for
    several (an external command runs once per rank, as srun runs it on Slurm)."""
    ranks = spec.resources.gpus_per_node
    program = list(spec.args) if spec.module is None else ["-m", spec.module, *spec.args]
    if ranks == 1 or not spec.distributed:
        return program if spec.module is None else [python, *program]
    return [
        python, "-m", "torch.distributed.run",
        "--standalone", "--nnodes", "1", "--nproc-per-node", str(ranks),
        "--log-dir", str(spec.log_dir / "ranks"), "--tee", "3",
        *(["--no-python"] if spec.module is None else []), *program,
    ]  # fmt: skip


@register
class LocalLauncher(Launcher):
    """Runs attempts as child processes in their own sessions, so they outlive a killed orchestrator."""

    name = "local"
    Settings = LocalSettings

    @property
    def max_in_flight(self) -> int:  # type: ignore[override]
        return self.settings.parallel

    def _argv(self, spec: LaunchSpec) -> list[str]:
        wrapper = [self.settings.python, "-m", "launchers._attempt", "--run-dir", str(spec.run_dir)]
        wrapper += ["--log", str(spec.log_dir / "launcher.log")]
        if spec.resources.time_limit_min:
            wrapper += ["--time-limit-s", str(spec.resources.time_limit_min * 60)]
        return [*wrapper, "--", *rank_command(spec, self.settings.python)]

    def render(self, specs: list[LaunchSpec]) -> list[Rendered]:
        rendered = []
        for spec in specs:
            argv = self._argv(spec)
            env_names = sorted(runtime_env(spec, rank=None))
            text = "# env set: " + " ".join(env_names) + "\n" + shlex.join(argv) + "\n"
            rendered.append(Rendered([spec], {}, argv, description=text))
        return rendered

    def launch(self, rendered: Rendered) -> list[Submitted]:
        (spec,) = rendered.specs
        env = dict(os.environ)
        env.update(runtime_env(spec, rank=None))
        if "OMP_NUM_THREADS" not in env:  # share the cores among parallel attempts instead of oversubscribing
            per_rank = (os.cpu_count() or 1) // (self.settings.parallel * spec.resources.gpus_per_node)
            env["OMP_NUM_THREADS"] = str(max(1, per_rank))
        env["PYTHONPATH"] = os.pathsep.join(p for p in [_project_root(), env.get("PYTHONPATH", "")] if p)
        proc = subprocess.Popen(
            rendered.submit_argv,
            env=env,
            cwd=spec.run_dir,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        job_id = f"{proc.pid}@{_proc_start_time(proc.pid)}"
        self._children = getattr(self, "_children", {})
        self._children[job_id] = proc
        return [
            Submitted(spec.cell_id, spec.attempt, job_id, {"pid": proc.pid, "argv": rendered.submit_argv})
        ]

    def poll(self, jobs: list[Submitted]) -> dict[str, JobState]:
        states: dict[str, JobState] = {}
        children = getattr(self, "_children", {})
        for job in jobs:
            child = children.get(job.job_id)
            if child is not None:
                code = child.poll()
                states[job.job_id] = (
                    JobState.RUNNING
                    if code is None
                    else (JobState.COMPLETED if code == 0 else JobState.FAILED)
                )
            else:  # adopted after a restart: only liveness is known; the run dir tells the rest
                states[job.job_id] = JobState.RUNNING if _alive(job.job_id) else JobState.COMPLETED
        return states

    def cancel(self, jobs: list[Submitted], grace_s: float = 20.0) -> None:
        """SIGTERM each attempt's process group, then SIGKILL what is still alive after `grace_s`."""
        live = [job for job in jobs if _alive(job.job_id)]
        for job in live:
            _signal_group(job, signal.SIGTERM)
        deadline = time.time() + grace_s
        while live and time.time() < deadline:
            time.sleep(0.2)
            live = [job for job in live if _alive(job.job_id)]
        for job in live:
            _signal_group(job, signal.SIGKILL)


def _signal_group(job: Submitted, sig: signal.Signals) -> None:
    try:
        os.killpg(int(job.job_id.partition("@")[0]), sig)
    except ProcessLookupError:
        pass


def _project_root() -> str:
    """The directory holding the launchers/ and trainer/ packages (for source checkouts)."""
    return str(Path(__file__).resolve().parent.parent)
