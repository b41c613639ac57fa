"""Log one attempt's step rows, window figures and verdict, and a campaign's outcome, to Weights & Biases (offline
by default)."""

from __future__ import annotations

import logging
import math
import re
import struct
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from reports import secrets
from reports.views import CellView
from reports.wandb_settings import WandbSettings

REDACTED = secrets.MASK
# Config keys whose values are never sent: credentials a recipe should not hold in the first place.
_SECRET_KEY = re.compile(
    r"(^|[_.-])(secret|password|passwd|api_?key|access_?key|private_?key|credentials?|"
    r"auth_?token|access_?token|hf_?token|github_?token|wandb_?key)$|^token$",
    re.IGNORECASE,
)


# The last failure to start an online run in this process, as (time.monotonic(), reason): online
# calls within ONLINE_RETRY_S of it skip at once instead of each waiting out the init timeout.
ONLINE_RETRY_S = 600.0
_online_failure: list[tuple[float, str]] = []


class WandbLogWarning(UserWarning):
    """W&B logging failed; the campaign carries on without it."""


def scrub(config: Any, key: str = "") -> Any:
    """A copy of `config` with the values of secret-looking keys replaced by '<redacted>', and every secret the
    scanner (reports.secrets) finds in a string value masked, whatever its key (`FOO: "hf_…"`, a command line's
    `--wandb-key …`)."""
    if isinstance(config, dict):
        return {
            k: (REDACTED if isinstance(k, str) and _SECRET_KEY.search(k) else scrub(v, str(k)))
            for k, v in config.items()
        }
    if isinstance(config, (list, tuple)):
        return [scrub(v, k) for v, k in zip(config, secrets.item_keys(config, key), strict=True)]
    if isinstance(config, str):
        return secrets.mask(config, secrets.scan_text(config, key=key))
    return config


def _number(value: Any) -> float | int | None:
    """A loggable number (bools as 0/1); None for anything else. NaN and inf are kept: they are findings."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return value
    return None


def step_history(rows: list[dict[str, Any]]) -> list[tuple[int, dict[str, float | int]]]:
    """(step, numeric fields) per step, ascending, the last row of a repeated step winning (W&B needs
    strictly increasing steps)."""
    by_step: dict[int, dict[str, Any]] = {}
    for row in rows:
        step = row.get("step")
        if isinstance(step, int) and not isinstance(step, bool) and step >= 0:
            by_step[step] = row
    out = []
    for step in sorted(by_step):
        fields = {k: n for k, v in by_step[step].items() if (n := _number(v)) is not None}
        fields["step"] = step
        out.append((step, fields))
    return out


JOB_TYPE_MAX = 64  # W&B's limit on job_type


def point_job_type(cell: CellView) -> str:
    """The run's job_type: its point (the knob values, `key=value` by the last key segment, when they fit
    W&B's 64 characters; else the point id), so the runs of one point group together in a campaign's group."""
    short = ",".join(f"{str(k).rsplit('.', 1)[-1]}={v}" for k, v in cell.params.items())
    if not short:
        return "base"
    return short if len(short) <= JOB_TYPE_MAX else cell.point_id[:JOB_TYPE_MAX]


def window_extras(cell: CellView) -> dict[str, Any]:
    """Window figures the summary does not carry: mean `energy_j` (J per step per GPU) over the window's steps,
    and the profiled steps' ms per kernel class (reports/profile_view.py) under profile/."""
    import numpy as np

    from reports.profile_view import breakdown

    out: dict[str, Any] = {}
    first = cell.summary.window_first_step if cell.summary else None
    last = cell.summary.window_last_step if cell.summary else None
    if first is not None and last is not None:
        joules = [r["energy_j"] for r in cell.rows if first <= r.get("step", -1) <= last
                  and isinstance(r.get("energy_j"), (int, float)) and math.isfinite(r["energy_j"])]  # fmt: skip
        if joules:
            out["window/energy_j"] = float(np.mean(joules))
    shares = breakdown(Path(cell.run_dir)) if cell.run_dir else None
    for cls, ms in (shares or {}).items():
        out[f"profile/{cls}_ms"] = ms
    return out


