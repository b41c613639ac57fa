"""Feasibility before submission: each point's memory estimate against its GPU, and its layout problems; an
infeasible point is recorded with its reason (the store's `estimates` table) and skipped, the rest run. Each
feasible point's need (`need_gib`) is checked again on its node's real GPU before the trainer starts
(launchers/node/attempt.py); a point refused there is judged again on that GPU here (`on_card`)."""

from __future__ import annotations

import math
import re
import shutil
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from launchers.base import GpuNeed
from orchestrator.errors import ConfigError, UsageError
from orchestrator.run.store import CellRow
from orchestrator.spec.campaign import Campaign
from orchestrator.spec.sweep import Point
from orchestrator.trainers import memory_estimate
from trainer.memory import GIB, MemoryEstimate

# GPU memory per device in GiB, as torch.cuda.get_device_properties(...).total_memory reports it.
GPU_MEMORY_GIB: dict[str, float] = {
    "A100-40GB": 39.4,
    "A100-80GB": 79.2,
    "H100-80GB": 79.6,
    "H100-NVL": 93.1,
    "H200": 139.8,
    "B200": 179.0,
    "GB200": 184.0,
}
_ALIASES = {"H100": "H100-80GB", "H100-SXM": "H100-80GB", "GH200": "H100-NVL"}  # GH200 (96 GB HBM3 variant)
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(GiB|GB|G)\s*$", re.IGNORECASE)
_NOT_ALNUM = re.compile(r"[^a-z0-9]")


def _norm(name: str) -> str:
    return _NOT_ALNUM.sub("", name.lower().removeprefix("nvidia").strip())


_BY_NORM = {_norm(k): k for k in GPU_MEMORY_GIB} | {_norm(k): v for k, v in _ALIASES.items()}


def gpu_name(name: str) -> str:
    """The table name of a GPU ("h200", "NVIDIA H200", "H100 80GB" → H200, H100-80GB), or a size as given
    ("80GiB"). Raises ConfigError listing the known names."""
    if _SIZE_RE.match(name):
        return name.strip()
    known = _BY_NORM.get(_norm(name))
    if known is None:
        raise ConfigError(
            f"gpu: unknown GPU {name!r} (--gpu or resources.gpu); known: {', '.join(GPU_MEMORY_GIB)} (or a size such as 80GiB)"
        )
    return known


def gpu_memory_gib(name: str) -> float:
    """Memory of one GPU in GiB (as torch reports it): a name of GPU_MEMORY_GIB (case and punctuation are
    ignored: "h200", "NVIDIA H200") or a size "<number>GiB". Raises ConfigError listing the known names."""
    canonical = gpu_name(name)
    size = _SIZE_RE.match(canonical)
    if size:
        return float(size.group(1))
    return GPU_MEMORY_GIB[canonical]


@dataclass(frozen=True)
class Card:
    """A GPU as found on a machine (launchers/node/fingerprint.py, nvidia-smi): its name and memory in GiB
    (memory.total rounded down to 0.1); feasibility judges a point on it as on a GPU named in the table."""

    name: str
    memory_gib: float

    def __str__(self) -> str:
        return f"{self.name} ({self.memory_gib:.1f} GiB)"


AUTO = "auto"  # --gpu auto: the GPU of the machine mbx runs on


def resolve_gpu(option: str | None) -> str | Card | None:
    """The --gpu option as feasibility takes it: `auto` → this machine's GPU (the smallest, if several), read
    with nvidia-smi; UsageError (exit 2) saying so when there is none. Anything else as given."""
    if option is None or option.strip().lower() != AUTO:
        return option
    from launchers.node.fingerprint import card, query_gpus

    found = card(query_gpus())
    if found is None:
        why = "nvidia-smi lists no GPU" if shutil.which("nvidia-smi") else "there is no nvidia-smi on PATH"
        raise UsageError(f"--gpu auto: no GPU on this machine ({why}); run it on a GPU node, or name the "
                         f"GPU: --gpu H100-80GB ({', '.join(GPU_MEMORY_GIB)}) or a size such as 80GiB")  # fmt: skip
    return Card(str(found["name"]), float(found["memory_gib"]))


def _target(gpu: str | Card | None) -> tuple[str | None, float | None]:
    """(name, memory GiB) of a GPU given by table name, size or Card (None, None for none)."""
    if gpu is None:
        return None, None
    if isinstance(gpu, Card):
        return gpu.name, gpu.memory_gib
    name = gpu_name(gpu)
    return name, gpu_memory_gib(name)


