"""Parse-speed benchmark: write ~1 GB of realistic multi-rank Megatron-LM log to a temp dir, then time the streaming parse.

    python benchmarks/parse_speed.py            # 1 GB, the figure reported in BENCHMARKS.md
    python benchmarks/parse_speed.py --gb 0.1   # a quick run
    python benchmarks/parse_speed.py --metrics-steps 100000   # metrics.jsonl instead (trainer/rundir.py)

The log looks like `srun -l` output of an 8-rank job: the last rank (7) prints iteration lines,
rank 0 memory lines after the first iteration and around every checkpoint save, every rank prints
INFO timer blocks, Python warnings and NCCL INFO lines; a few lines carry ANSI colours. Generation is
not timed. The parse is `reports.parsers.iter_rows(path)`: line by line, one row held at a time.

--metrics-steps N times the other parse of a run: `trainer.rundir.read_metrics` over a metrics.jsonl of N step
rows as the bundled trainer writes them (`rundir.MetricsWriter`, the 17 keys of a trainer row), best of 5 (wall and
CPU time: on a shared machine quote the CPU time).
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from reports.parsers import iter_rows  # noqa: E402
from trainer import rundir  # noqa: E402

RANKS = 8
TRAIN_ITERS = 10_000_000

NOISE = [
    "{r}: INFO:megatron.core.timers:(min, max) time across ranks (ms):\n"
    "{r}:     forward-backward ...............................: ({a:.2f}, {b:.2f})\n"
    "{r}:     optimizer ......................................: ({c:.2f}, {d:.2f})\n",
    "{r}: /usr/local/lib/python3.12/dist-packages/torch/distributed/c10d_logger.py:83: FutureWarning: "
    "`torch.distributed._all_gather_base` is a private function and will be deprecated.\n"
    "{r}:   return func(*args, **kwargs)\n",
    "{r}: node-{n}:{pid}:{pid2} [{g}] NCCL INFO Channel {ch:02d}/0 : {g} -> {g2} via P2P/CUMEM/read\n",
    "{r}: WARNING:megatron.core.rerun_state_machine:Result validation enabled\n",
    "{r}: \x1b[32m[I {ts}]\x1b[0m saving checkpoint shard {g} of {n} in 0.{pid} s\n",
]


def iteration_line(step: int, rng: random.Random) -> str:
    """One line exactly as Megatron-LM's training_log prints it (2026 format), srun-labelled."""
    ms = 1500.0 + rng.random() * 100.0
    return (
        f"{RANKS - 1}:  [2026-04-15 11:{step // 60 % 60:02d}:{step % 60:02d}.{rng.randrange(10**6):06d}]"
        f" iteration {step:8d}/{TRAIN_ITERS:8d} | consumed samples: {step * 256:12d} |"
        f" elapsed time per iteration (ms): {ms:.1f} | throughput per GPU (TFLOP/s/GPU): {400 + rng.random() * 20:.1f} |"
        f" learning rate: {3e-4 * rng.random():.6E} | global batch size:   256 |"
        f" lm loss: {2 + 8 * rng.random():.6E} | load_balancing_loss: {1 + rng.random():.6E} |"
        f" loss scale: 1.0 | grad norm: {rng.random():.3f} |"
        f" number of skipped iterations:   0 | number of nan iterations:   0 |\n"
    )


def memory_line(step: int, rng: random.Random) -> str:
    base = 40000 + rng.random() * 1000
    return (
        f"0: [Rank 0] (after {step} iterations) memory (MB) | allocated: {base:.2f} | max allocated: {base * 1.6:.2f}"
        f" | reserved: {base * 1.7:.2f} | max reserved: {base * 1.7:.2f}\n"
    )


def write_log(path: Path, target_bytes: int, seed: int = 0) -> tuple[int, int]:
    """Write the synthetic log; return (bytes, iteration lines)."""
    rng = random.Random(seed)
    written = steps = 0
    with open(path, "w", encoding="utf-8") as fh:
        batch: list[str] = []
        while written < target_bytes:
            steps += 1
            if steps == 1 or steps % 500 == 0:
                batch.append(memory_line(steps, rng))
            batch.append(iteration_line(steps, rng))
            for _ in range(rng.choice((0, 0, 1, 1, 2))):
                template = rng.choice(NOISE)
                batch.append(
                    template.format(
                        r=rng.randrange(RANKS),
                        a=rng.random() * 900,
                        b=rng.random() * 900 + 900,
                        c=rng.random() * 90,
                        d=rng.random() * 90 + 90,
                        n=rng.randrange(64),
                        pid=rng.randrange(99999),
                        pid2=rng.randrange(99999),
                        g=rng.randrange(8),
                        g2=rng.randrange(8),
                        ch=rng.randrange(32),
                        ts="0415 11:19:02",
                    )
                )
            if len(batch) >= 4096:
                chunk = "".join(batch)
                fh.write(chunk)
                written += len(chunk.encode())
                batch.clear()
        chunk = "".join(batch)
        fh.write(chunk)
        written += len(chunk.encode())
    return written, steps


