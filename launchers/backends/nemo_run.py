"""NeMo-Run backend: one Experiment per submission batch, one run.Script task per attempt, on Slurm or locally."""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import os
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from launchers.base import LaunchSpec, Rendered, Submitted
from launchers.command import here_python, node_entry_argv, node_python
from launchers.registry import register
from launchers.safety import check_plain, plain_problem, shell_word
from launchers.scheduler import Scheduler, SchedulerState
from launchers.slurm.launcher import SlurmLauncher
from launchers.slurm.pack import (
    OVERLAP_ARGS,
    PackLayout,
    describe,
    pack_file,
    pack_minutes,
    packs,
    point_info,
    point_job_id,
    runner_argv,
    runner_python,
)
from launchers.slurm.render import (
    JobRequest,
    batch_key,
    group_by_shape,
    job_request,
    safe_name,
    shape_of,
    task_table,
)
from launchers.slurm.settings import SlurmSettings

INSTALL_HINT = (
    "the nemo-run launcher needs NeMo-Run: pip install 'mbx[nemo]' (nemo-run==0.11.1, leptonai==0.27.3)"
)
UNQUOTED = "NeMo-Run writes it unquoted into its job scripts and shell commands"
NEMO_TERMINAL_STATES = {
    "SUCCEEDED": "COMPLETED",
    "FAILED": "FAILED",
    "CANCELLED": "CANCELLED",
}  # torchx AppState


def import_nemo_run() -> Any:
    """`nemo_run`, imported only when this backend is used (it is slow to import and optional)."""
    try:
        import nemo_run
    except ImportError as err:
        raise RuntimeError(f"{INSTALL_HINT} ({type(err).__name__}: {err})") from None
    return nemo_run


