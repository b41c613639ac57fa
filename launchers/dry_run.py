"""dry-run backend: a Slurm backend's render(), written and printed (job scripts, submit commands); nothing is submitted."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import Field

from launchers import registry
from launchers.base import JobState, Launcher, LauncherSettings, LaunchSpec, Rendered, Submitted
from launchers.registry import register
from launchers.slurm_common import SlurmRendered, batch_key, describe, write_files

DRY_RUN_REASON = "dry run: job script rendered, nothing submitted"


class DryRunSettings(LauncherSettings):
    """Settings of the dry-run backend (`launchers.dry-run` in a campaign)."""

    backend: Literal["submitit", "nemo-run"] = Field(
        "submitit",
        description="Whose scripts to render; that backend's own settings (launchers.<name>) apply.",
    )
    print_scripts: bool = Field(True, description="Print every job script and submit command to stdout.")


@register
class DryRunLauncher(Launcher):
    """Delegates render() to the named Slurm backend; launch() writes and prints instead of submitting.

    Each attempt is recorded as cancelled with reason "dry run: ..." (the engine records every attempt it
    submits), and its run dir gets a status.json saying so.
    """

    name = "dry-run"
    Settings = DryRunSettings
    dry_run: ClassVar[bool] = True  # for an engine that renders and shows without recording attempts

    def __init__(self, settings: DryRunSettings | None, workspace: Path, cluster: Any = None):
        super().__init__(settings, workspace, cluster)
        backend = registry.get(self.settings.backend)
        launchers = getattr(cluster, "launchers", {}) or {}
        raw = launchers.get(backend.name, launchers.get(backend.name.replace("-", "_"), {}))
        self.inner: Launcher = backend(backend.Settings.model_validate(raw), workspace, cluster)
        self.printed: list[str] = []

    def render(self, specs: list[LaunchSpec]) -> list[Rendered]:
        return self.inner.render(specs)

    def show(self, rendered: Rendered) -> Path:
        """Write the job scripts where the real submit would (plus a summary file) and print them; no state."""
        scripts = rendered.scripts if isinstance(rendered, SlurmRendered) else {}
        write_files(rendered.files)
        write_files({p: t for p, t in scripts.items() if p not in rendered.files})
        text = describe(rendered) if isinstance(rendered, SlurmRendered) else rendered.description
        name = f"{self.settings.backend}-{batch_key(rendered.specs)}.txt"
        out = Path(self.workspace) / rendered.specs[0].campaign / "dry-run" / name
        write_files({out: text})
        self.printed.append(text)
        if self.settings.print_scripts:
            print(
                f"# dry run ({self.settings.backend}): {len(rendered.specs)} attempt(s), also in {out}",
                flush=True,
            )
            print(text, flush=True)
        return out

    def launch(self, rendered: Rendered) -> list[Submitted]:
        """show(), then mark every attempt cancelled ("dry run") in its run dir: the engine records attempts."""
        out = self.show(rendered)
        scripts = rendered.scripts if isinstance(rendered, SlurmRendered) else {}
        first_script = str(next(iter(scripts), "")) or None
        key = batch_key(rendered.specs)
        submitted = []
        for index, spec in enumerate(rendered.specs):
            _write_status(spec.run_dir, first_script)
            info = {"run_dir": str(spec.run_dir), "argv": rendered.submit_argv, "script": first_script,
                    "dry_run": str(out)}  # fmt: skip
            submitted.append(Submitted(spec.cell_id, spec.attempt, f"dry-run-{key}-{index}", info))
        return submitted

    def poll(self, jobs: list[Submitted]) -> dict[str, JobState]:
        return {job.job_id: JobState.CANCELLED for job in jobs}

    def cancel(self, jobs: list[Submitted]) -> None:
        return None

    def exit_info(self, job: Submitted) -> dict[str, Any]:
        return {"reason": DRY_RUN_REASON}


def _write_status(run_dir: Path, script: str | None) -> None:
    import json
    import os

    run_dir.mkdir(parents=True, exist_ok=True)
    data = {
        "state": "cancelled",
        "reason": DRY_RUN_REASON + (f" ({script})" if script else ""),
        "written_by": "dry-run",
    }
    tmp = run_dir / "status.json.tmp"
    tmp.write_text(json.dumps(data, indent=2))
    os.replace(tmp, run_dir / "status.json")
    (run_dir / "exit.json").write_text(json.dumps({"exit_code": None, "dry_run": True}))
