"""The campaign's `profile:` section: which steps of every cell to profile (torch.profiler, nsys), and the env that asks for it."""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

# The bundled trainer's switch (trainer/profiling.py reads it; tests check the two names agree). The login
# side never imports trainer/profiling.py: it imports torch.
TRAINER_PROFILE_ENV = "MBX_TRAINER_PROFILE"
STEPS = re.compile(r"^\s*(\d+)\s*:\s*(\d+)\s*$")
# <run dir>/profile.rank<RANK>.nsys-rep: nsys expands %q{RANK} per rank (each rank runs the argv); Megatron
# captures on rank 0 only (--profile-ranks), so profile.rank0.nsys-rep is the one reports/profile_nsys.py reads.
NSYS_OUTPUT = "profile.rank%q{RANK}"


class Profile(BaseModel):
    """Profile a few steps of every cell; the report shows per cell the GPU time by kernel class."""

    model_config = ConfigDict(extra="forbid")

    steps: str = Field(
        "8:2",
        description=(
            "START:COUNT, e.g. 8:2 profiles steps 8 and 9 (1-based). Keep them out of the collect window "
            "(the last steps): a profiled step runs slower."
        ),
    )
    tool: Literal["auto", "torch", "nsys"] = Field(
        "auto",
        description=(
            "Command trainers: nsys (or auto, where `nsys` is on PATH) runs a Megatron-style argv under Nsight "
            "Systems with Megatron's --profile switches (profile.rank0.nsys-rep); torch leaves them alone (use "
            "Megatron's own --use-pytorch-profiler). The bundled trainer always uses torch.profiler "
            "(profile-trace.json and profile.txt in the run dir)."
        ),
    )

    @field_validator("steps", mode="before")
    @classmethod
    def _quoted(cls, value: object) -> object:
        if isinstance(value, int) and not isinstance(value, bool):
            start, count = divmod(value, 60)
            raise ValueError(
                f"steps must be a quoted START:COUNT string (YAML reads an unquoted {start}:{count} as a "
                f'base-60 number): write steps: "{start}:{count}"'
            )
        return value

    @field_validator("steps")
    @classmethod
    def _steps(cls, value: str) -> str:
        match = STEPS.match(value)
        if not match or int(match.group(1)) < 1 or int(match.group(2)) < 1:
            raise ValueError(
                f"steps must be START:COUNT with START >= 1 and COUNT >= 1 (e.g. 8:2), got {value!r}"
            )
        return f"{int(match.group(1))}:{int(match.group(2))}"

    def window(self) -> tuple[int, int]:
        """(first, last) profiled step."""
        start, count = (int(v) for v in self.steps.split(":"))
        return start, start + count - 1


def trainer_env(profile: Profile | None) -> dict[str, str]:
    """What the bundled trainer's env gains for a campaign's `profile:` ({} without one)."""
    if profile is None:
        return {}
    return {TRAINER_PROFILE_ENV: profile.steps}


def window_problem(profile: Profile | None, steps: int | None, window: int) -> str | None:
    """Why the profiled steps would spoil the measurement (inside the last `window` of `steps`), or None."""
    if profile is None or steps is None:
        return None
    first, last = profile.window()
    if last > steps:
        return f"profile.steps: {profile.steps} profiles up to step {last}, but the point runs {steps} steps"
    if last > steps - window:
        room = steps - window  # steps before the window; step 1 (warm-up) is better left alone
        fix = (f"profile earlier steps, e.g. {max(2, room - 1)}:{min(2, room - 1)}" if room >= 2
               else f"run more steps than the window plus 2 (training.steps > {window + 1})")  # fmt: skip
        return (
            f"profile.steps: {profile.steps} reaches step {last}, inside the collect window (the last {window} "
            f"of {steps} steps); {fix}"
        )
    return None


def nsys_prefix(profile: Profile | None, run_dir: Path, nsys: str | None = None) -> list[str]:
    """argv to put before a command trainer's own, to record `<run dir>/profile.nsys-rep`; [] when not asked
    for or no `nsys` is on PATH. Capture starts and stops with the trainer's cudaProfilerStart/Stop (Megatron:
    `--profile --profile-step-start S --profile-step-end E`, see `megatron_args`)."""
    if profile is None or profile.tool == "torch":
        return []
    found = nsys or shutil.which("nsys")
    if not found:
        return []
    return [
        found, "profile", "--trace=cuda,nvtx,osrt", "--capture-range=cudaProfilerApi", "--capture-range-end=stop",
        "--force-overwrite=true", "-o", str(Path(run_dir) / NSYS_OUTPUT),
    ]  # fmt: skip


def megatron_args(profile: Profile | None) -> list[str]:
    """Megatron-LM's own switches for the profiled steps. Its loop starts the profiler when the 0-based
    iteration counter equals --profile-step-start (the step it logs as start + 1) and stops it at
    --profile-step-end, so 1-based steps first..last are start = first - 1, end = last."""
    if profile is None:
        return []
    first, last = profile.window()
    return ["--profile", "--profile-step-start", str(first - 1), "--profile-step-end", str(last)]


def command_argv(
    profile: Profile | None, argv: list[str], run_dir: Path, nsys: str | None = None
) -> list[str]:
    """A command trainer's argv under the campaign's `profile:`: `nsys profile ... ARGV --profile
    --profile-step-start S --profile-step-end E` for a Megatron-style argv (one with --train-iters) where
    nsys is found; the argv unchanged otherwise (a trainer that never calls cudaProfilerStart would record
    nothing)."""
    if profile is None or "--train-iters" not in argv:
        return list(argv)
    prefix = nsys_prefix(profile, run_dir, nsys)
    return [*prefix, *argv, *megatron_args(profile)] if prefix else list(argv)
