"""What the NeMo-Run backends share (nemo-run on Slurm, nemo-run-local): importing NeMo-Run (optional), a batch's
Experiment and its folders."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from launchers.base import LaunchSpec
from launchers.slurm.render import batch_key, safe_name

INSTALL_HINT = (
    "the nemo-run launcher needs NeMo-Run: pip install 'mbx[nemo]' (nemo-run==0.11.1, leptonai==0.27.3)"
)
UNQUOTED = "NeMo-Run writes it unquoted into its job scripts and shell commands"


def require_nemo_run() -> None:
    """Refuse, before anything is written and without importing it, when NeMo-Run is not installed."""
    if importlib.util.find_spec("nemo_run") is None:
        raise RuntimeError(INSTALL_HINT)


def import_nemo_run() -> Any:
    """`nemo_run`, imported only when this backend is used (it is slow to import and optional)."""
    try:
        import nemo_run
    except ImportError as err:
        raise RuntimeError(f"{INSTALL_HINT} ({type(err).__name__}: {err})") from None
    return nemo_run


@contextlib.contextmanager
def inside_experiment(experiment: Any) -> Iterator[Any]:
    """`with experiment:` (NeMo-Run adds and runs tasks only inside an experiment's context), with stdin closed to
    it: NeMo-Run's tunnels (invoke) would otherwise read and forward ours. Quiet with `clean_mode=True`; after a
    detached run, leaving it marks the experiment done, as NeMo-Run's own `with exp: exp.run(detach=True)`."""
    stdin = sys.stdin
    sys.stdin = open(os.devnull)
    try:
        with experiment:
            yield experiment
    finally:
        sys.stdin.close()
        sys.stdin = stdin


def base_dir(workspace: Path, campaign: str) -> Path:
    """Where NeMo-Run keeps a campaign's experiments (without an SSH tunnel's job_dir)."""
    return workspace / campaign / "nemo-run"


def batch_folder(workspace: Path, specs: list[LaunchSpec]) -> Path:
    """The task table's (and pack file's) folder of one Experiment's attempts, in task-table order."""
    return workspace / specs[0].campaign / "slurm" / f"nemo-{batch_key(specs)}"


@contextlib.contextmanager
def experiment_of(workspace: Path, specs: list[LaunchSpec]) -> Iterator[Any]:
    """A batch's Experiment, entered (deterministic id: campaign + batch key), to add its tasks and dry-run or
    run them inside the same context."""
    run = import_nemo_run()
    title = safe_name(f"mbx-{specs[0].campaign}")
    experiment = run.Experiment(
        title, id=f"{title}_{batch_key(specs)}", base_dir=str(base_dir(workspace, specs[0].campaign)),
        clean_mode=True, enable_goodbye_message=False, skip_status_at_exit=True, log_level="WARN",
    )  # fmt: skip
    with inside_experiment(experiment):
        yield experiment