class NemoRunSettings(SlurmSettings):
    """Settings of the NeMo-Run backend (`launchers.nemo-run` in a campaign)."""

    executor: Literal["slurm", "local"] = Field(
        "slurm", description="run.SlurmExecutor or run.LocalExecutor."
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
def inside_experiment(experiment: Any) -> Iterator[Any]:
    """`with experiment:` (NeMo-Run adds and runs tasks only inside an experiment's context), with stdin closed to
    it: NeMo-Run's tunnels (invoke) would otherwise read and forward ours. Quiet with `clean_mode=True`; after a
    detached run, leaving it marks the experiment done, as NeMo-Run's own `with exp: exp.run(detach=True)`."""
    stdin = sys.stdin
    sys.stdin = open(os.devnull)
    try:
        with experiment:
            yield experiment
    finally:
        sys.stdin.close()
        sys.stdin = stdin


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


@register
class NemoRunLauncher(SlurmLauncher):
    """Builds a NeMo-Run Experiment (deterministic id) per batch; render() is NeMo-Run's own dry run."""

    name = "nemo-run"
    Settings = NemoRunSettings
    settings: NemoRunSettings

    def __init__(self, settings: Any, workspace: Path, profile: Any = None):
        if importlib.util.find_spec("nemo_run") is None:  # fail before anything is written, without importing
            raise RuntimeError(INSTALL_HINT)
        self._tunnel: Any = None
        super().__init__(settings, workspace, profile)
        check_plain("--workspace", self.workspace, UNQUOTED)  # experiment dirs: `mkdir -p DIR`, `srun --output DIR`

    def make_scheduler(self) -> Scheduler:
        return LocalExecutorJobs() if self.settings.executor == "local" else super().make_scheduler()

    def scheduler_command(self, argv: list[str]) -> Any:
        if self.settings.tunnel != "ssh" or self.settings.executor != "slurm":
            return super().scheduler_command(argv)
        if self._tunnel is None:
            return subprocess.CompletedProcess(argv, 1, "", "no SSH tunnel yet")
        self._tunnel.connect()
        result = self._tunnel.run(shlex.join(argv), hide=True, warn=True)
        return subprocess.CompletedProcess(argv, result.return_code, result.stdout, result.stderr)

    # NeMo-Run objects ------------------------------------------------------------------------------------
    def _base_dir(self, spec: LaunchSpec) -> Path:
        return self.workspace / spec.campaign / "nemo-run"

    def _table(self, specs: list[LaunchSpec]) -> Path:
        return self.workspace / specs[0].campaign / "slurm" / f"nemo-{batch_key(specs)}" / "tasks.json"

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
        return run.LocalTunnel(job_dir=s.job_dir or str(self._base_dir(spec) / "experiments"))

    def executor(self, spec: LaunchSpec, request: JobRequest | None = None) -> Any:
        """run.SlurmExecutor (or run.LocalExecutor) for one attempt, from the profile's job request (a pack's
        own request: its runner is one task on the first node, outside any container, overlapping its steps)."""
        run = import_nemo_run()
        if self.settings.executor == "local":
            ranks = spec.resources.gpus_per_node
            return run.LocalExecutor(ntasks_per_node=ranks, launcher="torchrun" if ranks > 1 else None)
        req = request or job_request([spec], self.profile, self.settings, self.workspace)
        word = srun_word()
        srun_args = [word(arg) for arg in (OVERLAP_ARGS if request else req.srun_args)]
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

    def script(self, table: Path, index: int) -> Any:
        """run.Script running the per-rank entry; NeMo-Run joins args with spaces, so each is quoted here."""
        run = import_nemo_run()
        if self.settings.executor == "local":  # torchrun (or `python` on PATH) starts it, unquoted argv
            argv = node_entry_argv("python", table, self.settings.master_port_base, index)
            return run.Script(path=argv[2], args=argv[3:], entrypoint="python")
        argv = node_entry_argv(node_python(self.profile), table, self.settings.master_port_base, index)
        return run.Script(path=shlex.quote(argv[2]), args=[shlex.quote(a) for a in argv[3:]],
                          entrypoint=shlex.join(argv[:2]))  # fmt: skip

    @contextlib.contextmanager
    def experiment(self, specs: list[LaunchSpec]) -> Iterator[Any]:
        """The batch's Experiment, entered: deterministic id (campaign + batch key), one task per attempt (or per
        pack), to dry-run or run inside the same context."""
        run = import_nemo_run()
        title = safe_name(f"mbx-{specs[0].campaign}")
        table = self._table(specs)
        experiment = run.Experiment(
            title, id=f"{title}_{batch_key(specs)}", base_dir=str(self._base_dir(specs[0])), clean_mode=True,
            enable_goodbye_message=False, skip_status_at_exit=True, log_level="WARN",
        )  # fmt: skip
        with inside_experiment(experiment):
            if self.settings.pack > 1:
                self._add_packs(experiment, specs, table)
            else:
                for index, spec in enumerate(specs):
                    name = safe_name(f"{spec.cell_id}-a{spec.attempt}")
                    experiment.add(self.script(table, index), executor=self.executor(spec), name=name)
            yield experiment

    def _packs(self, specs: list[LaunchSpec]) -> list[list[LaunchSpec]]:
        """Packs of `pack` same-shape attempts, in the order their points appear in the task table."""
        return [chunk for group in group_by_shape(specs) for chunk in packs(group, self.settings.pack)]

    def pack_text(self, specs: list[LaunchSpec], table: Path) -> str:
        """The pack file of a batch (launchers/node/pack.py reads it), its points indexing the task table."""
        cut = self._packs(specs)
        requests = [job_request(chunk, self.profile, self.settings, self.workspace) for chunk in cut]
        return pack_file(cut, PackLayout(table.parent), table, requests, node_python(self.profile), self.settings)

    def _add_packs(self, experiment: Any, specs: list[LaunchSpec], table: Path) -> None:
        run = import_nemo_run()
        layout = PackLayout(table.parent)
        for number, chunk in enumerate(self._packs(specs)):
            req = job_request(chunk, self.profile, self.settings, self.workspace)
            # the runner starts the points' srun steps from outside the container: pack_python with an image
            argv = runner_argv(runner_python(self.profile, self.settings, req.container_image), layout.file, number)
            req = dataclasses.replace(req, time_min=pack_minutes(chunk, self.settings), container_image=None)
            script = run.Script(path=shlex.quote(argv[2]), args=[shlex.quote(a) for a in argv[3:]],
                                entrypoint=shlex.join(argv[:2]))  # fmt: skip
            name = safe_name(f"pack{number}-{chunk[0].cell_id}-a{chunk[0].attempt}")
            experiment.add(script, executor=self.executor(chunk[0], req), name=name)

    # the Launcher hooks ----------------------------------------------------------------------------------
    def render(self, specs: list[LaunchSpec]) -> list[Rendered]:
        """The batch's sbatch scripts from NeMo-Run's own dry run of its Experiment (nothing submitted; the
        Experiment dir it writes is removed again). launch() builds the same Experiment afresh and runs it."""
        self.check_specs(specs)
        if not specs:
            return []
        local = self.settings.executor == "local"
        python = here_python() if local else node_python(self.profile)
        notes: list[str] = []
        if self.settings.pack > 1:  # the task table in pack order: each pack's points side by side
            cut = self._packs(specs)
            specs = [spec for chunk in cut for spec in chunk]
            minutes = [pack_minutes(chunk, self.settings) for chunk in cut]
            notes.append(describe(cut, None if None in minutes else max(m or 0 for m in minutes)))
        table = self._table(specs)
        files = {table: task_table(specs, self.profile, self.settings.stop_margin_s, python)}
        if self.settings.pack > 1:
            files[PackLayout(table.parent).file] = self.pack_text(specs, table)
        if local:
            note = f"NeMo-Run local executor: {len(specs)} task(s), started with {here_python()}"
            return [Rendered(list(specs), files, notes=[note])]
        scripts: dict[Path, str] = {}
        commands: list[list[str]] = []
        with dry_run_lock(self._base_dir(specs[0])):
            with self.experiment(specs) as experiment:
                experiment.dryrun(log=False, exist_ok=True, delete_exp_dir=True)
            try:
                for job in experiment.jobs:
                    executor = job.executor
                    path = Path(executor.experiment_dir) / f"{executor.job_name}_sbatch.sh"
                    scripts[path] = job._dryrun_info.request.materialize()
                    remote = os.path.join(executor.tunnel.job_dir, f"{executor.job_name}_sbatch.sh")
                    commands.append(["sbatch", "--requeue", "--parsable", remote])
            finally:
                close_experiment(experiment)
        return [Rendered(list(specs), files, scripts, commands, notes)]

    def launch(self, rendered: Rendered) -> list[Submitted]:
        # A fresh Experiment: reusing the dry-run one would make NeMo-Run serialize its shared tunnel (with every
        # task's packaging job) into every task, three times over (quadratic in the number of tasks).
        with self.experiment(rendered.specs) as experiment, self._local_path():
            experiment.run(detach=True)
        now = time.time()
        table = next(iter(rendered.files))
        scripts = list(rendered.scripts.items())
        tasks = self._packs(rendered.specs) if self.settings.pack > 1 else [[spec] for spec in rendered.specs]
        submitted, index = [], 0
        for number, (chunk, job) in enumerate(zip(tasks, experiment.jobs, strict=True)):
            if not job.launched or not job.handle:
                raise RuntimeError(f"NeMo-Run did not launch {job.id} (state {job.state})")
            job_id = _job_id(job.handle)
            common: dict[str, Any] = {"tasks": str(table), "handle": job.handle, "submitted_at": now,
                                      "experiment": experiment._id}  # fmt: skip
            if scripts:
                path, text = scripts[number]
                common.update(argv=rendered.commands[number], script=str(path))
                common["slurm_output"] = str(job.executor.job_details.stdout).replace("%j", job_id)
                if path.exists() and path.read_text() != text:
                    print(
                        f"warning: NeMo-Run submitted {path}, which differs from the rendered script",
                        file=sys.stderr,
                    )
            else:
                self.query.jobs[job_id] = (experiment, job)  # type: ignore[attr-defined]
            for pos, spec in enumerate(chunk):
                info = {"run_dir": str(spec.run_dir), "index": index, "time_min": shape_of(spec)[2], **common}
                ident = job_id
                if self.settings.pack > 1:
                    info.update(point_info(PackLayout(Path(table).parent), job_id, number, pos, len(chunk)))
                    ident = point_job_id(job_id, pos)
                submitted.append(Submitted(spec.cell_id, spec.attempt, ident, info))
                index += 1
        return submitted

    @contextlib.contextmanager
    def _local_path(self) -> Iterator[None]:
        """Local executor: torchrun starts `python` from PATH; make it this machine's interpreter (here_python)."""
        if self.settings.executor != "local":
            yield
            return
        found = shutil.which(here_python())
        before = os.environ.get("PATH", "")
        if found:
            os.environ["PATH"] = os.pathsep.join([str(Path(found).parent), before])
        try:
            yield
        finally:
            os.environ["PATH"] = before
