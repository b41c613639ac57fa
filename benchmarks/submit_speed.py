"""Submission speed: N quickstart-sized points onto a local Slurm, mbx's submitit arrays vs one NeMo-Run Experiment.

    python benchmarks/submit_speed.py [--points 256] [--repeats 1] [--json out.json]

Starts its own one-node Slurm (tests/slurm_cluster.py: munged + slurmctld + slurmd in a temp dir; needs the
Debian packages slurm-wlm and munge and root), expands a quickstart-sized sweep to N points (capacity factor ×
top-k), builds the attempts the engine would build (run dir + recipe.yaml, not timed), then times
`launcher.submit(specs)` — render, write scripts, submit — until every point has a Slurm job id:

  mbx submitit   one job array per resource shape (here: one sbatch call for all N points)
  mbx nemo-run   one NeMo-Run Experiment with one run.Script task (one sbatch) per point, LocalTunnel
  raw nemo-run   the same Experiment built directly with nemo_run (no mbx rendering), for reference

The node is drained first, so every job stays pending (no job competes with the submission for the 2 cores);
all jobs are cancelled right after each submission is timed. Goal: mbx ≤ 5 s for 256
points and ≥ 20× faster than the per-task Experiment.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import yaml  # noqa: E402

from launchers.base import LaunchSpec, Resources  # noqa: E402
from orchestrator.spec.campaign import Campaign  # noqa: E402
from orchestrator.spec.yamlio import dump_yaml  # noqa: E402
from orchestrator.trainers import expand  # noqa: E402


def campaign(points: int) -> Campaign:
    """The quickstart campaign with a sweep of `points` points (capacity factor × top-k 1..8), 2 ranks each."""
    data = yaml.safe_load((ROOT / "campaigns" / "quickstart.yaml").read_text())
    factors = [round(1.0 + 0.05 * i, 2) for i in range(max(1, points // 8))]
    data["sweep"] = {"axes": {"model.moe.capacity_factor": factors, "model.moe.top_k": list(range(1, 9))}}
    data["resources"] = {"nodes": 1, "gpus_per_node": 2, "time_limit_min": 10}
    data["cluster"] = {"gpus": False, "python": sys.executable}
    data["wandb"] = {"mode": "disabled"}
    return Campaign.model_validate(data)


def specs_for(c: Campaign, workspace: Path, label: str, points: int) -> list[LaunchSpec]:
    """What the engine would hand a launcher: one attempt per point, run dir and recipe.yaml already written."""
    specs = []
    for point in expand(c)[:points]:
        run_dir = workspace / c.name / label / point.cell_id / "1"
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "recipe.yaml").write_text(dump_yaml(point.recipe))
        specs.append(LaunchSpec(
            campaign=c.name, cell_id=point.cell_id, attempt=1, run_dir=run_dir,
            resources=Resources(1, 2, 10), module="trainer",
            args=["--recipe", str(run_dir / "recipe.yaml"), "--out", str(run_dir)], env=dict(point.env),
        ))  # fmt: skip
    return specs


def cancel_all(cluster) -> None:
    cluster.cancel_all()
    deadline = time.time() + 60
    while time.time() < deadline and cluster.run("squeue", "-h", "-t", "PD,R,CG", check=False).stdout.strip():
        time.sleep(0.5)


def time_mbx(backend: str, c: Campaign, workspace: Path, points: int, cluster) -> dict:
    from launchers import registry
    from launchers.profile import SlurmProfile

    cls = registry.get(backend)
    launcher = cls(cls.Settings(), workspace, SlurmProfile(cluster=c.cluster, container=c.container))
    specs = specs_for(c, workspace, backend, points)
    start = time.perf_counter()
    submitted = launcher.submit(specs)
    elapsed = time.perf_counter() - start
    cancel_all(cluster)
    assert len(submitted) == points and all(s.job_id for s in submitted)
    return {
        "seconds": elapsed,
        "jobs": len({s.job_id.split("_")[0] for s in submitted}),
        "points": len(submitted),
    }


def time_raw_nemo(c: Campaign, workspace: Path, points: int, cluster) -> dict:
    """One Experiment, one task per point, built with nemo_run directly (same per-rank entry, no mbx render)."""
    from launchers.nemo import inside_experiment

    start = time.perf_counter()
    import nemo_run as run

    tunnel_dir = workspace / "raw-nemo" / "experiments"
    experiment = run.Experiment("raw", id="raw_bench", base_dir=str(workspace / "raw-nemo"), clean_mode=True,
                                enable_goodbye_message=False, skip_status_at_exit=True, log_level="WARN")  # fmt: skip
    with inside_experiment(experiment):
        for index in range(points):
            executor = run.SlurmExecutor(
                account=None, nodes=1, ntasks_per_node=2, time="00:10:00", tunnel=run.LocalTunnel(job_dir=str(tunnel_dir)),
                packager=run.Packager(), poll_estimated_start_time=False, job_name_prefix="raw-",
            )  # fmt: skip
            script = run.Script(path=str(ROOT / "launchers" / "node" / "rank.py"), args=["--tasks", "none", "--index", str(index)],
                                entrypoint=sys.executable)  # fmt: skip
            experiment.add(script, executor=executor, name=f"p{index}")
        experiment.run(detach=True)
    elapsed = time.perf_counter() - start
    handles = [job.handle for job in experiment.jobs]
    cancel_all(cluster)
    assert len(handles) == points and all(handles)
    return {"seconds": elapsed, "jobs": len(handles), "points": points, "includes_import": False}


def versions() -> dict:
    out = {"python": platform.python_version()}
    for name in ("submitit", "nemo-run", "leptonai"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    try:
        out["mbx_git"] = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                                        text=True).stdout.strip()  # fmt: skip
    except OSError:
        out["mbx_git"] = None
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--points", type=int, default=256)
    parser.add_argument("--no-raw", action="store_true", help="skip the raw NeMo-Run reference")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args(argv)

    from slurm_cluster import missing_binaries, start_cluster, stop_cluster

    missing = missing_binaries()
    if missing:
        print(
            f"Slurm is not installed (missing {', '.join(missing)}): apt-get install slurm-wlm munge",
            file=sys.stderr,
        )
        return 2
    c = campaign(args.points)
    results: dict = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "points": args.points,
                     "versions": versions(), "host": platform.node()}  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="mbx-submit-speed-") as tmp:
        cluster = start_cluster(Path(tmp) / "slurm")
        import os

        os.environ.update(cluster.env)
        try:
            # drained: every submitted job stays pending, so no job competes with the submitting process for CPU
            cluster.run(
                "scontrol", "update", "nodename=localhost", "state=drain", "reason=submit-speed benchmark"
            )
            results["versions"]["slurm"] = cluster.run("sbatch", "--version", check=False).stdout.strip()
            workspace = Path(tmp) / "ws"
            t0 = time.perf_counter()
            import nemo_run  # noqa: F401  (import once, outside every timing: it takes seconds)

            results["nemo_run_import_s"] = time.perf_counter() - t0
            results["mbx_submitit"] = time_mbx("submitit", c, workspace, args.points, cluster)
            results["mbx_nemo_run"] = time_mbx("nemo-run", c, workspace, args.points, cluster)
            if not args.no_raw:
                results["raw_nemo_run"] = time_raw_nemo(c, workspace, args.points, cluster)
        finally:
            stop_cluster(cluster)
    mbx_s = results["mbx_submitit"]["seconds"]
    results["speedup_vs_nemo_run_experiment"] = results["mbx_nemo_run"]["seconds"] / mbx_s
    if "raw_nemo_run" in results:
        results["speedup_vs_raw_nemo_run"] = results["raw_nemo_run"]["seconds"] / mbx_s
    print(
        f"{args.points} points onto a local one-node Slurm ({results['date']}, {results['versions']['slurm']})"
    )
    print(f"  mbx submitit arrays     {mbx_s:8.3f} s  ({results['mbx_submitit']['jobs']} sbatch call(s))")
    print(f"  mbx nemo-run Experiment {results['mbx_nemo_run']['seconds']:8.3f} s  ({args.points} tasks)")
    if "raw_nemo_run" in results:
        print(f"  raw NeMo-Run Experiment {results['raw_nemo_run']['seconds']:8.3f} s  ({args.points} tasks)")
    print(f"  speed-up {results['speedup_vs_nemo_run_experiment']:.0f}× (goal ≥ 20×; mbx goal ≤ 5 s)")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    ok = mbx_s <= 5 and results["speedup_vs_nemo_run_experiment"] >= 20
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
