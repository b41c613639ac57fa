"""What `mbx freeze` writes: the frozen recipe, a campaign file that reproduces it with repeats and portable
gates, FROZEN.md in the shape of a performance PR, and frozen.json."""

from __future__ import annotations

import contextlib
import json
import math
import os
from pathlib import Path
from typing import Any

from orchestrator import trainers
from orchestrator.errors import ConfigError, RunError, UsageError
from orchestrator.judge import verdict_kinds
from orchestrator.judge.freeze import Frozen
from orchestrator.run.disk import DiskFull
from orchestrator.run.outfile import check_target, write_out
from orchestrator.spec.sweep import canonical_json
from orchestrator.spec.yamlio import dump_yaml
from reports import card as cards
from reports import secrets
from reports.gates import interval
from reports.markdown import md_code, md_text

RELATIVE_GATES = ("tflops_rel_baseline_min", "step_time_rel_baseline_max", "loss_rel_baseline_tol")
VERSION_KEYS = (
    "gpu_name",
    "torch",
    "transformer_engine",
    "cuda",
    "driver",
    "nccl",
    "git_sha",
    "container_image",
)


def _values(frozen: Frozen, key: str) -> list[float]:
    found = [r.summary.get(key) for r in frozen.winner.repeats]
    return [float(v) for v in found if isinstance(v, (int, float)) and math.isfinite(v)]


def portable_gates(frozen: Frozen, margin: float | None) -> tuple[dict[str, float], list[str]]:
    """GateSpec limits at the measured values ∓ a margin from the repeats' noise (reports.card), with a line each."""
    figures = {m.name: _values(frozen, m.summary_key) for m in cards.CARD_METRICS if m.gate}
    figures = {k: v for k, v in figures.items() if v and min(v) > 0}
    gates, lines = {}, []
    for name, threshold in cards.thresholds(figures, margin).items():
        key = "min" if "min" in threshold else "max"
        gates[cards.BY_NAME[name].gate] = threshold[key]
        lines.append(f"{cards.BY_NAME[name].gate} = {threshold[key]} (measured {threshold['measured']}, "
                     f"margin {threshold['margin'] * 100:.4g}%: {threshold['basis']})")  # fmt: skip
    return gates, lines


def frozen_campaign(frozen: Frozen, repeats: int, gates: dict[str, float]) -> dict[str, Any]:
    """A campaign that runs only the winner, `repeats` times, gated by the portable gates."""
    spec = json.loads(json.dumps(frozen.spec))
    kept_gates = {k: v for k, v in (spec.get("gates") or {}).items() if k not in RELATIVE_GATES}
    spec.pop("baseline", None)
    for kind in verdict_kinds.names():  # it measures the winner; parity pairs stay with the original
        spec.pop(kind, None)
    spec["name"] = f"{frozen.campaign}-frozen"
    spec["description"] = (f"Frozen from {frozen.campaign} point {frozen.winner.point_id} [{frozen.winner.label}] on "
                           f"{frozen.frozen_at}: {frozen.how}")  # fmt: skip
    if frozen.allowed_failed:
        spec["description"] += f"; frozen despite a failed check: {frozen.allowed_failed}"
    spec["gates"] = {**kept_gates, **gates}
    kind = trainers.get(frozen.trainer_kind)
    spec.update(kind.frozen_sections(frozen.recipe, frozen.resources, frozen.winner.params, repeats))
    return spec


def _stat(frozen: Frozen, key: str, unit: str, digits: str = ".4g") -> str:
    values = _values(frozen, key)
    if not values:
        return "not recorded"
    mean, low, high = interval(values)
    ci = f" (95% CI {low:{digits}}–{high:{digits}})" if len(values) > 1 else ""
    return f"{mean:{digits}} {unit}{ci}".strip()


def _configuration(frozen: Frozen, repeats: int) -> list[str]:
    recipe, resources = frozen.recipe, frozen.resources
    fingerprint = frozen.winner.repeats[0].fingerprint if frozen.winner.repeats else {}
    training, parallel = recipe.get("training") or {}, recipe.get("parallel") or {}
    lines = ["## Frozen configuration", ""]
    gpus = f"{resources.get('nodes', 1)} node(s) × {resources.get('gpus_per_node', 1)} rank(s)"
    lines.append(f"- Hardware/precision: {gpus}, {md_text(fingerprint.get('gpu_name') or 'CPU')}, "
                 f"{md_text(recipe.get('precision') or 'as the command sets it')}")  # fmt: skip
    if training:
        lines.append(f"- Workload: sequence length {training.get('seq_length')}, MBS {training.get('micro_batch_size')}, "
                     f"GBS {training.get('global_batch_size') or 'MBS × DP'}, {training.get('steps')} optimizer steps")  # fmt: skip
    if parallel:
        names = {"tensor": "TP", "pipeline": "PP", "context": "CP", "expert": "EP"}
        lines.append(
            "- Parallelism: " + "/".join(f"{short}{parallel.get(k) or 1}" for k, short in names.items())
        )
    knobs = ", ".join(md_code(f"{k}={v}") for k, v in frozen.winner.params.items()) or "the base recipe"
    lines.append(f"- Swept knobs: {knobs}")
    versions = ", ".join(f"{k} {md_text(fingerprint[k])}" for k in VERSION_KEYS if fingerprint.get(k))
    lines.append(f"- Versions: {versions or 'not recorded'}")
    lines.append(
        f"- Reproduce: {md_code('mbx campaign run campaign.yaml')} ({repeats} repeats, portable gates)"
    )
    return lines


