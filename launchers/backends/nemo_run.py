"""NeMo-Run backend: one Experiment per submission batch, one run.SlurmExecutor task per attempt (or per pack).

The Slurm path (task table, packing, the rank entry each task runs, point info) is the Slurm base's
(launchers/slurm/launcher.py); this module spells a batch as an Experiment: `render_job` is NeMo-Run's own dry run,
`submit_job` runs it. NeMo-Run's local executor is its own backend (launchers/backends/nemo_run_local.py);
`executor: local` here is its old spelling (`NemoRunLauncher.create`).
"""

from __future__ import annotations

import contextlib
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from launchers import registry
from launchers.base import Launcher, LaunchSpec, Rendered
from launchers.nemo import (
    UNQUOTED,
    base_dir,
    batch_folder,
    experiment_of,
    import_nemo_run,
    require_nemo_run,
)
from launchers.safety import check_plain, plain_problem, shell_word
from launchers.slurm.launcher import Batch, JobFile, Launched, SlurmLauncher
from launchers.slurm.render import JobRequest, safe_name
from launchers.slurm.settings import SlurmSettings


class NemoRunSettings(SlurmSettings):
    """Settings of the NeMo-Run backend (`launchers.nemo-run` in a campaign)."""

    executor: Literal["slurm", "local"] = Field(
        "slurm",
        description="run.SlurmExecutor; 'local' is the old spelling of the nemo-run-local backend (run.LocalExecutor).",
    )
    tunnel: Literal["local", "ssh"] = Field(
        "local",
        description="run.LocalTunnel (mbx runs on the login node) or run.SSHTunnel (host/user/job_dir).",
    )
    host: str | None = Field(None, description="SSH tunnel: login node host name.")
    user: str | None = Field(None, description="SSH tunnel: user name on the login node.")
    identity: str | None = Field(None, description="SSH tunnel: private key file.")
    job_dir: str | None = Field(
        None,
        description="Where NeMo-Run keeps experiments on the cluster (SSH: required; local: "
        "<workspace>/<campaign>/nemo-run/experiments). With SSH the workspace must have the same path on both sides.",
    )

    @model_validator(mode="after")
    def _pack_needs_slurm(self) -> NemoRunSettings:
        if self.pack > 1 and self.executor != "slurm":
            raise ValueError(
                "pack > 1 needs executor 'slurm' (the points of a pack are srun steps of one allocation)"
            )
        return self

    @field_validator("host", "user", "job_dir", "identity")
    @classmethod
    def _plain(cls, value: str | None) -> str | None:
        # identity: inside single quotes in NeMo-Run's rsync command; ssh expands a leading ~ itself
        problem = plain_problem(value.removeprefix("~"), show=False) if value else None
        if problem:
            raise ValueError(f"{problem} ({UNQUOTED})")
        return value


@contextlib.contextmanager
def dry_run_lock(base_dir: Path) -> Iterator[None]:
    """One dry run at a time per campaign's NeMo-Run folder: the Experiment id is deterministic, so concurrent
    dry runs share its folder, and NeMo-Run's dry run creates and removes it (unlocked, one removed the folder
    under another: FileNotFoundError / "Directory not empty")."""
    import fcntl

    base_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(base_dir, os.O_RDONLY)  # the folder itself is locked: no lock file is left behind
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def close_experiment(experiment: Any) -> None:
    """Release what a (dry-run) Experiment holds now, not in its __del__ at interpreter exit: NeMo-Run's
    `__del__` tears down logging, tunnels and the torchx runner while the interpreter is finalizing."""
    try:
        experiment._cleanup()
    except Exception:  # noqa: BLE001, S110 - best effort, as NeMo-Run's own __del__
        pass
    experiment._cleanup = lambda *args, **kwargs: None  # __del__ would close them a second time


def srun_word() -> Callable[[str], str]:
    """How a value must be passed to NeMo-Run to reach its srun line as one word: NeMo-Run 0.11 means to quote
    srun arguments but does not (`noquote = str`, so every argument counts as "do not quote"): quote them here."""
    from nemo_run.core.execution import slurm

    quotes = getattr(slurm, "noquote", str) is not str
    return (lambda text: text) if quotes else shell_word


def _hhmmss(minutes: int | None) -> str | None:
    return None if minutes is None else f"{minutes // 60:02d}:{minutes % 60:02d}:00"