def metrics_row(step: int, rng: random.Random) -> dict[str, float | int | bool]:
    """One step row with the keys and magnitudes the bundled trainer writes (trainer/train.py)."""
    ms = 1500.0 + rng.random() * 100.0
    return {
        "step": step, "loss": 2 + 8 * rng.random(), "grad_norm": rng.random(), "lr": 3e-4 * rng.random(),
        "step_time_ms": ms, "tflops_per_gpu": 400 + rng.random() * 20, "tokens_per_s_per_gpu": 1e6 / ms,
        "mem_allocated_gib": 24 + rng.random(), "mem_max_allocated_gib": 34 + rng.random(), "mem_reserved_gib": 37.0,
        "mem_max_reserved_gib": 37.0, "rss_gib": 1.6 + rng.random(), "skipped": False, "nan": False,
        "aux_loss": 0.002 * rng.random(), "tokens_dropped_frac": 0.0, "time": 1796311263.5 + step * ms / 1000,
    }  # fmt: skip


def metrics_speed(steps: int) -> None:
    """Write a metrics.jsonl of `steps` rows through rundir.MetricsWriter, time rundir.read_metrics (best of 5)."""
    rng = random.Random(0)
    with tempfile.TemporaryDirectory(prefix="mbx-metrics-speed-") as tmp:
        writer = rundir.MetricsWriter(Path(tmp))
        t0 = time.perf_counter()
        for step in range(1, steps + 1):
            writer.write(metrics_row(step, rng))
        writer.close()
        write_s = time.perf_counter() - t0
        size = (Path(tmp) / rundir.METRICS).stat().st_size
        best = best_cpu = float("inf")
        for _ in range(5):
            t0, c0 = time.perf_counter(), time.process_time()
            rows = rundir.read_metrics(Path(tmp))
            best, best_cpu = min(best, time.perf_counter() - t0), min(best_cpu, time.process_time() - c0)
        assert len(rows) == steps and rows[-1]["step"] == steps
    print(f"metrics.jsonl: {steps} rows, {size / 1e6:.1f} MB ({size / steps:.0f} bytes a row), written in "
          f"{write_s:.2f} s; read_metrics best of 5: {best:.3f} s wall, {best_cpu:.3f} s CPU "
          f"({best_cpu / steps * 1e6:.2f} us of CPU a row, {size / 1e6 / best_cpu:.0f} MB/s of CPU)")  # fmt: skip
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}, "
          f"{time.strftime('%Y-%m-%d %H:%M')}")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gb", type=float, default=1.0, help="log size in GB (1e9 bytes)")
    ap.add_argument("--keep", help="write the log to this path and keep it (default: a temp dir, deleted)")
    ap.add_argument("--metrics-steps", type=int, help="time rundir.read_metrics over this many rows instead")
    args = ap.parse_args()
    if args.metrics_steps:
        metrics_speed(args.metrics_steps)
        return
    target = int(args.gb * 1e9)
    with tempfile.TemporaryDirectory(prefix="mbx-parse-speed-") as tmp:
        path = Path(args.keep) if args.keep else Path(tmp) / "megatron_8rank.log"
        t0 = time.perf_counter()
        size, steps = write_log(path, target)
        print(
            f"generated {size / 1e9:.3f} GB, {steps} iterations in {time.perf_counter() - t0:.1f} s: {path}"
        )
        load = os.getloadavg()
        t0 = time.perf_counter()
        c0 = time.process_time()
        rows = 0
        with_memory = 0
        last = None
        for row in iter_rows(path):
            rows += 1
            if row["mem_allocated_gib"] is not None:
                with_memory += 1
            last = row
        seconds = time.perf_counter() - t0
        cpu = time.process_time() - c0
        assert rows == steps, (rows, steps)
        assert last is not None and last["step"] == steps
        print(
            f"parsed {rows} rows ({with_memory} with memory) in {seconds:.2f} s: "
            f"{size / 1e9 / seconds:.3f} GB/s, {seconds / (size / 1e9):.2f} s per GB"
        )
        print(f"CPU time of the parse: {cpu:.2f} s ({size / 1e9 / cpu:.3f} GB/s of CPU)")
        print(
            f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load average before/after "
            f"{load[0]:.2f}/{os.getloadavg()[0]:.2f}, {time.strftime('%Y-%m-%d %H:%M')}"
        )


if __name__ == "__main__":
    main()