def gpu_text(gpu: str | None, gpu_gib: float | None) -> str:
    """A GPU as reasons name it: "H200, 139.8 GiB" (a size alone: "80.0 GiB")."""
    if gpu_gib is None:
        return gpu or "an unknown GPU"
    return f"{gpu_gib:.1f} GiB" if not gpu or _SIZE_RE.match(gpu) else f"{gpu}, {gpu_gib:.1f} GiB"


PROBLEM_KINDS = (  # a problem's leading words (the messages below) → its short name (plan's feasible column)
    ("memory: estimated headroom", "headroom gate"),
    ("memory: estimated peak", "memory"),
    ("memory estimate ", "peak limit"),
)


def problem_kind(problem: str) -> str:
    """A point's problem in a word or two: memory, headroom gate, peak limit, or the key a layout problem names
    (`parallel.tensor`)."""
    text = problem.split("]: ", 1)[1] if problem.startswith("point [") else problem
    for start, kind in PROBLEM_KINDS:
        if text.startswith(start):
            return kind
    return text.split(":", 1)[0].strip()


def the_gpu(gpu: str | None) -> str:
    """A GPU as a reason's subject: "the H200", or "the GPU" when it is a size alone (`--gpu 80GiB`: never "the
    80GiB's 80.0 GiB")."""
    return "the GPU" if not gpu or _SIZE_RE.match(gpu) else f"the {gpu}"


# ---------------------------------------------------------------------------------------------------------
# One point's feasibility.
# ---------------------------------------------------------------------------------------------------------


@dataclass
class PointFeasibility:
    """A point's estimate and verdict, as the store's `estimates` table and the plan show it."""

    point_id: str
    label: str
    params: dict[str, Any]
    world_size: int
    cells: list[str]
    estimate_gib: float | None  # estimated peak allocated memory per GPU; None: no estimate for this point
    slack_gib: float | None  # caching-allocator slack to allow for beside the peak
    peak_at: str | None
    gpu: str | None
    gpu_gib: float | None
    headroom_gib: float | None  # GPU memory − estimated peak (the allocator slack not subtracted)
    feasible: bool
    reason: str | None  # why it cannot run (layout problems, then memory; no point name); None when feasible
    source: str | None = None  # "bundled" or "megatron": which model made the estimate
    need_gib: float | None = None  # the smallest GPU memory it fits on (slack and headroom gate included)
    note: str | None = None  # why there is no estimate, or the model's caveats
    problems: list[str] = field(default_factory=list)  # the same, each as a campaign error line

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Assessment:
    """Every point's feasibility, and the cells that can run."""

    rows: list[PointFeasibility]
    runnable: list[Point]
    gpu: str | Card | None

    @property
    def infeasible(self) -> list[PointFeasibility]:
        return [row for row in self.rows if not row.feasible]

    def by_point(self) -> dict[str, PointFeasibility]:
        return {row.point_id: row for row in self.rows}

    def records(self) -> list[dict[str, Any]]:
        return [row.to_dict() for row in self.rows]


Estimator = Callable[[Point, bool], MemoryEstimate | None]


@dataclass(frozen=True)
class Limits:
    """The campaign's own memory limits, judged on the estimate before submission (as after, on the measure)."""

    headroom_gib_min: float | None = None  # gates.headroom_gib_min: GPU memory − estimated peak at least this
    peak_gib_max: float | None = None  # sweep.search.constraints.peak_memory_gib_max: estimated peak at most this


def limits_of(campaign: Campaign) -> Limits:
    """The memory limits a campaign sets: its headroom gate and its search's peak-memory constraint."""
    search = campaign.sweep.search
    peak = search.constraints.peak_memory_gib_max if search is not None else None
    return Limits(campaign.gates.headroom_gib_min, peak)


def limit_problems(est: MemoryEstimate, gpu: str | None, gpu_gib: float | None, limits: Limits) -> list[str]:
    """Why the estimate breaks the campaign's own limits (headroom on the GPU, the search's peak constraint)."""
    problems = []
    if limits.peak_gib_max is not None and est.peak_gib > limits.peak_gib_max:
        problems.append(f"memory estimate {est.peak_gib:.3g} GiB per GPU > sweep.search.constraints."
                        f"peak_memory_gib_max {limits.peak_gib_max:g}")  # fmt: skip
    if limits.headroom_gib_min is not None and gpu_gib is not None:
        room = gpu_gib - est.peak_gib
        if room < limits.headroom_gib_min:
            problems.append(f"memory: estimated headroom {room:.2f} GiB on {the_gpu(gpu)} ({gpu_gib:.1f} GiB − estimated "
                            f"peak {est.peak_gib:.2f}) < gates.headroom_gib_min {limits.headroom_gib_min:g}")  # fmt: skip
    return problems


