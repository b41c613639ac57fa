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
            "(the last steps): a profiled step runs slower (with Megatron-Bridge's torch profiler the next step "
            "too: the trace is written there); validate refuses steps that reach it."
        ),
    )
    tool: Literal["auto", "torch", "nsys"] = Field(
        "auto",
        description=(
            "The bundled trainer always uses torch.profiler (profile-trace.json and profile.txt in the run dir). "
            "Command trainers, style megatron-lm: nsys (or auto, where `nsys` is on PATH) runs a Megatron-style "
            "argv under Nsight Systems with Megatron's --profile switches (profile.rank0.nsys-rep); torch leaves "
            "them alone (use Megatron's own --use-pytorch-profiler). Style megatron-bridge: torch (and auto) turns "
            "on Bridge's torch profiler on rank 0 (profiling.use_pytorch_profiler=true, logger.tensorboard_dir="
            "<run dir>/tensorboard: the trace is <run dir>/torch_profile/rank-0.json.gz; Bridge writes it at the "
            "start of the step after the profiled ones, which runs slower too); nsys runs it under Nsight Systems "
            "with profiling.use_nsys_profiler=true (profile.rank0.nsys-rep). mbx sets these keys: a campaign that "
            "also sets profiling.* (or, with torch, logger.tensorboard_dir) is refused."
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


def window_problem(
    profile: Profile | None,
    steps: int | None,
    window: int,
    after: int = 0,
    why: str = "",
    steps_key: str = "training.steps",
) -> str | None:
    """Why the profiled steps would spoil the measurement (inside the last `window` of `steps`), or None.
    `after`: steps past the profiled ones the profiler slows too (Bridge's torch trace is written at the start
    of the next step), said in `why`; `steps_key`: the key that sets `steps`, for the fix."""
    if profile is None or steps is None:
        return None
    first, last = profile.window()
    slowed = last + after
    if slowed > steps:
        return f"profile.steps: {profile.steps} profiles up to step {slowed}{why}, but the point runs {steps} steps"
    if slowed > steps - window:
        room = steps - window - after  # the last profiled step's room; step 1 (warm-up) is better left alone
        count = min(2, room - 1)
        fix = (f"profile earlier steps, e.g. {room - count + 1}:{count}" if room >= 2
               else f"run more steps than the window plus {2 + after} ({steps_key} > {window + 1 + after})")  # fmt: skip
        return (
            f"profile.steps: {profile.steps} reaches step {slowed}{why}, inside the collect window (the last "
            f"{window} of {steps} steps); {fix}"
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
    profile: Profile | None,
    argv: list[str],
    run_dir: Path,
    nsys: str | None = None,
    style: str = "megatron-lm",
) -> list[str]:
    """A command trainer's argv under the campaign's `profile:`. Style megatron-bridge: `bridge_argv`. Else
    `nsys profile ... ARGV --profile --profile-step-start S --profile-step-end E` for a Megatron-style argv (one
    with --train-iters) where nsys is found; the argv unchanged otherwise (a trainer that never calls
    cudaProfilerStart would record nothing)."""
    if profile is not None and style == BRIDGE_STYLE:
        return bridge_argv(profile, argv, run_dir, nsys)
    if profile is None or "--train-iters" not in argv:
        return list(argv)
    prefix = nsys_prefix(profile, run_dir, nsys)
    return [*prefix, *argv, *megatron_args(profile)] if prefix else list(argv)


# ---- Megatron-Bridge (its ConfigContainer's `profiling` section, set by Hydra-style overrides) ----------------
BRIDGE_STYLE = "megatron-bridge"
# Bridge exports its torch trace to <logger.tensorboard_dir>/../torch_profile/rank-<RANK>.json.gz (with the
# directory unset, to the cwd's None/../torch_profile): mbx sets <run dir>/tensorboard, so the trace is
# <run dir>/torch_profile/rank-0.json.gz, where reports/profile_view.py (BRIDGE_TRACE_DIR) looks.
BRIDGE_TENSORBOARD = "tensorboard"
BRIDGE_PROFILING = "profiling"
BRIDGE_TENSORBOARD_KEY = "logger.tensorboard_dir"


def bridge_tool(profile: Profile) -> str:
    """The profiler a Bridge campaign runs: torch (Bridge's own torch.profiler: no nsys needed, auto too) or nsys."""
    return "nsys" if profile.tool == "nsys" else "torch"


def bridge_overrides(profile: Profile, run_dir: Path, tool: str) -> list[str]:
    """Bridge's `profiling.*` overrides for 1-based steps first..last on rank 0.

    torch: Bridge's profiler schedule waits start - 1 steps, warms up 1 and records end - start; its loop calls
    prof.step() before each step, so logged steps start..end-1 are recorded: start = first, end = last + 1 (the
    trace is exported at the prof.step() that begins step last + 1). nsys: cudaProfilerStart before the 0-based
    step == start (logged start + 1), stop after the step that makes the counter end: start = first - 1, end =
    last, as Megatron-LM's switches (`megatron_args`)."""
    first, last = profile.window()
    if tool == "nsys":
        start, end, switches = first - 1, last, ["use_nsys_profiler=true", "use_pytorch_profiler=false"]
    else:
        start, end, switches = first, last + 1, ["use_pytorch_profiler=true", "use_nsys_profiler=false"]
    overrides = [f"{BRIDGE_PROFILING}.{s}" for s in switches]
    overrides += [f"{BRIDGE_PROFILING}.profile_step_start={start}", f"{BRIDGE_PROFILING}.profile_step_end={end}",
                  f"{BRIDGE_PROFILING}.profile_ranks=[0]"]  # fmt: skip
    if tool == "torch":
        overrides.append(f"{BRIDGE_TENSORBOARD_KEY}={Path(run_dir) / BRIDGE_TENSORBOARD}")
    return overrides


def bridge_argv(profile: Profile, argv: list[str], run_dir: Path, nsys: str | None = None) -> list[str]:
    """A Bridge argv with the profiling overrides appended (after every other override: Hydra applies them in
    order); under `nsys profile` for tool nsys where nsys is found (unchanged where it is not)."""
    tool = bridge_tool(profile)
    prefix = nsys_prefix(profile, run_dir, nsys) if tool == "nsys" else []
    if tool == "nsys" and not prefix:
        return list(argv)
    return [*prefix, *argv, *bridge_overrides(profile, run_dir, tool)]


def override_key(item: str) -> str | None:
    """The key path of a Hydra-style override (`a.b=v`, `+a.b=v`, `++a.b=v`, `~a.b`), None for another item."""
    if item.startswith("-") or ("=" not in item and not item.startswith("~")):
        return None
    return item.split("=", 1)[0].lstrip("+~") or None


def owned_keys(profile: Profile | None, style: str) -> tuple[str, ...]:
    """The argv keys `profile:` sets for a command trainer (a campaign may not set them too): Bridge's
    profiling section (and logger.tensorboard_dir for its torch profiler); Megatron-LM's --profile switches
    where mbx may add them (tool auto or nsys)."""
    if profile is None:
        return ()
    if style == BRIDGE_STYLE:
        torch = bridge_tool(profile) == "torch"
        return (BRIDGE_PROFILING, BRIDGE_TENSORBOARD_KEY) if torch else (BRIDGE_PROFILING,)
    return () if profile.tool == "torch" else ("--profile", "--profile-step-start", "--profile-step-end")


def owned_in_argv(profile: Profile | None, style: str, argv: list[str]) -> list[tuple[str, str]]:
    """(key, argv item) of each item of `argv` that sets a key `profile:` sets itself."""
    keys = owned_keys(profile, style)
    found = []
    for item in argv:
        key = override_key(item) if style == BRIDGE_STYLE else item.split("=", 1)[0]
        if key is not None and any(key == k or key.startswith(k + ".") for k in keys):
            found.append((key, item))
    return found


def command_window_problem(
    profile: Profile | None, style: str, steps: int | None, window: int, steps_key: str
) -> str | None:
    """`window_problem` for a command trainer's planned steps: Bridge's torch profiler also slows the step after
    the profiled ones (its trace is written there); style megatron-lm with tool torch profiles nothing."""
    if profile is None or (style != BRIDGE_STYLE and profile.tool == "torch"):
        return None
    if style == BRIDGE_STYLE and bridge_tool(profile) == "torch":
        first, last = profile.window()
        why = f" (Bridge's torch profiler writes the trace of steps {first}..{last} at the start of step {last + 1})"
        return window_problem(profile, steps, window, after=1, why=why, steps_key=steps_key)
    return window_problem(profile, steps, window, steps_key=steps_key)
