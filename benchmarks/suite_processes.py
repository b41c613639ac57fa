"""Where the test suite's CPU goes, by kind of process (trainer, mbx command, ...) and by test file.

Run the suite with the accounting hook on, then summarize:
    PYTHONPATH=benchmarks/suite_proclog PROCLOG=/tmp/proclog.jsonl .venv/bin/python -m pytest -q -n 2 --dist loadgroup
    python benchmarks/suite_processes.py /tmp/proclog.jsonl
Processes killed by a signal write nothing; so do non-Python ones (Chromium, Slurm daemons, git).
"""

from __future__ import annotations

import collections
import json
import statistics
import sys

KINDS = (("-m trainer", "trainer"), ("-m orchestrator", "mbx"), ("launchers.node", "node attempt"),
         ("exec(eval(sys.stdin", "pytest-xdist worker"), ("torchrun", "torchrun"), ("multiprocessing", "spawned"),
         ("submitit", "submitit"))  # fmt: skip


def kind(row: dict) -> str:
    line = " ".join(row["argv"])
    return next((name for marker, name in KINDS if marker in line), "other")


def main(path: str) -> None:
    rows = [json.loads(line) for line in open(path) if line.strip()]
    by_kind: dict[str, list[float]] = collections.defaultdict(list)
    per_file: collections.Counter[str] = collections.Counter()
    for row in rows:
        by_kind[kind(row)].append(row["cpu"])
        per_file[row["test"].split("::")[0]] += row["cpu"]
    print(f"{len(rows)} processes, {sum(per_file.values()):.0f} s CPU")
    for name, cpus in sorted(by_kind.items(), key=lambda item: -sum(item[1])):
        print(f"  {sum(cpus):8.1f} s  {len(cpus):5d} x {name} (median {statistics.median(cpus):.2f} s)")
    print("by test file:")
    for name, seconds in per_file.most_common(15):
        print(f"  {seconds:8.1f} s  {name or '(outside a test)'}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "/tmp/proclog.jsonl")
