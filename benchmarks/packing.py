"""Packing: N short points on a local Slurm, one job array task per point vs packs of many points per allocation.

    python benchmarks/packing.py [--points 64] [--packs 1,8,64] [--work-s 0.5] [--ranks 2] [--node-cpus 2]
                                 [--json out.json]

Starts its own one-node Slurm (tests/slurm_cluster.py: munged + slurmctld + slurmd in a temp dir; needs the
Debian packages slurm-wlm and munge, and root). Each point is a real attempt through mbx's submitit launcher:
`--ranks` srun tasks run launchers/node/rank.py (environment, node.json, the attempt wrapper, exit.json), whose
command sleeps `--work-s` and writes a completed status.json. For each pack size (1: today's one array task per
point) it times `launcher.submit` and then polls, as the engine does, until every point is final, and checks that
every point completed.

The node declares `--node-cpus` CPUs; with `--node-cpus` = `--ranks` one point fills the node (as a GPU point that
takes a whole node), so array tasks run one at a time too and the figure is the per-job overhead packing saves.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from collections import Counter
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from launchers.backends.submitit_slurm import SubmititLauncher, SubmititSettings  # noqa: E402
from launchers.base import LaunchSpec, Resources  # noqa: E402
from launchers.profile import SlurmProfile  # noqa: E402


def point_code(work_s: float) -> str:
    """A short point: rank 0 sleeps `work_s` and writes a completed status (the other ranks sleep too)."""
    return (f"import sys, os, time; sys.path.insert(0, {str(ROOT)!r}); from trainer import rundir; "
            f"time.sleep({work_s}); os.environ['RANK'] == '0' and rundir.write_status(os.environ['MBX_RUN_DIR'], "
            "{'state': 'completed', 'world_size': int(os.environ['WORLD_SIZE'])}, rundir.TRAINER)")  # fmt: skip


def specs_for(workspace: Path, label: str, points: int, ranks: int, work_s: float) -> list[LaunchSpec]:
    code = point_code(work_s)
    return [
        LaunchSpec(
            campaign="bench",
            cell_id=f"{label}-p{i:03d}",
            attempt=1,
            run_dir=workspace / "bench" / label / f"p{i:03d}" / "1",
            resources=Resources(1, ranks, 5),
            module=None,
            args=[sys.executable, "-c", code],
        )  # fmt: skip
        for i in range(points)
    ]


def time_mode(cluster, workspace: Path, pack: int, args: argparse.Namespace) -> dict:
    """Submit N points with `pack` points per allocation; seconds until every point is final."""
    profile = SlurmProfile.model_validate({"cluster": {"gpus": False, "python": sys.executable}})
    settings = SubmititSettings(pack=pack, poll_interval_s=0.5, poll_max_interval_s=1)
    launcher = SubmititLauncher(settings, workspace, profile)
    launcher.settle_s = 1.0
    specs = specs_for(workspace, f"pack{pack}", args.points, args.ranks, args.work_s)
    start = time.perf_counter()
    jobs = launcher.submit(specs)
    submitted = time.perf_counter() - start
    done: dict[str, str] = {}
    last = start
    while len(done) < len(jobs) and time.perf_counter() - start < args.timeout_s:
        states = launcher.poll([job for job in jobs if job.job_id not in done])
        done.update({job_id: state.value for job_id, state in states.items() if state.finished})
        if time.perf_counter() - last > 15:
            print(
                f"  pack {pack}: {len(done)}/{len(jobs)} done after {time.perf_counter() - start:.0f} s",
                flush=True,
            )
            last = time.perf_counter()
        time.sleep(0.25)
    elapsed = time.perf_counter() - start
    allocations = len({job.info.get("allocation", job.job_id) for job in jobs})
    return {"pack": pack, "points": len(jobs), "allocations": allocations, "submit_s": round(submitted, 3),
            "all_done_s": round(elapsed, 1), "per_point_s": round(elapsed / len(jobs), 2),
            "states": dict(Counter(done.values())), "unfinished": len(jobs) - len(done)}  # fmt: skip


def versions() -> dict[str, str]:
    found = {"python": platform.python_version()}
    for name in ("submitit",):
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return found


def table(rows: list[dict], args: argparse.Namespace) -> str:
    base = next((r["all_done_s"] for r in rows if r["pack"] == 1), None)
    lines = [f"{args.points} points × {args.ranks} ranks, {args.work_s} s of work each, one node of "
             f"{args.node_cpus} CPUs", "",
             "| points per allocation | allocations | submit (s) | all done (s) | per point (s) | vs one job per point | states |",
             "|---:|---:|---:|---:|---:|---:|---|"]  # fmt: skip
    for r in rows:
        ratio = f"{base / r['all_done_s']:.2f}×" if base else "—"
        states = ", ".join(f"{k} {v}" for k, v in sorted(r["states"].items()))
        lines.append(f"| {r['pack']} | {r['allocations']} | {r['submit_s']} | {r['all_done_s']} | {r['per_point_s']} "
                     f"| {ratio} | {states} |")  # fmt: skip
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--points", type=int, default=64)
    parser.add_argument("--packs", default="1,8,64", help="pack sizes to time (1: one array task per point)")
    parser.add_argument("--work-s", type=float, default=0.5, help="seconds of work per point")
    parser.add_argument("--ranks", type=int, default=2, help="srun tasks per point")
    parser.add_argument("--node-cpus", type=int, default=2, help="CPUs the local node declares to Slurm")
    parser.add_argument("--timeout-s", type=float, default=1200)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    from slurm_cluster import start_cluster, stop_cluster

    rows = []
    with tempfile.TemporaryDirectory(prefix="mbx-packing-") as tmp:
        cluster = start_cluster(Path(tmp) / "slurm", cpus=args.node_cpus)
        os.environ.update(cluster.env)
        try:
            for pack in [int(p) for p in args.packs.split(",")]:
                print(f"pack {pack}: {args.points} points ...", flush=True)
                rows.append(time_mode(cluster, Path(tmp) / "ws", pack, args))
                print(f"  {rows[-1]}", flush=True)
                cluster.wait_idle(timeout=120)
        finally:
            stop_cluster(cluster)
    result = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "machine": platform.node(),
              "versions": versions(), "args": {k: str(v) for k, v in vars(args).items()}, "rows": rows}  # fmt: skip
    print(table(rows, args))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0 if all(r["unfinished"] == 0 and set(r["states"]) == {"completed"} for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