def run_summary(cell: CellView) -> dict[str, Any]:
    """Run summary: state, verdict, failed-gate messages, the window figures under window/ (energy included)
    and the profiled time per kernel class under profile/."""
    summary: dict[str, Any] = {"state": cell.state, "attempt": cell.attempt}
    if cell.reason:
        summary["failure/reason"] = cell.reason
    if cell.failure_class:
        summary["failure/class"] = cell.failure_class
    if cell.gate is not None:
        summary["verdict"] = cell.gate.verdict
        summary["gate/failed"] = [c.message for c in cell.gate.failed]
        summary["gate/checks"] = {c.gate: c.ok for c in cell.gate.checks}
    if cell.summary is not None:
        for key, value in cell.summary.to_dict().items():
            if value is None or (isinstance(value, float) and not math.isfinite(value)):
                continue
            summary[f"window/{key}"] = value
        if cell.summary.step_time_cv is not None:
            summary["window/step_time_cv"] = cell.summary.step_time_cv
    summary.update(window_extras(cell))
    return summary


# ---------------------------------------------------------------- the .wandb file

FLUSH_TIMEOUT_S = 15.0
_BLOCK = 32 * 1024  # the file is a LevelDB-style log of 32 KiB blocks
_FILE_HEADER = 7  # b":W&B", a 2-byte magic, a 1-byte version
_CHUNK_HEADER = struct.Struct("<IHB")  # crc32, length, type: 1 full, 2 first, 3 middle, 4 last


def _raw_records(data: bytes) -> list[bytes]:
    """The serialized records of a .wandb file; a torn record at the end is left out."""
    if data[:4] != b":W&B":
        return []
    records: list[bytes] = []
    pending = b""
    pos = _FILE_HEADER
    while pos + _CHUNK_HEADER.size <= len(data):
        left = _BLOCK - pos % _BLOCK
        if left < _CHUNK_HEADER.size:  # block trailer padding
            pos += left
            continue
        _crc, length, kind = _CHUNK_HEADER.unpack_from(data, pos)
        if length == 0 and kind == 0:  # zero padding to the end of the block
            pos += left
            continue
        chunk = data[pos + _CHUNK_HEADER.size : pos + _CHUNK_HEADER.size + length]
        if len(chunk) < length:
            break
        pos += _CHUNK_HEADER.size + length
        if kind == 1:
            records.append(chunk)
        elif kind == 2:
            pending = chunk
        elif kind == 3:
            pending += chunk
        elif kind == 4:
            records.append(pending + chunk)
            pending = b""
    return records


def read_run_file(path: Path) -> list[Any]:
    """Every record of an offline run's run-<id>.wandb file, as wandb's own protobuf Record objects."""
    from wandb.proto import wandb_internal_pb2

    out = []
    for raw in _raw_records(Path(path).read_bytes()):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(raw)
        out.append(record)
    return out


def _complete(path: Path) -> bool:
    """True once the run file ends with its exit record (wandb writes nothing of note after it)."""
    from wandb.proto import wandb_internal_pb2

    for raw in reversed(_raw_records(path.read_bytes())[-4:]):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(raw)
        if record.WhichOneof("record_type") == "exit":
            return True
    return False


def wait_for_run_file(folder: Path, timeout: float = FLUSH_TIMEOUT_S) -> bool:
    """Wait until the offline run folder's .wandb file holds the exit record; False on timeout."""
    deadline = time.monotonic() + timeout
    while True:
        files = list(Path(folder).glob("run-*.wandb"))
        if files and _complete(files[0]):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)


