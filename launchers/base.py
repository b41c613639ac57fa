"""The launcher interface: what one attempt needs (LaunchSpec), what a backend will do (Rendered), job states, the Launcher base class."""

from __future__ import annotations

import abc
import shlex
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict

from launchers.profile import SlurmProfile
from launchers.safety import check_env_name, check_name, check_no_nul, check_value
from trainer import rundir


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


@dataclass(frozen=True)
class GpuNeed:
    """What one GPU must hold for a point, by its memory estimate (orchestrator/run/feasibility.py): the attempt
    wrapper refuses to start the point's command on a GPU with less memory (launchers/node/attempt.py)."""

    min_gib: float  # the smallest GPU memory it fits on (peak + allocator slack; the headroom gate)
    planned: str  # the GPU it was planned on, e.g. "H200, 139.8 GiB" (for the reason)

    def entry(self) -> dict[str, Any]:
        """As the task table and the attempt wrapper read it."""
        return {"min_gib": self.min_gib, "planned": self.planned}


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
    gpu_need: GpuNeed | None = None  # checked on the node before the command starts (None: nothing to check)

    @property
    def job_name(self) -> str:
        return f"mbx-{self.campaign}-{self.cell_id}-a{self.attempt}"

    @property
    def log_dir(self) -> Path:
        return self.run_dir / rundir.LOGS


@dataclass
class Rendered:
    """What a backend will do for a group of specs, decided before anything is written or launched.

    `submit()` writes `files` byte for byte, then `launch()` runs exactly `commands` (or the tool call they
    stand for); `describe()` is what a dry run prints.
    """

    specs: list[LaunchSpec]
    # written by submit() before launch(): path → content
    files: dict[Path, str] = field(default_factory=dict)
    # job scripts a shell reads (a subset of files; NeMo-Run writes its own)
    scripts: dict[Path, str] = field(default_factory=dict)
    commands: list[list[str]] = field(default_factory=list)  # the submit commands, in order
    notes: list[str] = field(default_factory=list)  # comment lines for a dry run (e.g. the env names set)

    @property
    def submit_argv(self) -> list[str] | None:
        """The (first) command that launches this group; None when a tool's API launches it."""
        return self.commands[0] if self.commands else None

    def describe(self) -> str:
        """What a dry run prints: notes, each job script, each other file (task tables), each submit command."""
        out = [f"# {note}" for note in self.notes]
        for path, text in self.scripts.items():
            out.append(f"# ---- {path}\n{text.rstrip()}\n")
        for path, text in self.files.items():
            if path not in self.scripts:
                out.append(f"# ---- {path} (read by the ranks; no shell sees it)\n{text.rstrip()}\n")
        out.extend("$ " + shlex.join(argv) for argv in self.commands)
        return "\n".join(out) + "\n"


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
    """A backend: render specs into files and commands, submit them, poll and cancel jobs.

    `submit()` always renders first and launches exactly what `render()` returned, so a dry run (which prints
    `Rendered.describe()` of the same `render()`) shows the real thing.
    """

    name: ClassVar[str]
    Settings: ClassVar[type[LauncherSettings]] = LauncherSettings

    def __init__(
        self,
        settings: LauncherSettings | dict[str, Any] | None,
        workspace: Path,
        profile: SlurmProfile | None = None,
    ):
        if settings is None or isinstance(settings, dict):
            settings = self.Settings.model_validate(settings or {})
        self.settings = settings
        check_value("--workspace", workspace)  # before any file system call (NUL) or script (newline) sees it
        self.workspace = Path(workspace).expanduser().resolve()  # run dirs are used from other cwds
        check_value("--workspace", self.workspace)
        self.profile = profile if profile is not None else SlurmProfile()

    @classmethod
    def create(
        cls,
        settings: LauncherSettings | dict[str, Any] | None,
        workspace: Path,
        profile: SlurmProfile | None = None,
    ) -> Launcher:
        """The launcher a campaign's settings ask for: this backend (one whose settings still carry an old
        spelling of another backend, as NeMo-Run's `executor: local`, answers with that one)."""
        return cls(settings, workspace, profile)

    @property
    def max_in_flight(self) -> int | None:
        """Attempts to keep submitted at once (None: submit everything at once)."""
        return None

    @abc.abstractmethod
    def render(self, specs: list[LaunchSpec]) -> list[Rendered]:
        """Pure: the files and commands that would launch these specs (writes nothing, submits nothing).

        Every backend starts with `self.check_specs(specs)`."""

    def check_specs(self, specs: list[LaunchSpec]) -> None:
        """Refuse (UnsafeValue) a spec whose names, paths or values cannot reach a job script or a process."""
        for spec in specs:
            check_spec(spec)

    @abc.abstractmethod
    def launch(self, rendered: Rendered) -> list[Submitted]:
        """Launch one rendered group exactly as rendered (its files are written already)."""

    @abc.abstractmethod
    def poll(self, jobs: list[Submitted]) -> dict[str, JobState]:
        """Current states by job id."""

    @abc.abstractmethod
    def cancel(self, jobs: list[Submitted]) -> None:
        """Cancel queued or running jobs."""

    def submit(self, specs: list[LaunchSpec]) -> list[Submitted]:
        """Render, write the rendered files, launch each group as rendered."""
        for spec in specs:
            spec.log_dir.mkdir(parents=True, exist_ok=True)
        submitted: list[Submitted] = []
        for rendered in self.render(specs):
            for path, text in rendered.files.items():
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text)
            submitted.extend(self.launch(rendered))
        return submitted


def check_spec(spec: LaunchSpec) -> None:
    """Names and paths without control characters, environment names as names, no NUL in values or argv."""
    check_name("campaign name", spec.campaign)
    where = f"campaign {spec.campaign}"
    check_name(f"{where}: cell id", spec.cell_id)
    where = f"{where}, cell {spec.cell_id}"
    check_value(f"{where}: run dir", spec.run_dir)
    for name, value in spec.env.items():
        check_env_name(f"{where}: env", name)
        check_no_nul(f"{where}: env.{name}", value)
    for name in spec.env_pass:
        check_env_name(f"{where}: env.pass", name)
    if spec.module is not None:
        check_value(f"{where}: module", spec.module)
    for arg in spec.args:
        check_no_nul(f"{where}: argument", arg)
    if spec.gpu_need is not None:
        check_value(f"{where}: planned GPU", spec.gpu_need.planned)
