"""Opt-in torch.profiler capture of a few training steps: MBX_TRAINER_PROFILE=START:COUNT writes profile.txt."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from trainer import rundir

PROFILE_ENV = "MBX_TRAINER_PROFILE"


def profile_window() -> tuple[int, int] | None:
    """(first step, last step) to profile from MBX_TRAINER_PROFILE=START:COUNT, or None."""
    raw = os.environ.get(PROFILE_ENV, "").strip()
    if not raw:
        return None
    start, _, count = raw.partition(":")
    first = int(start)
    return first, first + int(count or 1) - 1


class StepProfiler:
    """Profiles steps inside the window on global rank 0 and writes `<out>/profile.txt` (+ a Chrome trace)."""

    def __init__(self, out_dir: Path | None, rank: int):
        self.window = profile_window() if rank == 0 and out_dir is not None else None
        self.out_dir = out_dir
        self._profiler: torch.profiler.profile | None = None
        self._range: torch.profiler.record_function | None = None

    def before_step(self, step: int) -> None:
        if self.window is None or not self.window[0] <= step <= self.window[1]:
            return
        if step == self.window[0]:
            activities = [torch.profiler.ProfilerActivity.CPU]
            if torch.cuda.is_available():
                activities.append(torch.profiler.ProfilerActivity.CUDA)
            self._profiler = torch.profiler.profile(activities=activities, record_shapes=True)
            self._profiler.__enter__()
        # One range per step, named as torch.profiler's own schedule names them (reports/profile_trace.py,
        # HolisticTraceAnalysis): the report's window and step count.
        self._range = torch.profiler.record_function(f"ProfilerStep#{step}")
        self._range.__enter__()

    def after_step(self, step: int) -> None:
        if self._range is not None:
            self._range.__exit__(None, None, None)
            self._range = None
        if self._profiler is None or self.window is None or step != self.window[1]:
            return
        self._profiler.__exit__(None, None, None)
        sort = "self_cuda_time_total" if torch.cuda.is_available() else "self_cpu_time_total"
        table = self._profiler.key_averages().table(sort_by=sort, row_limit=60, max_name_column_width=90)
        grouped = self._profiler.key_averages(group_by_input_shape=True).table(
            sort_by=sort, row_limit=40, max_name_column_width=70, max_shapes_column_width=80
        )
        assert self.out_dir is not None
        rundir.write_profile_text(self.out_dir, first=self.window[0], last=self.window[1], sorted_by=sort,
                                  tables=f"{table}\n\n# by input shape\n{grouped}")  # fmt: skip
        self._profiler.export_chrome_trace(str(self.out_dir / rundir.PROFILE_TRACE))
        self._profiler = None