def _job_id(handle: str) -> str:
    """`slurm_tunnel://nemo_run/123` → `123`; other handles are kept whole."""
    return handle.rsplit("/", 1)[-1] if handle.startswith("slurm") else handle


def quoted_script(argv: list[str]) -> Any:
    """run.Script running `argv` on the node; NeMo-Run joins args with spaces, so each is quoted here."""
    return import_nemo_run().Script(
        path=shlex.quote(argv[2]), args=[shlex.quote(a) for a in argv[3:]], entrypoint=shlex.join(argv[:2])
    )


@registry.register
class NemoRunLauncher(SlurmLauncher):
    """Builds a NeMo-Run Experiment (deterministic id) per batch; render() is NeMo-Run's own dry run."""

    name = "nemo-run"
    Settings = NemoRunSettings
    settings: NemoRunSettings

    @classmethod
    def create(cls, settings: Any, workspace: Path, profile: Any = None) -> Launcher:
        """This backend, or with the old `executor: local` the nemo-run-local backend, recorded as `nemo-run`."""
        if settings is None or isinstance(settings, dict):
            settings = cls.Settings.model_validate(settings or {})
        if settings.executor != "local":
            return cls(settings, workspace, profile)
        local = {"stop_margin_s": settings.stop_margin_s, "master_port_base": settings.master_port_base}
        return registry.get("nemo-run-local")(local, workspace, profile, chosen_as=cls.name)  # type: ignore[call-arg]

    def __init__(self, settings: Any, workspace: Path, profile: Any = None):
        require_nemo_run()
        self._tunnel: Any = None
        super().__init__(settings, workspace, profile)
        if self.settings.executor == "local":
            raise ValueError(
                "executor 'local' is the nemo-run-local backend (made by NemoRunLauncher.create)"
            )
        # experiment dirs: `mkdir -p DIR`, `srun --output DIR`
        check_plain("--workspace", self.workspace, UNQUOTED)

    def scheduler_command(self, argv: list[str]) -> Any:
        if self.settings.tunnel != "ssh":
            return super().scheduler_command(argv)
        if self._tunnel is None:
            return subprocess.CompletedProcess(argv, 1, "", "no SSH tunnel yet")
        self._tunnel.connect()
        result = self._tunnel.run(shlex.join(argv), hide=True, warn=True)
        return subprocess.CompletedProcess(argv, result.return_code, result.stdout, result.stderr)

    # NeMo-Run objects ------------------------------------------------------------------------------------
    def tunnel(self, spec: LaunchSpec) -> Any:
        run = import_nemo_run()
        s = self.settings
        if s.tunnel == "ssh":
            if not (s.host and s.user and s.job_dir):
                raise ValueError("launchers.nemo-run: tunnel 'ssh' needs host, user and job_dir")
            if self._tunnel is None:  # one connection, shared
                self._tunnel = run.SSHTunnel(host=s.host, user=s.user, job_dir=s.job_dir, identity=s.identity)
            return self._tunnel
        # one LocalTunnel per executor, as NeMo-Run's own examples do: a shared one collects every task's
        # packaging jobs, and NeMo-Run serializes it with each task (quadratic in the number of tasks)
        job_dir = s.job_dir or str(base_dir(self.workspace, spec.campaign) / "experiments")
        return run.LocalTunnel(job_dir=job_dir)

    def executor(self, spec: LaunchSpec, request: JobRequest | None = None) -> Any:
        """run.SlurmExecutor for one attempt, from the profile's job request (or a pack runner's: `runner_request`)."""
        run = import_nemo_run()
        req = request or self.request([spec])
        word = srun_word()
        srun_args = [word(arg) for arg in req.srun_args]
        if req.container_workdir:  # NeMo-Run sets its own workdir first; the last one wins
            srun_args.append(word(f"--container-workdir={req.container_workdir}"))
        image = word(req.container_image) if req.container_image else None
        return run.SlurmExecutor(
            account=req.cluster.get("account"), partition=req.cluster.get("partition"), qos=req.cluster.get("qos"),
            constraint=req.cluster.get("constraint"), exclusive=req.cluster.get("exclusive"),
            job_name_prefix=safe_name(f"mbx-{spec.campaign}-", 40), time=_hhmmss(req.time_min), nodes=req.nodes,
            ntasks_per_node=req.ntasks_per_node, gpus_per_node=req.gpus_per_node,
            cpus_per_task=req.cluster.get("cpus_per_task"), mem=req.cluster.get("mem"),
            container_image=image, container_mounts=[word(mount) for mount in req.container_mounts],
            container_env=req.container_env or None,
            additional_parameters={k: v for k, v in req.extra.items() if k != "requeue"},  # NeMo-Run adds --requeue
            srun_args=srun_args or None, tunnel=self.tunnel(spec), packager=run.Packager(),
            poll_estimated_start_time=False,
        )  # fmt: skip

    def add_task(self, experiment: Any, batch: Batch, number: int, index: int) -> None:
        """Task `number` of the batch: the rank entry on point `index`, or the pack runner of allocation `number`."""
        task = batch.tasks[number]
        if not batch.packed:
            name = safe_name(f"{task[0].cell_id}-a{task[0].attempt}")
            experiment.add(
                quoted_script(self.rank_argv(batch, index)), executor=self.executor(task[0]), name=name
            )
            return
        # the runner starts the points' srun steps from outside the container: pack_python with an image
        argv = self.runner_argv(batch, self.request(task).container_image, number)
        name = safe_name(f"pack{number}-{task[0].cell_id}-a{task[0].attempt}")
        experiment.add(
            quoted_script(argv), executor=self.executor(task[0], self.runner_request(task)), name=name
        )

    @contextlib.contextmanager
    def experiment(self, batch: Batch) -> Iterator[Any]:
        """The batch's Experiment, entered, with one task per attempt (or per pack)."""
        with experiment_of(self.workspace, batch.specs) as experiment:
            index = 0
            for number, task in enumerate(batch.tasks):
                self.add_task(experiment, batch, number, index)
                index += len(task)
            yield experiment

    # the Slurm base's hooks ------------------------------------------------------------------------------
    def job_groups(self, specs: list[LaunchSpec]) -> list[list[LaunchSpec]]:
        return [specs]  # one Experiment per submission batch

    def job_folder(self, specs: list[LaunchSpec]) -> Path:
        return batch_folder(self.workspace, specs)

    def render_job(self, batch: Batch) -> JobFile:
        """The batch's sbatch scripts from NeMo-Run's own dry run of its Experiment (nothing submitted; the
        Experiment dir it writes is removed again). submit_job builds the same Experiment afresh and runs it."""
        job = JobFile()
        with dry_run_lock(base_dir(self.workspace, batch.specs[0].campaign)):
            with self.experiment(batch) as experiment:
                experiment.dryrun(log=False, exist_ok=True, delete_exp_dir=True)
            try:
                for task in experiment.jobs:
                    executor = task.executor
                    path = Path(executor.experiment_dir) / f"{executor.job_name}_sbatch.sh"
                    job.scripts[path] = task._dryrun_info.request.materialize()
                    remote = os.path.join(executor.tunnel.job_dir, f"{executor.job_name}_sbatch.sh")
                    job.commands.append(["sbatch", "--requeue", "--parsable", remote])
            finally:
                close_experiment(experiment)
        return job

    def submit_job(self, batch: Batch, rendered: Rendered) -> list[Launched]:
        # A fresh Experiment: reusing the dry-run one would make NeMo-Run serialize its shared tunnel (with every
        # task's packaging job) into every task, three times over (quadratic in the number of tasks).
        with self.experiment(batch) as experiment:
            experiment.run(detach=True)
        now = time.time()
        launched = []
        for (path, text), command, job in zip(
            rendered.scripts.items(), rendered.commands, experiment.jobs, strict=True
        ):
            if not job.launched or not job.handle:
                raise RuntimeError(f"NeMo-Run did not launch {job.id} (state {job.state})")
            job_id = _job_id(job.handle)
            stdout = str(job.executor.job_details.stdout).replace("%j", job_id)
            launched.append(Launched(job_id, {
                "tasks": str(batch.table), "handle": job.handle, "submitted_at": now, "experiment": experiment._id,
                "argv": command, "script": str(path), "slurm_output": stdout,
            }))  # fmt: skip
            if path.exists() and path.read_text() != text:
                print(
                    f"warning: NeMo-Run submitted {path}, which differs from the rendered script",
                    file=sys.stderr,
                )
        return launched
