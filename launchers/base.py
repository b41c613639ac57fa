"""The launcher interface: what one attempt needs (LaunchSpec), job states, and the Launcher base class."""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict


class JobState(str, Enum):
    """Scheduler-level state of one attempt."""

    PENDING = "pending"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    TIMEOUT = "timeout"
    CANCELLED = "cancelled"
    PREEMPTED = "preempted"
    UNKNOWN = "unknown"

    @property
    def finished(self) -> bool:
        return self not in (JobState.PENDING, JobState.RUNNING, JobState.UNKNOWN)


@dataclass(frozen=True)
class Resources:
    """How many nodes and ranks an attempt takes, and for how long."""

    nodes: int = 1
    gpus_per_node: int = 1  # ranks per node (one rank per GPU; on CPU, processes)
    time_limit_min: float | None = None

    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node


@dataclass(kw_only=True)
class LaunchSpec:
    """One attempt of one cell: what runs, where its files go. Built by the orchestrator, never by backends."""

    campaign: str
    cell_id: str
    attempt: int
    run_dir: Path
    resources: Resources
    module: str | None = None  # a Python module run on every rank (bundled trainer: "trainer")
    args: list[str] = field(default_factory=list)  # module arguments, or the whole argv when module is None
    env: dict[str, str] = field(default_factory=dict)  # non-secret values set for the trainer
    env_pass: list[str] = field(default_factory=list)  # names passed through from the submitting environment
    distributed: bool = True  # launcher provides torch.distributed rendezvous for module entries

    @property
    def job_name(self) -> str:
        return f"mbx-{self.campaign}-{self.cell_id}-a{self.attempt}"

    @property
    def log_dir(self) -> Path:
        return self.run_dir / "logs"


@dataclass
class Rendered:
    """What a backend would do for a group of specs: scripts to write and the submit command."""

    specs: list[LaunchSpec]
    files: dict[Path, str]  # path → content (job scripts)
    submit_argv: list[str] | None  # the command that would submit them (None for in-process backends)
    description: str = ""


@dataclass
class Submitted:
    """A submitted attempt: the backend's job id and anything it needs to poll it later."""

    cell_id: str
    attempt: int
    job_id: str
    info: dict[str, Any] = field(default_factory=dict)


class LauncherSettings(BaseModel):
    """Base of every backend's settings (the campaign's `launchers.<name>` section)."""

    model_config = ConfigDict(extra="forbid")


class Launcher(abc.ABC):
    """A backend: render specs into scripts/commands, submit them, poll and cancel jobs.

    `submit()` always renders first and launches exactly what `render()` returned, so a dry run shows the
    real thing.
    """

    name: ClassVar[str]
    Settings: ClassVar[type[LauncherSettings]] = LauncherSettings
    max_in_flight: int | None = None  # None: submit everything at once

    def __init__(self, settings: LauncherSettings | None, workspace: Path, cluster: Any = None):
        self.settings = settings if settings is not None else self.Settings()
        self.workspace = Path(workspace).expanduser().resolve()  # run dirs are used from other cwds
        self.cluster = cluster

    @abc.abstractmethod
    def render(self, specs: list[LaunchSpec]) -> list[Rendered]:
        """Pure: the scripts and commands that would launch these specs."""

    @abc.abstractmethod
    def launch(self, rendered: Rendered) -> list[Submitted]:
        """Launch one rendered group exactly as rendered."""

    @abc.abstractmethod
    def poll(self, jobs: list[Submitted]) -> dict[str, JobState]:
        """Current states by job id."""

    @abc.abstractmethod
    def cancel(self, jobs: list[Submitted]) -> None:
        """Cancel queued or running jobs."""

    def submit(self, specs: list[LaunchSpec]) -> list[Submitted]:
        for spec in specs:
            spec.log_dir.mkdir(parents=True, exist_ok=True)
        submitted: list[Submitted] = []
        for rendered in self.render(specs):
            for path, text in rendered.files.items():
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text)
            submitted.extend(self.launch(rendered))
        return submitted

    def exit_info(self, job: Submitted) -> dict[str, Any]:
        """Backend knowledge about a finished job (exit code, scheduler reason)."""
        return {}