def _one_line(text: str, limit: int = 400) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _warn(message: str, sink: Callable[[str], None] | None) -> None:
    if sink is not None:
        sink(message)
    else:
        warnings.warn(message, WandbLogWarning, stacklevel=3)


def log_attempt(
    settings: WandbSettings,
    campaign: str,
    cell: CellView,
    config: dict[str, Any],
    workspace_dir: Path,
    *,
    on_warning: Callable[[str], None] | None = None,
) -> str | None:
    """Log one attempt as one W&B run (group = campaign, job_type = point, history = step rows, summary =
    window figures and verdicts); the local run folder (offline) or the run id (online).

    `config` is the resolved recipe and swept parameters; values of secret-looking keys are redacted
    and nothing is read from the environment. Returns None when mode is disabled, or when W&B failed:
    then a one-line message goes to `on_warning` (default: a WandbLogWarning) and the caller carries on.
    After an online run failed to start (no key, no network), online calls in the next ONLINE_RETRY_S
    seconds skip at once with the same message instead of each waiting out the init timeout.
    """
    run_config = scrub(dict(config))
    run_config["mbx"] = {
        "campaign": campaign,
        "cell_id": cell.cell_id,
        "point_id": cell.point_id,
        "repeat": cell.repeat,
        "attempt": cell.attempt,
        "params": scrub(dict(cell.params)),
        "run_dir": cell.run_dir,
    }
    name = f"{campaign}/{cell.cell_id}/a{cell.attempt}"

    def fill(run: Any) -> None:
        run.define_metric("step")
        run.define_metric("*", step_metric="step")
        for step, fields in step_history(cell.rows):
            run.log(fields, step=step)
        run.summary.update(secrets.redact_tree(run_summary(cell)))

    init = {"name": name, "job_type": point_job_type(cell), "config": run_config}
    return _log_run(settings, campaign, init, fill, workspace_dir, on_warning)


OUTCOME_JOB_TYPE = "outcome"


def log_outcome(
    settings: WandbSettings,
    campaign: str,
    outcome: dict[str, Any],
    workspace_dir: Path,
    *,
    on_warning: Callable[[str], None] | None = None,
) -> str | None:
    """Log a campaign's outcome (orchestrator/judge/outcome.py's `to_dict`: verdict, closing line, exit code,
    parts) as one run of the campaign's group, job_type `outcome`, so the W&B summary says the closing line's
    word: `outcome/verdict`, `outcome/closing`, `outcome/exit_code`, `outcome/<part>` (gates, parity, search).
    Returns and warns as `log_attempt` does."""
    summary: dict[str, Any] = {f"outcome/{key}": outcome.get(key) for key in ("verdict", "closing", "exit_code")}
    for name, part in (outcome.get("parts") or {}).items():
        summary[f"outcome/{name}"] = part.get("verdict")
        summary[f"outcome/{name}_text"] = part.get("text")
    init = {"name": f"{campaign}/outcome", "job_type": OUTCOME_JOB_TYPE, "config": {"mbx": {"campaign": campaign}}}
    return _log_run(settings, campaign, init, lambda run: run.summary.update(secrets.redact_tree(scrub(summary))), workspace_dir,
                    on_warning)  # fmt: skip


def _log_run(settings: WandbSettings, campaign: str, init: dict[str, Any], fill: Callable[[Any], None],
             workspace_dir: Path, on_warning: Callable[[str], None] | None) -> str | None:  # fmt: skip
    """One W&B run (`init`: its name, job_type, config) filled by `fill(run)` and finished; offline, wait until
    its file is complete. Any failure is one warning and None, never an exception."""
    if settings.mode == "disabled":
        return None
    what = init["name"]
    if _online_recently_failed(settings, what, on_warning):
        return None
    with _quiet_logging_errors():
        return _logged_run(settings, campaign, init, fill, workspace_dir, on_warning)


