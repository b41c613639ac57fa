"""Packing (the login side): many short points in one Slurm allocation, each point one srun step run back to back.

With `launchers.<submitit|nemo-run>.pack: N` a group of same-shape attempts is cut into packs of N; each pack is one
allocation (a submitit array task, a NeMo-Run task) whose job runs launchers/node/pack.py. That runner starts
each point as its own srun step of the allocation (the same per-rank entry, launchers/node/rank.py, as one job
per point), one after the other on the same nodes, so the rank-local JIT caches (trainer/jit_cache.py) stay
warm; a per-point deadline and srun's --kill-on-bad-exit keep a crashed or hung point from taking the others down.

Everything the runner needs is rendered here, before submission, into the pack file (`PACK_FILE`, JSON)::

    {"version": 1, "tasks": TABLE, "allocations": [[POINT, ...], ...]}
    POINT = {"pos", "index", "cell_id", "attempt", "run_dir", "argv" (the srun step), "deadline_s",
             "record", "cancel"}

The runner writes one record per point (`record`, JSON: started_at, restart, ended_at, exit_code, stopped); the
login side reads it to decide a point whose run dir does not say how it ended (the step's word instead of the
allocation's), and asks the runner to stop one point by creating its `cancel` file. A point's job id is
`<allocation job id>#<position>` (`point_job_id`), so the engine, the store and `mbx campaign status` see one
attempt per point exactly as with one job per point.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from launchers.base import LaunchSpec, Submitted
from launchers.command import ROOT, node_entry_argv
from launchers.profile import SlurmProfile
from launchers.scheduler import SchedulerState
from launchers.slurm.render import JobRequest, slurm_minutes
from launchers.slurm.settings import SlurmSettings
from trainer import rundir

PACK_FILE = "pack.json"
NODE_PACK = ROOT / "launchers" / "node" / "pack.py"
SEP = "#"  # in a point's job id; never part of a Slurm job id (digits, _, +, ., [], %, -)
STEP_GRACE_S = 60.0  # after a point's own time limit: the wrapper's SIGKILL (30 s) plus start-up slack
OVERLAP_ARGS = ["--nodes=1", "--ntasks=1", "--overlap"]  # a runner started through srun (NeMo-Run)
ALLOCATION = "allocation"  # the Submitted.info key that marks a packed point (its allocation's job id)


def packs(specs: list[LaunchSpec], size: int) -> list[list[LaunchSpec]]:
    """The specs cut into packs of `size`, in order (the last one may be smaller)."""
    return [specs[start : start + size] for start in range(0, len(specs), size)]


def point_job_id(allocation: str, pos: int) -> str:
    return f"{allocation}{SEP}{pos}"


def allocation_of(job_id: str) -> str:
    """The Slurm job id a point's job id belongs to (the id itself when it is not a packed point)."""
    return job_id.split(SEP, 1)[0]


def pack_minutes(specs: list[LaunchSpec], settings: SlurmSettings) -> int | None:
    """The allocation's --time: every point's own limit plus its grace, back to back (None: any point has none)."""
    limits = [spec.resources.time_limit_min for spec in specs]
    if any(limit is None for limit in limits):
        return None
    total_s = sum(float(limit) * 60.0 + STEP_GRACE_S for limit in limits if limit is not None)
    return slurm_minutes((total_s + settings.stop_margin_s) / 60.0)


def point_deadline_s(spec: LaunchSpec) -> float | None:
    """When the runner stops a point's step outright: its own limit (the wrapper stops it first) plus grace."""
    limit = spec.resources.time_limit_min
    return None if limit is None else round(float(limit) * 60.0 + STEP_GRACE_S, 3)


def step_argv(
    spec: LaunchSpec,
    index: int,
    slot: int,
    table: Path,
    request: JobRequest,
    python: str,
    settings: SlurmSettings,
) -> list[str]:
    """The srun step of one point: the allocation's shape, the point's container, the rank entry by path."""
    nodes, ranks = spec.resources.nodes, spec.resources.gpus_per_node
    shape = [f"--nodes={nodes}", f"--ntasks={nodes * ranks}", f"--ntasks-per-node={ranks}"]
    gpus = [f"--gpus-per-node={ranks}"] if request.gpus_per_node else []
    name = f"--job-name=mbx-point-{slot}"
    rank = node_entry_argv(python, table, settings.master_port_base, index)  # the port one job would use
    return ["srun", "--unbuffered", "--kill-on-bad-exit=1", name, *shape, *gpus, *request.container_flags(),
            *request.srun_args, *rank]  # fmt: skip


@dataclass(frozen=True)
class PackLayout:
    """Where one group's pack file, point records and cancel requests live (the group's batch folder)."""

    folder: Path

    @property
    def file(self) -> Path:
        return self.folder / PACK_FILE

    def record(self, allocation: int, pos: int) -> Path:
        return self.folder / "points" / f"{allocation}-{pos}.json"

    def cancel(self, allocation: int, pos: int) -> Path:
        return self.folder / "cancel" / f"{allocation}-{pos}"