def _performance(frozen: Frozen) -> list[str]:
    repeats = frozen.winner.repeats
    first = repeats[0].summary if repeats else {}
    skipped = sum(int(r.summary.get("skipped_iterations") or 0) for r in repeats)
    nans = sum(int(r.summary.get("nan_iterations") or 0) for r in repeats)
    return ["## Performance result", "",
            f"- Window: steps {first.get('window_first_step')}–{first.get('window_last_step')} "
            f"({first.get('window_steps')} steps; the first step never counts), {len(repeats)} repeat(s)",
            f"- Step time: {_stat(frozen, 'step_time_ms', 'ms')}",
            f"- Model TFLOP/s/GPU: {_stat(frozen, 'tflops_per_gpu', '')}",
            f"- Tokens/s/GPU: {_stat(frozen, 'tokens_per_s_per_gpu', '')}",
            f"- Peak memory: allocated {_stat(frozen, 'peak_alloc_gib', 'GiB')}, reserved "
            f"{_stat(frozen, 'peak_reserved_gib', 'GiB')}",
            f"- Loss: {_stat(frozen, 'first_loss', '')} → {_stat(frozen, 'last_loss', '')}; skipped={skipped}, "
            f"NaN={nans}"]  # fmt: skip


def markdown(frozen: Frozen, repeats: int, gate_lines: list[str]) -> str:
    """FROZEN.md: the winner, how it was chosen, and the PR sections of a frozen performance recipe."""
    w = frozen.winner
    failed = frozen.allowed_failed
    warning = [f"**Frozen despite a failed check**: {md_text(failed)}", ""] if failed else []
    lines = [f"# Frozen: {md_text(frozen.campaign)} point {md_code(w.point_id)} [{md_text(w.label)}]", "", *warning,
             md_text(frozen.how), "", *_configuration(frozen, repeats), "", *_performance(frozen), "",
             "## Validation", "", *[f"- Portable gate: {md_code(line)}" for line in gate_lines], "",
             "## Rejected experiments", ""]  # fmt: skip
    lines += [
        f"- {md_code(r.point_id)} [{md_text(r.label)}] ({r.kind}): {md_text(r.why)}" for r in frozen.rejected
    ]
    if not frozen.rejected:
        lines.append("- none: the campaign had one point")
    return "\n".join(lines) + "\n"


def _write(path: Path, text: str) -> None:
    write_out(path, text, label="--out")


def refuse_secrets(documents: dict[str, Any]) -> None:
    """UsageError naming each file and key path that would hold a secret (reports.secrets), the value masked.

    Refused rather than redacted: campaign.yaml must rerun what was measured, and a masked value would change the
    command it reruns; the fix is the campaign's (a secret goes in env.pass, by name)."""
    found = [f"{name}: {line}" for name, document in documents.items()
             for line in secrets.problems(document, "pass secrets by name (env.pass), never as values")]  # fmt: skip
    if found:
        raise UsageError(["mbx freeze wrote nothing: the frozen files would hold a secret", *found])


def write_frozen(frozen: Frozen, out: Path, repeats: int = 3, margin: float | None = None) -> list[Path]:
    """Write recipe.yaml (bundled), campaign.yaml, FROZEN.md and frozen.json into `out`; the files are scanned
    for secrets and the campaign file is validated before anything is written."""
    from orchestrator.spec.loader import load_campaign

    gates, gate_lines = portable_gates(frozen, margin)
    campaign = frozen_campaign(frozen, repeats, gates)
    files = {"campaign.yaml": dump_yaml(campaign), "FROZEN.md": markdown(frozen, repeats, gate_lines)}
    recipe = trainers.get(frozen.trainer_kind).resolved_recipe(frozen.recipe)
    if recipe is not None:
        files["recipe.yaml"] = dump_yaml(recipe)
    record = {"campaign": frozen.campaign, "point": frozen.winner.point_id, "label": frozen.winner.label,
              "params": frozen.winner.params, "how": frozen.how, "frozen_at": frozen.frozen_at, "gates": gates,
              "allowed_failed": frozen.allowed_failed,
              "fingerprint": frozen.winner.repeats[0].fingerprint if frozen.winner.repeats else {},
              "rejected": [r.__dict__ for r in frozen.rejected]}  # fmt: skip
    files["frozen.json"] = json.dumps(json.loads(canonical_json(record)), indent=2, default=str) + "\n"
    refuse_secrets({"campaign.yaml": campaign, "frozen.json": record, "FROZEN.md": files["FROZEN.md"]})
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out}: is a file, give a directory")
    if out.is_dir():  # every target checked before any is written: whole or nothing
        for name in files:
            check_target(out / name, "--out")
    created = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    try:
        check = out / f".campaign.yaml.check-{os.getpid()}"
        _write(check, files["campaign.yaml"])
        try:
            load_campaign(check)
        except ConfigError as err:
            raise RunError(f"the frozen campaign would not validate (a bug in mbx freeze): {err}") from None
        finally:
            check.unlink(missing_ok=True)
        for name, text in files.items():
            _write(out / name, text)
            written.append(out / name)
    except DiskFull:  # the folder, not a temporary file, named; a folder this call made is removed again
        if created:
            _undo(out, written)
        kept = ", ".join(path.name for path in written)
        done = f"mbx freeze replaced only {kept}" if written and not created else "mbx freeze wrote nothing"
        raise DiskFull(out, done, elsewhere="--out") from None
    return written


def _undo(out: Path, written: list[Path]) -> None:
    """Remove the files this freeze wrote into the folder `out` it made, then the folder (when empty)."""
    for path in written:
        path.unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        out.rmdir()
