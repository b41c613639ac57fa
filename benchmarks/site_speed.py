"""How fast the report site is written and how fast its index loads (issue 13's targets: 1,000 cells × 100 steps
written in ≤ 10 s on the 2-core login machine; the index loaded in headless Chromium in ≤ 2 s).

Run:  .venv/bin/python benchmarks/site_speed.py [--cells 1000] [--steps 100] [--repeat 3] [--out DIR] [--json]

The campaign is synthetic but shaped like a real one: three swept axes (10 × 10 × 10 points: two discrete knobs
and a real number), step rows as the bundled trainer writes them (loss, grad norm, eval loss every 10 steps,
step time, TFLOP/s, tokens/s, memory, dropped tokens), window summaries and gate verdicts from reports/. Timed:
`reports.site.write_site` (index, one page per cell, assets; the best of --repeat runs and each one), then the
index opened from disk in headless Chromium: the wall time of the whole browser process (start-up included) and
the time from navigation to every figure drawn, which site.js records on <html data-rendered-ms>.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from reports.gates import GateSpec, evaluate  # noqa: E402
from reports.site import write_site  # noqa: E402
from reports.views import CampaignView, CellView  # noqa: E402
from reports.window import summarize  # noqa: E402

AXES = ["model.moe.capacity_factor", "moe.dispatcher_sms", "training.micro_batch_size"]


def rows(steps: int, speed: float, seed: int) -> list[dict]:
    """Step rows of one cell: a slow first step, a little jitter, a decaying loss."""
    out = []
    for step in range(1, steps + 1):
        t = 800.0 / speed * (4.0 if step == 1 else 1.0 + 0.01 * math.sin(step * 7 + seed))
        row = {"step": step, "loss": 10.5 * 0.99 ** step, "grad_norm": 1.5 + 0.1 * math.sin(step + seed),
               "lr": 3e-4, "step_time_ms": t, "tflops_per_gpu": 400.0 * 800.0 / t, "tokens_per_s_per_gpu": 1.2e4 * 800.0 / t,
               "mem_allocated_gib": 40.0, "mem_max_allocated_gib": 50.0 + seed % 20, "mem_reserved_gib": 72.0,
               "mem_max_reserved_gib": 72.0, "rss_gib": 3.0, "tokens_dropped_frac": 0.01 * (seed % 5),
               "skipped": False, "nan": False}  # fmt: skip
        if step % 10 == 0:
            row["eval_loss"] = row["loss"] + 0.1
        out.append(row)
    return out


def campaign(cells: int, steps: int) -> CampaignView:
    spec = GateSpec(tflops_per_gpu_min=300.0, peak_alloc_gib_max=68.0)
    out = []
    for i in range(cells):
        cf, sms, mbs = 1.0 + 0.125 * (i % 10), 8 * (1 + (i // 10) % 10), 1 + (i // 100) % 10
        r = rows(steps, 0.8 + 0.4 * ((i * 37) % 101) / 100, i)
        summary = summarize(r, 10)
        out.append(CellView(cell_id=f"p{i:04d}-r0", point_id=f"p{i:04d}", repeat=0,
                            label=f"capacity_factor={cf}, dispatcher_sms={sms}, micro_batch_size={mbs}",
                            params=dict(zip(AXES, (cf, sms, mbs), strict=True)), state="completed", attempt=1,
                            run_dir=f"/ws/bench/p{i:04d}-r0/1", summary=summary, gate=evaluate(spec, summary),
                            rows=r))  # fmt: skip
    return CampaignView(name="site-speed", description="synthetic 3-axis sweep", axes=AXES, cells=out,
                        gates=spec.model_dump(exclude_none=True), window=10)  # fmt: skip


_LOG = re.compile(r"\[\d+:\d+:\d{4}/(\d\d)(\d\d)(\d\d)\.(\d{6}):INFO:CONSOLE.*mbx-timing (\w+)")


def chromium_load(page: Path, profile: Path) -> dict[str, float]:
    """Seconds from starting a headless Chromium on `page` (from disk, ?timing) to each mark site.js logs:
    loaded (the load event: header, first table rows, sortable), rows (every row in the table), rendered (every
    figure drawn); `exit` is when the browser process ended."""
    chromium = shutil.which("chromium") or "/usr/bin/chromium"
    command = [chromium, "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={profile}",
               "--proxy-server=127.0.0.1:9", "--window-size=1400,900", "--enable-logging=stderr", "--v=0",
               "--virtual-time-budget=60000", "--dump-dom", page.as_uri() + "?timing"]  # fmt: skip
    start = datetime.datetime.now()
    t0 = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, check=True)
    out = {"exit": time.perf_counter() - t0}
    midnight = start.replace(hour=0, minute=0, second=0, microsecond=0)
    for h, m, s, us, name in _LOG.findall(done.stderr):
        at = midnight + datetime.timedelta(hours=int(h), minutes=int(m), seconds=int(s), microseconds=int(us))
        out[name] = (at - start).total_seconds()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cells", type=int, default=1000)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--out", type=Path, default=None, help="where to write the site (default: a temp dir)"
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    view = campaign(args.cells, args.steps)
    out = args.out or Path(tempfile.mkdtemp(prefix="mbx-site-speed-"))
    writes = []
    for _ in range(args.repeat):
        start = time.perf_counter()
        index = write_site(view, out)
        writes.append(time.perf_counter() - start)
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    blank = out / "blank.html"
    blank.write_text('<!DOCTYPE html><title>blank</title><script src="assets/site.js"></script>\n')
    # a fresh Chromium profile per run: every load is a cold start
    with tempfile.TemporaryDirectory(prefix="mbx-site-speed-chromium-") as profiles:
        startup = [chromium_load(blank, Path(profiles) / f"b{i}") for i in range(args.repeat)]
        loads = [chromium_load(index, Path(profiles) / f"i{i}") for i in range(args.repeat)]
    result = {"cells": args.cells, "steps": args.steps, "write_s": writes, "write_s_best": min(writes),
              "site_mib": size / 2**20, "index_kib": index.stat().st_size / 1024, "chromium_blank": startup,
              "chromium_index": loads, "python": platform.python_version(), "cpus": os.cpu_count(),
              "load_average": os.getloadavg()}  # fmt: skip
    if args.json:
        print(json.dumps(result, indent=1))
        return

    def marks(name: str, runs: list[dict[str, float]]) -> str:
        return ", ".join(f"{r[name]:.2f}" if name in r else "?" for r in runs)

    print(f"{args.cells} cells × {args.steps} steps: site written in {', '.join(f'{w:.2f}' for w in writes)} s "
          f"(best {min(writes):.2f} s; target ≤ 10 s); {size / 2**20:.1f} MiB, index {result['index_kib']:.0f} KiB")  # fmt: skip
    print(f"headless Chromium, seconds from process start: blank page loaded {marks('loaded', startup)}; index "
          f"loaded {marks('loaded', loads)} (target ≤ 2 s), all rows {marks('rows', loads)}, every figure drawn "
          f"{marks('rendered', loads)}; load average {result['load_average'][0]:.1f} on {os.cpu_count()} CPUs")  # fmt: skip


if __name__ == "__main__":
    main()
