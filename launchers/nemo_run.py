"""NeMo-Run backend: one Experiment per submission batch, one run.Script task per attempt, on Slurm or locally."""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from launchers.base import JobState, Launcher, LaunchSpec, Submitted
from launchers.registry import register
from launchers.slurm_common import (
    RANK_ENTRY,
    TASKS_FILE,
    SlurmQuery,
    SlurmRendered,
    SlurmSettings,
    StateResolver,
    batch_key,
    cancel_jobs,
    check_campaign,
    check_value,
    container_mounts,
    describe,
    project_git_sha,
    run_local,
    safe_name,
    sbatch_extra,
    shape_of,
    task_table,
)

INSTALL_HINT = (
    "the nemo-run launcher needs NeMo-Run: pip install 'mbx[nemo]' (nemo-run==0.11.1, leptonai==0.27.3)"
)


def import_nemo_run() -> Any:
    """`nemo_run`, imported only when this backend is used (it is slow to import and optional)."""
    try:
        import nemo_run
    except ImportError as err:
        raise RuntimeError(f"{INSTALL_HINT} ({type(err).__name__}: {err})") from None
    return nemo_run

NEMO_TERMINAL_STATES = frozenset({"SUCCEEDED", "FAILED", "CANCELLED"})  # torchx AppState names


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


@contextlib.contextmanager
def _inside(experiment: Any) -> Iterator[Any]:
    """NeMo-Run only adds and runs tasks inside an experiment's context; set it without __exit__'s side effects."""
    from nemo_run.run.experiment import _current_experiment

    token = _current_experiment.set(experiment)
    stdin = sys.stdin
    sys.stdin = open(os.devnull)  # NeMo-Run's tunnels (invoke) would otherwise read and forward our stdin
    try:
        yield experiment
    finally:
        sys.stdin.close()
        sys.stdin = stdin
        _current_experiment.reset(token)


def _hhmmss(minutes: int | None) -> str | None:
    return None if minutes is None else f"{minutes // 60:02d}:{minutes % 60:02d}:00"


def _job_id(handle: str) -> str:
    """`slurm_tunnel://nemo_run/123` → `123`; other handles are kept whole."""
    return handle.rsplit("/", 1)[-1] if handle.startswith("slurm") else handle