def memory_problem(est: MemoryEstimate, gpu: str, gpu_gib: float) -> str | None:
    """Why the estimate does not fit on the GPU (peak + allocator slack > its memory), or None."""
    if est.headroom(int(gpu_gib * GIB)) >= 0:
        return None
    return (
        f"memory: estimated peak {est.peak_gib:.1f} GiB per GPU (at {est.peak_at}) + "
        f"{est.reserve_bytes / GIB:.1f} GiB allocator slack exceeds {the_gpu(gpu)}'s {gpu_gib:.1f} GiB; lower the "
        "micro-batch size, recompute activations or shard more (TP/PP/EP, distributed optimizer)"
    )


def need_gib(est: MemoryEstimate, limits: Limits) -> float:
    """The smallest GPU memory (GiB, rounded up to 0.001) on which the estimate fits (`memory_problem`) and
    keeps the headroom gate's minimum (`limit_problems`): what the attempt wrapper checks on the node."""
    need = (est.peak_bytes + est.reserve_bytes) / GIB
    if limits.headroom_gib_min is not None:
        need = max(need, est.peak_gib + limits.headroom_gib_min)
    return math.ceil(need * 1000) / 1000


def assess_point(cells: list[Point], estimator: Estimator, gpu: str | Card | None,
                 limits: Limits = Limits()) -> PointFeasibility:  # fmt: skip
    """One point (its cells, repeats of it): layout problems, estimate, the fit on `gpu` (a table name, a
    size or a Card; None: the point's resources.gpu, else no memory check) and the campaign's own `limits`."""
    first = cells[0]
    gpu, gpu_gib = _target(gpu or first.resources.get("gpu"))
    problems = list(first.infeasible)
    est, note = None, None
    if not problems:
        try:
            est = estimator(first, gpu is not None)
        except (ValueError, KeyError, TypeError, ArithmeticError) as err:  # flags or recipe give none
            note = f"no estimate: {err}"
    if est is None and note is None and not problems:
        note = "no estimate for this trainer's settings"
    if est is not None and gpu is not None and gpu_gib is not None:
        problem = memory_problem(est, gpu, gpu_gib)
        if problem:
            problems.append(problem)
    if est is not None and not problems:
        problems += limit_problems(est, gpu, gpu_gib, limits)
    return PointFeasibility(
        point_id=first.point_id,
        label=first.label,
        params=dict(first.params),
        world_size=first.world_size,
        cells=[c.cell_id for c in cells],
        estimate_gib=round(est.peak_gib, 3) if est else None,
        slack_gib=round(est.reserve_bytes / GIB, 3) if est else None,
        peak_at=est.peak_at if est else None,
        gpu=gpu,
        gpu_gib=gpu_gib,
        headroom_gib=round(gpu_gib - est.peak_gib, 3) if est and gpu_gib is not None else None,
        feasible=not problems,
        reason="; ".join(p.removeprefix(f"point [{first.label}]: ") for p in problems) or None,
        source=first.trainer_kind if est else None,
        need_gib=need_gib(est, limits) if est else None,
        note=note or ("; ".join(est.notes) if est and est.notes else None),
        problems=problems,
    )


def assess(points: Sequence[Point], estimator: Estimator, gpu: str | Card | None = None,
           limits: Limits = Limits()) -> Assessment:  # fmt: skip
    """Every point of an expansion (cells grouped by point id, in order) judged; `gpu` (the CLI's --gpu, or
    the Card `--gpu auto` found) wins over each point's resources.gpu."""
    if isinstance(gpu, str) and gpu:
        gpu = gpu_name(gpu)  # an unknown name is refused before anything is estimated
    groups: dict[str, list[Point]] = {}
    for point in points:
        groups.setdefault(point.point_id, []).append(point)
    rows = [assess_point(cells, estimator, gpu, limits) for cells in groups.values()]
    bad = {row.point_id for row in rows if not row.feasible}
    return Assessment(rows, [p for p in points if p.point_id not in bad], gpu)


def refuse(assessment: Assessment, file: str | None, strict: bool) -> None:
    """With `strict`, any infeasible point refuses the campaign (ConfigError naming each reason, as before
    feasibility); without, only a campaign whose every point is infeasible is refused."""
    infeasible = assessment.infeasible
    if not infeasible:
        return
    problems = [_named(row, p) for row in infeasible for p in row.problems]
    if strict:
        raise ConfigError(problems, file=file)
    if not assessment.runnable:
        raise ConfigError(
            [*problems, "every point of the campaign is infeasible, so nothing would run: fix the layout or "
             "the memory problems above, or name a larger GPU with --gpu"],
            file=file,
        )  # fmt: skip