def pack_file(
    groups: list[list[LaunchSpec]],
    layout: PackLayout,
    table: Path,
    requests: list[JobRequest],
    python: str,
    settings: SlurmSettings,
) -> str:
    """The pack file's text: every allocation's points (indices into the task table, which lists the packs' points
    in order) and their srun steps (`requests`: each pack's job request, for its container and srun flags)."""
    allocations: list[list[dict[str, Any]]] = []
    index = 0
    for number, (group, request) in enumerate(zip(groups, requests, strict=True)):
        points = []
        for pos, spec in enumerate(group):
            points.append({
                "pos": pos, "index": index, "cell_id": spec.cell_id, "attempt": spec.attempt,
                "run_dir": str(spec.run_dir), "argv": step_argv(spec, index, pos, table, request, python, settings),
                "deadline_s": point_deadline_s(spec), "record": str(layout.record(number, pos)),
                "cancel": str(layout.cancel(number, pos)),
            })  # fmt: skip
            index += 1
        allocations.append(points)
    return json.dumps({"version": 1, "tasks": str(table), "allocations": allocations}, indent=1) + "\n"


def runner_argv(python: str, file: Path, allocation: int | None = None) -> list[str]:
    """What the allocation runs: launchers/node/pack.py by path (array task id, or --allocation N)."""
    where = ["--allocation", str(allocation)] if allocation is not None else []
    return [python, "-u", str(NODE_PACK), "--pack", str(file), *where]


def runner_python(profile: SlurmProfile, settings: SlurmSettings, image: str | None) -> str:
    """The runner runs outside any container (it starts srun): cluster.python, or pack_python with an image."""
    return settings.pack_python if image else profile.cluster.python


def point_info(layout: PackLayout, allocation_job: str, number: int, pos: int, size: int) -> dict[str, Any]:
    """What a packed point's Submitted.info carries (besides run_dir, argv, ...): its allocation and files."""
    return {ALLOCATION: allocation_job, "pack_dir": str(layout.folder), "pack_allocation": number,
            "pack_pos": pos, "pack_size": size, "pack_record": str(layout.record(number, pos)),
            "pack_cancel": str(layout.cancel(number, pos))}  # fmt: skip


def minutes_label(minutes: int | None) -> str:
    return f"{minutes} min" if minutes is not None else "the partition's limit"


def describe(groups: list[list[LaunchSpec]], minutes: int | None) -> str:
    """A dry run's note: how the points are packed."""
    sizes = ", ".join(str(len(g)) for g in groups)
    return (f"packed: {sum(len(g) for g in groups)} point(s) in {len(groups)} allocation(s) of {sizes}, "
            f"one srun step per point, back to back; allocation time {minutes_label(minutes)}")  # fmt: skip


def step_state(record: dict[str, Any] | None) -> SchedulerState | None:
    """The step's word on a point the runner saw end (None: not ended, or the runner was stopped with it)."""
    if not record or record.get("ended_at") is None:
        return None
    code, stopped = record.get("exit_code"), record.get("stopped")
    if stopped == "cancel":
        return SchedulerState("CANCELLED", "mbx stopped this packed point", "pack")
    if stopped == "deadline":
        return SchedulerState(
            "TIMEOUT", f"the pack stopped the step after {record.get('deadline_s')} s", "pack"
        )
    if code == 0:
        return SchedulerState("COMPLETED", "", "pack")
    return SchedulerState("FAILED", f"srun step exit {code}", "pack")


# ---- the login side's view of a submitted point ----------------------------------------------------------


def scheduler_id(job: Submitted) -> str:
    """The id to ask Slurm about: a packed point's allocation (also when a rebuilt store kept only the job id),
    else the job itself."""
    return str(job.info.get(ALLOCATION) or allocation_of(job.job_id))


def read_record(job: Submitted) -> dict[str, Any] | None:
    """A packed point's runner record (None: not packed, or not started yet)."""
    path = job.info.get("pack_record")
    return rundir.read_json(Path(path)) if path else None


def finished_record(record: dict[str, Any] | None) -> bool:
    return bool(record) and record.get("ended_at") is not None  # type: ignore[union-attr]


def cancel_points(jobs: list[Submitted]) -> list[str]:
    """Ask each packed point's runner to stop it (its cancel file); return the allocations with nothing left to
    run, which may be scancelled as a whole."""
    asked: dict[str, Submitted] = {}
    for job in jobs:
        if ALLOCATION not in job.info or not job.info.get("pack_cancel"):
            continue
        path = Path(job.info["pack_cancel"])
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()
        asked[str(job.info[ALLOCATION])] = job
    whole = []
    for allocation, job in asked.items():
        layout, number = PackLayout(Path(job.info["pack_dir"])), int(job.info["pack_allocation"])
        left = [pos for pos in range(int(job.info["pack_size"]))
                if not layout.cancel(number, pos).exists()
                and not finished_record(rundir.read_json(layout.record(number, pos)))]  # fmt: skip
        if not left:
            whole.append(allocation)
    return whole
