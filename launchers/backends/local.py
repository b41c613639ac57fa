"""Local backend: each attempt runs as processes on this machine (torchrun when it has several ranks)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from pydantic import Field, field_validator

from launchers.base import JobState, Launcher, LauncherSettings, LaunchSpec, Rendered, Submitted
from launchers.command import ROOT, attempt_argv, here_python, local_argv, runtime_env
from launchers.profile import SlurmProfile
from launchers.registry import register
from launchers.safety import refuse_control


class LocalSettings(LauncherSettings):
    """Settings of the local backend (`launchers.local` in a campaign)."""

    parallel: int = Field(1, ge=1, description="Attempts running at once on this machine.")
    python: str | None = Field(
        None, description="Interpreter that runs the trainer and torchrun (default: the one running mbx)."
    )

    @field_validator("python")
    @classmethod
    def _no_control(cls, value: str | None) -> str | None:
        return refuse_control(value)


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
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _signal_group(job: Submitted, sig: signal.Signals) -> None:
    try:
        os.killpg(int(job.job_id.partition("@")[0]), sig)
    except ProcessLookupError:
        pass


@register
class LocalLauncher(Launcher):
    """Runs attempts as child processes in their own sessions, so they outlive a killed orchestrator."""

    name = "local"
    Settings = LocalSettings
    settings: LocalSettings

    def __init__(
        self, settings: LocalSettings | dict | None, workspace: Path, profile: SlurmProfile | None = None
    ):
        super().__init__(settings, workspace, profile)
        self._children: dict[str, subprocess.Popen[bytes]] = {}

    @property
    def max_in_flight(self) -> int:
        return self.settings.parallel

    def _argv(self, spec: LaunchSpec) -> list[str]:
        python = here_python(self.settings.python)
        limit = spec.resources.time_limit_min * 60 if spec.resources.time_limit_min else None
        return attempt_argv(
            python,
            spec.run_dir,
            spec.log_dir / "launcher.log",
            limit,
            local_argv(spec, python),
            spec.gpu_need,
        )

    def render(self, specs: list[LaunchSpec]) -> list[Rendered]:
        self.check_specs(specs)
        return [
            Rendered(
                [spec], commands=[self._argv(spec)], notes=["env set: " + " ".join(sorted(runtime_env(spec)))]
            )
            for spec in specs
        ]

    def launch(self, rendered: Rendered) -> list[Submitted]:
        (spec,) = rendered.specs
        env = dict(os.environ)
        env.update(runtime_env(spec))
        if "OMP_NUM_THREADS" not in env:  # share the cores among parallel attempts instead of oversubscribing
            per_rank = (os.cpu_count() or 1) // (self.settings.parallel * spec.resources.gpus_per_node)
            env["OMP_NUM_THREADS"] = str(max(1, per_rank))
        env["PYTHONPATH"] = os.pathsep.join(p for p in [str(ROOT), env.get("PYTHONPATH", "")] if p)
        proc = subprocess.Popen(
            rendered.submit_argv or [],
            env=env,
            cwd=spec.run_dir,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        job_id = f"{proc.pid}@{_proc_start_time(proc.pid)}"
        self._children[job_id] = proc
        return [
            Submitted(spec.cell_id, spec.attempt, job_id, {"pid": proc.pid, "argv": rendered.submit_argv})
        ]

    def poll(self, jobs: list[Submitted]) -> dict[str, JobState]:
        """Process states (the run dir says how an attempt ended: the engine reads it with rundir.resolve_state)."""
        states: dict[str, JobState] = {}
        for job in jobs:
            child = self._children.get(job.job_id)
            if child is not None:
                code = child.poll()
                running = code is None
                states[job.job_id] = (
                    JobState.RUNNING if running else (JobState.COMPLETED if code == 0 else JobState.FAILED)
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