@contextmanager
def _quiet_logging_errors() -> Iterator[None]:
    """While wandb runs here, a log record its handlers cannot write (debug.log on a full disk) is dropped, not a
    "--- Logging error ---" traceback on stderr per record (20 of them on one full-disk resume): the failure is
    said once, by the warning of `_logged_run` (or the caller's full-disk line)."""
    before = logging.raiseExceptions
    logging.raiseExceptions = False
    try:
        yield
    finally:
        logging.raiseExceptions = before


def _logged_run(settings: WandbSettings, campaign: str, init: dict[str, Any], fill: Callable[[Any], None],
                workspace_dir: Path, on_warning: Callable[[str], None] | None) -> str | None:  # fmt: skip
    """`_log_run`'s work: start, fill, finish and (offline) wait for the run file; a failure is one warning."""
    what = init["name"]
    run = None
    stage = "start"
    try:
        run = _init_run(settings, campaign, init, workspace_dir)
        stage = "log"
        fill(run)
        # offline: the offline-run-<time>-<id>/ folder holding run-<id>.wandb; online: the run id.
        folder = Path(run.dir).parent
        result = str(folder) if settings.mode == "offline" else str(run.id)
        run.finish()
        run = None
        if settings.mode == "offline":
            # finish() returns before wandb-core has flushed and closed the run file; wait for it.
            stage = "flush"
            if not wait_for_run_file(folder, FLUSH_TIMEOUT_S):
                _warn(
                    f"W&B run file of {what} was not complete after {FLUSH_TIMEOUT_S:.0f} s "
                    f"(wandb may still be writing it): {folder}",
                    on_warning,
                )
        return result
    except Exception as error:  # W&B must never break a campaign
        reason = _one_line(f"{type(error).__name__}: {error}")
        if settings.mode == "online" and stage == "start":
            # No key or no network: every later attempt would wait out init_timeout the same way.
            _online_failure[:] = [(time.monotonic(), reason)]
        _warn(f"W&B logging of {what} failed: {reason}", on_warning)
        return None
    finally:
        if run is not None:
            try:
                run.finish(exit_code=1)
            except Exception:  # already failing: keep the first error
                pass


def _online_recently_failed(
    settings: WandbSettings, what: str, on_warning: Callable[[str], None] | None
) -> bool:
    """Whether an online run failed to start less than ONLINE_RETRY_S ago (then skip at once, with a warning)."""
    if settings.mode != "online" or not _online_failure:
        return False
    since, reason = _online_failure[-1]
    if time.monotonic() - since >= ONLINE_RETRY_S:
        return False
    _warn(
        f"W&B logging of {what} skipped: online W&B failed {time.monotonic() - since:.0f} s ago ({reason})",
        on_warning,
    )
    return True


def _init_run(settings: WandbSettings, campaign: str, init: dict[str, Any], workspace_dir: Path) -> Any:
    """wandb.init for one run of the campaign's group (`init`: name, job_type, scrubbed config): no console
    capture, no metadata, no system sampler."""
    import wandb  # lazy: importing wandb costs about a second

    run_dir = Path(settings.dir) if settings.dir else Path(workspace_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    names = secrets.redact_tree({"project": settings.project, "entity": settings.entity, "group": campaign,
                                 "name": init["name"], "job_type": init["job_type"], "tags": list(settings.tags)})  # fmt: skip
    return wandb.init(
        **names,
        config=init["config"],
        mode=settings.mode,
        dir=str(run_dir),
        reinit="create_new",  # never finish or reuse a run the caller may have open
        settings=wandb.Settings(
            console="off",  # do not capture the caller's stdout/stderr
            silent=True,  # no banner: the caller reports what happened
            x_disable_stats=True,  # no system-metrics sampler process
            x_disable_meta=True,  # no host/argv/git metadata: argv may hold secrets
            x_disable_machine_info=True,
            x_save_requirements=False,
            disable_git=True,
            save_code=False,
            disable_job_creation=True,
            init_timeout=30,  # online without network: fail after 30 s, once per process
        ),
    )