@register
class NemoRunLauncher(Launcher):
    """Builds a NeMo-Run Experiment (deterministic id) per batch; render() is NeMo-Run's own dry run."""

    name = "nemo-run"
    Settings = NemoRunSettings

    def __init__(self, settings: NemoRunSettings | None, workspace: Path, cluster: Any = None):
        super().__init__(settings, workspace, cluster)
        import importlib.util

        if importlib.util.find_spec("nemo_run") is None:  # fail before anything is written, without importing
            raise RuntimeError(INSTALL_HINT)
        s = self.settings
        check_campaign(cluster, s, workspace)
        self._tunnel: Any = None
        self.query = SlurmQuery(self._run_command, s.poll_interval_s, s.poll_max_interval_s)
        self.resolver = StateResolver(self.query, gone_after_s=s.gone_after_s)
        self._local_jobs: dict[str, Any] = {}  # local executor: job id → (experiment, job)

    # NeMo-Run objects ------------------------------------------------------------------------------------
    def _base_dir(self, spec: LaunchSpec) -> Path:
        return Path(self.workspace).resolve() / spec.campaign / "nemo-run"

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

    def _run_command(self, argv: list[str]) -> Any:
        if self.settings.tunnel != "ssh" or self.settings.executor != "slurm":
            return run_local(argv)
        import subprocess

        if self._tunnel is None:
            return subprocess.CompletedProcess(argv, 1, "", "no SSH tunnel yet")
        self._tunnel.connect()
        result = self._tunnel.run(shlex.join(argv), hide=True, warn=True)
        return subprocess.CompletedProcess(argv, result.return_code, result.stdout, result.stderr)

    def executor(self, spec: LaunchSpec) -> Any:
        """run.SlurmExecutor (or run.LocalExecutor) for one attempt, from the campaign's cluster/container."""
        run = import_nemo_run()
        s = self.settings
        nodes, ranks, minutes = shape_of(spec)
        if s.executor == "local":
            return run.LocalExecutor(ntasks_per_node=ranks, launcher="torchrun" if ranks > 1 else None)
        campaign = self.cluster
        cluster = getattr(campaign, "cluster", None)
        container = getattr(campaign, "container", None)
        image = getattr(container, "image", None)
        srun_args = list(s.srun_args)
        if image and getattr(
            container, "workdir", None
        ):  # NeMo-Run sets its own workdir first; the last one wins
            srun_args.append(f"--container-workdir={check_value('container.workdir', container.workdir)}")

        def opt(key: str) -> str | None:
            value = getattr(cluster, key, None)
            return check_value(f"cluster.{key}", value) if value else None

        return run.SlurmExecutor(
            account=opt("account"),
            partition=opt("partition"),
            qos=opt("qos"),
            constraint=opt("constraint"),
            exclusive=True if getattr(cluster, "exclusive", False) else None,
            job_name_prefix=safe_name(f"mbx-{spec.campaign}-", 40),
            time=_hhmmss(minutes),
            nodes=nodes,
            ntasks_per_node=ranks,
            gpus_per_node=ranks if getattr(cluster, "gpus", True) else None,
            cpus_per_task=s.cpus_per_task,
            mem=s.mem,
            container_image=check_value("container.image", image) if image else None,
            container_mounts=container_mounts(campaign, s, self.workspace) if image else [],
            container_env=(sorted(set(spec.env_pass)) or None) if image else None,
            additional_parameters={k: v for k, v in sbatch_extra(campaign, s).items() if k != "requeue"},
            srun_args=srun_args or None,
            tunnel=self.tunnel(spec),
            packager=run.Packager(),
            poll_estimated_start_time=False,
        )

    def script(self, spec: LaunchSpec, table: Path, index: int) -> Any:
        """run.Script running the per-rank entry; NeMo-Run joins args with spaces, so each is quoted here."""
        run = import_nemo_run()
        python = getattr(getattr(self.cluster, "cluster", None), "python", None) or "python3"
        args = [
            "--tasks",
            str(table),
            "--index",
            str(index),
            "--port-base",
            str(self.settings.master_port_base),
        ]
        if self.settings.executor == "local":  # torchrun starts it with its own interpreter, unquoted argv
            return run.Script(path=str(RANK_ENTRY), args=args, entrypoint="python")
        return run.Script(
            path=shlex.quote(str(RANK_ENTRY)),
            args=[shlex.quote(a) for a in args],
            entrypoint=shlex.quote(check_value("cluster.python", python)),
        )

    # the Launcher hooks ----------------------------------------------------------------------------------
    def experiment(self, specs: list[LaunchSpec]) -> Any:
        """The batch's Experiment: deterministic id (campaign + batch key), one task per attempt."""
        run = import_nemo_run()
        key = batch_key(specs)
        title = safe_name(f"mbx-{specs[0].campaign}")
        table = self._table(specs)
        experiment = run.Experiment(
            title, id=f"{title}_{key}", base_dir=str(self._base_dir(specs[0])), clean_mode=True,
            enable_goodbye_message=False, skip_status_at_exit=True, log_level="WARN",
        )  # fmt: skip
        with _inside(experiment):
            for index, spec in enumerate(specs):
                name = safe_name(f"{spec.cell_id}-a{spec.attempt}")
                experiment.add(self.script(spec, table, index), executor=self.executor(spec), name=name)
        return experiment

    def _table(self, specs: list[LaunchSpec]) -> Path:
        return Path(self.workspace) / specs[0].campaign / "slurm" / f"nemo-{batch_key(specs)}" / TASKS_FILE

    def render(self, specs: list[LaunchSpec]) -> list[SlurmRendered]:
        """The batch's sbatch scripts from NeMo-Run's own dry run of its Experiment (nothing submitted; the
        Experiment dir it writes is removed again). launch() builds the same Experiment afresh and runs it."""
        if not specs:
            return []
        files = {self._table(specs): task_table(specs, self.cluster, self.settings, project_git_sha())}
        scripts: dict[Path, str] = {}
        commands: list[list[str]] = []
        if self.settings.executor == "slurm":
            experiment = self.experiment(specs)
            with _inside(experiment):
                experiment.dryrun(log=False, exist_ok=True, delete_exp_dir=True)
            for job in experiment.jobs:
                executor = job.executor
                path = Path(executor.experiment_dir) / f"{executor.job_name}_sbatch.sh"
                scripts[path] = job._dryrun_info.request.materialize()
                remote = os.path.join(executor.tunnel.job_dir, f"{executor.job_name}_sbatch.sh")
                commands.append(["sbatch", "--requeue", "--parsable", remote])
        item = SlurmRendered(list(specs), files, commands[0] if commands else None, scripts=scripts,
                             submit_commands=commands)  # fmt: skip
        item.description = describe(item) if scripts else f"NeMo-Run local executor: {len(specs)} task(s)\n"
        return [item]

    def launch(self, rendered: SlurmRendered) -> list[Submitted]:
        # A fresh Experiment: reusing the dry-run one would make NeMo-Run serialize its shared tunnel (with every
        # task's packaging job) into every task, three times over (quadratic in the number of tasks).
        experiment = self.experiment(rendered.specs)
        with _inside(experiment), self._local_path():
            experiment.run(detach=True)
        submitted = []
        now = time.time()
        table = next(iter(rendered.files))
        scripts = list(rendered.scripts.items())
        for index, (spec, job) in enumerate(zip(rendered.specs, experiment.jobs, strict=True)):
            if not job.launched or not job.handle:
                raise RuntimeError(f"NeMo-Run did not launch {job.id} (state {job.state})")
            job_id = _job_id(job.handle)
            info: dict[str, Any] = {"run_dir": str(spec.run_dir), "tasks": str(table), "index": index,
                                    "handle": job.handle, "time_min": shape_of(spec)[2], "submitted_at": now,
                                    "experiment": experiment._id}  # fmt: skip
            if scripts:
                path, text = scripts[index]
                info.update(argv=rendered.submit_commands[index], script=str(path))
                info["slurm_output"] = str(job.executor.job_details.stdout).replace("%j", job_id)
                if path.exists() and path.read_text() != text:
                    print(
                        f"warning: NeMo-Run submitted {path}, which differs from the rendered script",
                        file=sys.stderr,
                    )
            else:
                self._local_jobs[job_id] = (experiment, job)
            submitted.append(Submitted(spec.cell_id, spec.attempt, job_id, info))
        return submitted

    @contextlib.contextmanager
    def _local_path(self) -> Iterator[None]:
        """Local executor: torchrun starts `python`; make it the campaign's interpreter (cluster.python)."""
        if self.settings.executor != "local":
            yield
            return
        python = getattr(getattr(self.cluster, "cluster", None), "python", None) or sys.executable
        found = shutil.which(python)
        before = os.environ.get("PATH", "")
        if found:
            os.environ["PATH"] = os.pathsep.join([str(Path(found).parent), before])
        try:
            yield
        finally:
            os.environ["PATH"] = before

    def poll(self, jobs: list[Submitted]) -> dict[str, JobState]:
        if self.settings.executor == "slurm":
            return self.resolver.resolve(jobs)
        return {job.job_id: self._poll_local(job) for job in jobs}

    def _poll_local(self, job: Submitted) -> JobState:
        state = self.resolver._from_files(job)
        if state is not None:
            return state
        known = self._local_jobs.get(job.job_id)
        if known is None:  # adopted after a restart: only the run dir can tell
            return JobState.RUNNING
        experiment, nemo_job = known
        # NeMo-Run answers with torchx's AppState; read its name instead of importing torchx on the login node
        if getattr(nemo_job.status(experiment._runner), "name", None) not in NEMO_TERMINAL_STATES:
            return JobState.RUNNING
        status = self.resolver._files(job)[1] or {}
        try:
            return JobState(status.get("state", "failed"))
        except ValueError:
            return JobState.FAILED

    def cancel(self, jobs: list[Submitted]) -> None:
        if self.settings.executor == "slurm":
            cancel_jobs([job.job_id for job in jobs], self._run_command)
            return
        for job in jobs:
            known = self._local_jobs.get(job.job_id)
            if known is not None:
                experiment, nemo_job = known
                nemo_job.cancel(experiment._runner)

    def exit_info(self, job: Submitted) -> dict[str, Any]:
        return self.resolver.exit_info(job)
