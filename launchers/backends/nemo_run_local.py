"""NeMo-Run's local executor as its own backend: one Experiment per submission batch, one `run.LocalExecutor` task
per attempt (torchrun for several ranks) on this machine, its jobs' states as NeMo-Run reports them.

`launcher: nemo-run-local` with settings `launchers.nemo-run-local`. `launchers.nemo-run.executor: local` is the
old spelling and still makes this backend (`NemoRunLauncher.create`), recorded under the name it was chosen by.

Each task starts the same per-rank entry as on Slurm (launchers/node/rank.py with the task table; torchrun sets
the ranks) with this machine's interpreter (the interpreter policy, launchers/command.py); `poll` is the scheduled
launcher's (launchers/scheduler.py: the run dir first, then NeMo-Run's word).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydantic import Field

from launchers.base import LauncherSettings, LaunchSpec, Rendered, Submitted
from launchers.command import here_python, node_entry_argv
from launchers.nemo import UNQUOTED, batch_folder, experiment_of, import_nemo_run, require_nemo_run
from launchers.profile import SlurmProfile
from launchers.registry import register
from launchers.safety import check_plain
from launchers.scheduler import ScheduledLauncher, SchedulerState
from launchers.slurm.render import TASKS_FILE, safe_name, shape_of, task_table

# torchx's AppState names (what NeMo-Run reports for a local job) → Slurm's words
NEMO_TERMINAL_STATES = {"SUCCEEDED": "COMPLETED", "FAILED": "FAILED", "CANCELLED": "CANCELLED"}


class NemoRunLocalSettings(LauncherSettings):
    """Settings of NeMo-Run's local executor (`launchers.nemo-run-local` in a campaign)."""

    stop_margin_s: float = Field(
        30.0,
        ge=0,
        description="Stop the trainer this long before its time limit rounded up to whole minutes (as on Slurm).",
    )
    master_port_base: int = Field(
        20000, ge=1024, le=45535, description="The rank entry's MASTER_PORT base (torchrun's own port wins)."
    )


class LocalExecutorJobs:
    """The scheduler of NeMo-Run's local executor: the states NeMo-Run reports for the jobs it started here."""

    def __init__(self) -> None:
        self.jobs: dict[str, tuple[Any, Any]] = {}  # job id → (experiment, job)
        self.states: dict[str, SchedulerState] = {}
        self.queries = 0

    def refresh(self, job_ids: list[str], force: bool = False) -> bool:
        for job_id in job_ids:
            known = self.jobs.get(job_id)
            word = "RUNNING"  # adopted after a restart: only the run dir can tell
            if known is not None:
                experiment, job = known
                # NeMo-Run answers with torchx's AppState; read its name instead of importing torchx here
                name = getattr(job.status(experiment._runner), "name", None)
                word = NEMO_TERMINAL_STATES.get(str(name), "RUNNING")
            self.states[job_id] = SchedulerState(word, "", "nemo-run", time.time())
        self.queries += 1
        return True

    def cancel(self, job_ids: list[str]) -> None:
        for job_id in job_ids:
            known = self.jobs.get(job_id)
            if known is not None:
                experiment, job = known
                job.cancel(experiment._runner)


@contextlib.contextmanager
def here_python_first() -> Iterator[None]:
    """torchrun starts `python` from PATH: make it this machine's interpreter (here_python) while launching."""
    found = shutil.which(here_python())
    before = os.environ.get("PATH", "")
    if found:
        os.environ["PATH"] = os.pathsep.join([str(Path(found).parent), before])
    try:
        yield
    finally:
        os.environ["PATH"] = before


@register
class NemoRunLocalLauncher(ScheduledLauncher):
    """Runs each attempt as a NeMo-Run task on this machine (run.LocalExecutor: torchrun for several ranks)."""

    name = "nemo-run-local"
    Settings = NemoRunLocalSettings
    settings: NemoRunLocalSettings
    query: LocalExecutorJobs

    def __init__(
        self,
        settings: NemoRunLocalSettings | dict[str, Any] | None,
        workspace: Path,
        profile: SlurmProfile | None = None,
        chosen_as: str | None = None,
    ):
        """`chosen_as`: the backend name the campaign chose it by (`nemo-run` with the old `executor: local`):
        its attempts are recorded under that name, so a resume finds the same settings section again."""
        require_nemo_run()
        super().__init__(settings, workspace, profile)
        check_plain("--workspace", self.workspace, UNQUOTED)  # NeMo-Run's experiment dirs
        if chosen_as is not None:
            self.name = chosen_as  # type: ignore[misc]

    def make_scheduler(self) -> LocalExecutorJobs:
        return LocalExecutorJobs()

    def script(self, table: Path, index: int) -> Any:
        """run.Script of the per-rank entry: torchrun (or `python` on PATH) starts it with an unquoted argv."""
        argv = node_entry_argv("python", table, self.settings.master_port_base, index)
        return import_nemo_run().Script(path=argv[2], args=argv[3:], entrypoint="python")

    def executor(self, spec: LaunchSpec) -> Any:
        ranks = spec.resources.gpus_per_node
        return import_nemo_run().LocalExecutor(
            ntasks_per_node=ranks, launcher="torchrun" if ranks > 1 else None
        )

    def render(self, specs: list[LaunchSpec]) -> list[Rendered]:
        """The batch's task table (NeMo-Run writes no job script for a local task)."""
        self.check_specs(specs)
        if not specs:
            return []
        table = batch_folder(self.workspace, specs) / TASKS_FILE
        files = {table: task_table(specs, self.profile, self.settings.stop_margin_s, here_python())}
        note = f"NeMo-Run local executor: {len(specs)} task(s), started with {here_python()}"
        return [Rendered(list(specs), files, notes=[note])]

    def launch(self, rendered: Rendered) -> list[Submitted]:
        table = next(iter(rendered.files))
        with experiment_of(self.workspace, rendered.specs) as experiment:
            for index, spec in enumerate(rendered.specs):
                name = safe_name(f"{spec.cell_id}-a{spec.attempt}")
                experiment.add(self.script(table, index), executor=self.executor(spec), name=name)
            with here_python_first():
                experiment.run(detach=True)
        now = time.time()
        submitted = []
        for index, (spec, job) in enumerate(zip(rendered.specs, experiment.jobs, strict=True)):
            if not job.launched or not job.handle:
                raise RuntimeError(f"NeMo-Run did not launch {job.id} (state {job.state})")
            self.query.jobs[job.handle] = (experiment, job)
            info = {"run_dir": str(spec.run_dir), "index": index, "time_min": shape_of(spec)[2], "tasks": str(table),
                    "handle": job.handle, "submitted_at": now, "experiment": experiment._id}  # fmt: skip
            submitted.append(Submitted(spec.cell_id, spec.attempt, job.handle, info))
        return submitted
