"""Cut a torch.profiler Chrome trace down to what the kernel classifier reads, gzipped: GPU events, the CPU ranges
around each launch (ops, annotations) and the launches with their correlation ids; other args dropped.

    python benchmarks/trim_trace.py RUN_DIR/profile-trace.json OUT.json.gz [--top 25]

The trimmed file keeps Chrome-trace form ({"traceEvents": [...]}) so the kernel classifier (reports/kernels.py)
and HolisticTraceAnalysis read it like the original; tests/data/traces/ holds ones recorded on the H200. It also
prints the kernels that took the most GPU time (name, calls, total ms).
"""

from __future__ import annotations

import argparse
import gzip
import json
from collections import Counter
from pathlib import Path

GPU = {"kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation"}
CPU = {"cpu_op", "user_annotation", "python_function", "cuda_runtime", "cuda_driver"}
ARGS = ("correlation", "stream", "device", "grid", "block")


def trim(events: list[dict]) -> list[dict]:
    """GPU events, CPU ranges and launches (args cut to the correlation id and launch shape), metadata."""
    kept = []
    for event in events:
        cat = event.get("cat", "")
        if cat in GPU or cat in CPU or event.get("ph") == "M":
            args = {k: v for k, v in (event.get("args") or {}).items() if k in ARGS}
            event = {k: v for k, v in event.items() if k != "args"}
            if args:
                event["args"] = args
            kept.append(event)
    return kept


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("trace", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    data = json.loads(args.trace.read_text())
    events = trim(data.get("traceEvents", []))
    with gzip.open(args.out, "wt") as handle:
        json.dump({"traceEvents": events, "deviceProperties": data.get("deviceProperties", [])}, handle)
    total, calls = Counter(), Counter()
    for event in events:
        if event.get("cat") == "kernel":
            total[event["name"]] += float(event.get("dur", 0)) / 1e3
            calls[event["name"]] += 1
    print(f"{args.out}: {len(events)} events, {sum(total.values()):.1f} ms of kernels")
    for name, ms in total.most_common(args.top):
        print(f"{ms:9.2f} ms {calls[name]:6d}×  {name[:140]}")


if __name__ == "__main__":
    main()
