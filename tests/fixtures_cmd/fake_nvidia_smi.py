"""A stand-in for nvidia-smi on a machine without a GPU: answers `--query-gpu=FIELDS --format=csv,...` as the
real one does, for the GPUs in FAKE_NVIDIA_SMI_GPUS (`name|memory MiB` per GPU, `;` between them; default one
NVIDIA H100 80GB HBM3 with 81559 MiB, as an H100 SXM reports itself; empty: no GPU, exit 6 as the real one).

    python fake_nvidia_smi.py --query-gpu=name,memory.total,driver_version --format=csv,noheader,nounits
    NVIDIA H100 80GB HBM3, 81559, 550.54.15

An external tool's double (not an mbx component): tests put it on PATH as `nvidia-smi`.
"""

from __future__ import annotations

import os
import sys

DRIVER = "550.54.15"


def main(argv: list[str]) -> int:
    query = next((a.split("=", 1)[1] for a in argv if a.startswith("--query-gpu=")), None)
    form = next((a.split("=", 1)[1] for a in argv if a.startswith("--format=")), "")
    if query is None or "csv" not in form:
        print(
            "fake nvidia-smi: only --query-gpu=... --format=csv[,noheader][,nounits] is answered",
            file=sys.stderr,
        )
        return 2
    listed = os.environ.get("FAKE_NVIDIA_SMI_GPUS", "NVIDIA H100 80GB HBM3|81559")
    if not listed:  # a node whose driver sees no GPU: what the real one says then
        print("No devices were found")
        return 6
    gpus = [g.split("|") for g in listed.split(";")]
    fields = query.split(",")
    units = "nounits" not in form
    if "noheader" not in form:
        print(", ".join(f + (" [MiB]" if f == "memory.total" and units else "") for f in fields))
    for name, mib in gpus:
        values = {"name": name, "memory.total": f"{mib} MiB" if units else mib, "driver_version": DRIVER}
        print(", ".join(values.get(f, "[N/A]") for f in fields))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