def _named(row: PointFeasibility, problem: str) -> str:
    """A problem with its point's name in front (layout problems already carry it)."""
    if problem.startswith("point [") or not row.params:
        return problem
    return f"point [{row.label}]: {problem}"


def summary_lines(assessment: Assessment, limit: int | None = None) -> list[str]:
    """Plain lines for the terminal: how many points are infeasible, then each one's problems (the first
    `limit` lines of them; `mbx campaign plan` lists all)."""
    infeasible = assessment.infeasible
    if not infeasible:
        return []
    problems = [f"  {_named(row, p)}" for row in infeasible for p in row.problems]
    lines = [f"{len(infeasible)} of {len(assessment.rows)} point(s) infeasible, skipped (not run):"]
    if limit is not None and len(problems) > limit:
        rest = len(problems) - limit
        problems = [*problems[:limit], f"  … and {rest} more (`mbx campaign plan` lists them all)"]
    return lines + problems


def check_points(points: Sequence[Point], gpu: str | Card | None, strict: bool, file: str | None,
                 limits: Limits = Limits()) -> Assessment:  # fmt: skip
    """The runner's, the dry run's, the search's and the plan's feasibility step: every point judged by its
    trainer kind's estimate on `gpu` (None: each point's resources.gpu) and the campaign's `limits`
    (`limits_of`), refused as `refuse` says; `.runnable` are the cells to run."""
    assessment = assess(points, memory_estimate, gpu, limits)
    refuse(assessment, file, strict)
    return assessment


def with_gpu_memory(campaign: Campaign, gpu: str | Card | None) -> Campaign:
    """The campaign as run: `gpu` (the CLI's --gpu; a Card as its size) recorded as its resources.gpu, and
    gates.gpu_memory_gib filled from it (or resources.gpu) when a headroom gate needs it and the file does not
    give it (stored with the campaign: regate, status, the report and freeze judge headroom on that GPU where
    an attempt recorded no GPU of its own; reports/gates.py)."""
    if gpu:
        named = f"{gpu.memory_gib:g}GiB" if isinstance(gpu, Card) else gpu_name(gpu)
        campaign = campaign.model_copy(update={"resources": campaign.resources.model_copy(update={"gpu": named})})
    gates = campaign.gates
    _, memory = _target(gpu or campaign.resources.gpu)
    if gates.headroom_gib_min is None or gates.gpu_memory_gib is not None or memory is None:
        return campaign
    return campaign.model_copy(update={"gates": gates.model_copy(update={"gpu_memory_gib": memory})})


# ---------------------------------------------------------------------------------------------------------
# On the node: what each point's GPU must hold, and a point the GPU check refused, judged on that GPU.
# ---------------------------------------------------------------------------------------------------------


def gpu_needs(records: Iterable[dict[str, Any]]) -> dict[str, GpuNeed]:
    """Point id → what its GPU must hold, from assessment records (`Assessment.records()`, or the store's
    `estimates`): feasible points with an estimate judged on a GPU. Points without an estimate (a command
    trainer whose flags do not give the model's shape) are never refused; their GPU is still recorded."""
    return {
        r["point_id"]: GpuNeed(float(r["need_gib"]), gpu_text(r.get("gpu"), r.get("gpu_gib")))
        for r in records
        if r.get("feasible") and r.get("need_gib") is not None and r.get("gpu_gib") is not None
    }


def on_card(cell: CellRow, cells: list[str], node: dict[str, Any], limits: Limits, refusal: str) -> dict[str, Any]:
    """The estimates record of a point the attempt wrapper refused on its node's GPU (node.json's gpu_name and
    gpu_memory_gib): the point judged again on that GPU, infeasible with the reason (the node's `refusal`
    stands when the judgement here finds it would fit: the trainer never started either way)."""
    point = Point(cell.cell_id, cell.point_id, cell.repeat, cell.params, cell.recipe, cell.resources, cell.env,
                  cell.label, cell.trainer_kind)  # fmt: skip
    memory = node.get("gpu_memory_gib")
    card = Card(str(node.get("gpu_name") or "GPU"), float(memory)) if isinstance(memory, (int, float)) else None
    row = assess_point([point], memory_estimate, card, limits) if card else None
    record = row.to_dict() if row else {"point_id": cell.point_id, "label": cell.label, "params": cell.params,
                                        "world_size": point.world_size, "estimate_gib": None, "gpu": None}  # fmt: skip
    record.update(cells=cells, feasible=False, reason=(row.reason if row and row.reason else refusal))
    return record
