"""Model verification cards on the login side: `mbx card export` (a point's repeats → a card's performance item
with structured thresholds), `mbx card validate`, and `mbx card check` (a campaign gated by a card)."""

from __future__ import annotations

import datetime as dt
import math
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator import trainers
from orchestrator.errors import UsageError
from orchestrator.judge.freeze import freeze, refuse_ingested
from orchestrator.judge.outcome import Outcome, Part, combine, exit_code
from orchestrator.run.outfile import write_out
from orchestrator.run.regate import PointVerdict, judge_campaign
from orchestrator.run.store import CellRow, Store
from orchestrator.spec.yamlio import dump_yaml, load_yaml_file
from reports import card as cards
from reports.gates import GateSpec
from trainer import rundir

ENVIRONMENT_KEYS = ("torch", "transformer_engine", "cuda", "driver", "nccl", "git_sha", "container_image")
FROZEN_REPEATS = 3  # repeats of the card's reproducing campaign (mbx freeze's default)
SITE_SECTIONS = ("launchers", "wandb")  # the submitting site's settings: not part of what the card measured


@dataclass
class Export:
    """A card document made from one point, the cells it came from, and notes for the user."""

    document: dict[str, Any]
    point_id: str
    cells: list[str]
    notes: list[str] = field(default_factory=list)


def _point_cells(store: Store, campaign: str, ref: str) -> list[CellRow]:
    """The cells of the point `ref` names (a point id, a cell id or a point label)."""
    if store.campaign(campaign) is None:
        known = ", ".join(store.campaign_names()) or "none"
        raise UsageError(f"campaign {campaign!r} is not in the store {store.path} (known: {known})")
    cells = store.cells(campaign)
    hit = next((c for c in cells if ref in (c.cell_id, c.point_id, c.label)), None)
    if hit is None:
        points = sorted({c.point_id for c in cells})
        raise UsageError(f"--point {ref!r}: campaign {campaign!r} has no such point, cell or label "
                         f"(points: {', '.join(points[:20]) or 'none'})")  # fmt: skip
    return [c for c in cells if c.point_id == hit.point_id]


def _repeats(store: Store, campaign: str, cells: list[CellRow]) -> list[tuple[CellRow, dict[str, Any], Path]]:
    """(cell, window summary, run dir) of every completed repeat."""
    latest = store.latest_attempts(campaign)
    done = []
    for cell in cells:
        attempt = latest.get(cell.cell_id)
        if attempt is None or attempt.state != "completed":
            continue
        result = store.result(campaign, cell.cell_id, attempt.attempt)
        if result is not None and result.summary:
            done.append((cell, result.summary, Path(attempt.run_dir)))
    return done


def _precision(recipe: dict[str, Any], run_dir: Path) -> str:
    """The bundled recipe's precision, or a Bridge run's (its resolved config in the run dir), else unknown."""
    if recipe.get("precision"):
        return str(recipe["precision"])
    from orchestrator.spec import bridge_config

    path = run_dir / rundir.BRIDGE_CONFIG
    try:
        return bridge_config.precision(bridge_config.read(path)) if path.is_file() else "unknown"
    except bridge_config.BridgeConfigError:
        return "unknown"


def _gpu(fingerprint: dict[str, Any]) -> str:
    """The card's GPU key: `NVIDIA H200` → H200; no GPU → CPU."""
    name = str(fingerprint.get("gpu_name") or "").replace("NVIDIA", "").strip()
    return name.split()[0] if name else "CPU"


def _figures(summaries: list[dict[str, Any]]) -> dict[str, list[float]]:
    """Card metric → the repeats' values, for the metrics measured (a CPU run's zero GPU memory is left out)."""
    out: dict[str, list[float]] = {}
    for metric in cards.CARD_METRICS:
        values = [s.get(metric.summary_key) for s in summaries]
        found = [float(v) for v in values if isinstance(v, (int, float)) and math.isfinite(v) and v > 0]
        if found and len(found) == len(values):
            out[metric.name] = found
    return out


def _expected(summaries: list[dict[str, Any]], figures: dict[str, list[float]], gates: dict[str, Any]) -> str:
    first = summaries[0]
    avg = {k: sum(v) / len(v) for k, v in figures.items()}
    parts = [f"Over {len(summaries)} repeat(s), steps {first.get('window_first_step')}–"
             f"{first.get('window_last_step')} averaged {avg.get('last_10_steps_step_time_ms_avg', 0):.3f} ms"]  # fmt: skip
    if "last_10_steps_model_tflops_per_gpu_avg" in avg:
        parts.append(f" / {avg['last_10_steps_model_tflops_per_gpu_avg']:.3f} model TFLOP/s/GPU")
    skipped = sum(int(s.get("skipped_iterations") or 0) for s in summaries)
    nans = sum(int(s.get("nan_iterations") or 0) for s in summaries)
    loss = "finite" if all(s.get("loss_finite") for s in summaries) else "NOT finite"
    parts.append(f". LM loss was {loss} from {avg.get('initial_loss', float('nan')):.6g} to "
                 f"{avg.get('final_loss', float('nan')):.6g}, skipped={skipped}, NaN={nans}.")  # fmt: skip
    for name, gate in gates.items():
        bound = gate.get("min", gate.get("max"))
        parts.append(f" Portable gate {name} {'≥' if 'min' in gate else '≤'} {bound} ({gate['basis']}).")
    return "".join(parts)


def _reproduce(frozen: Any, margin: float | None) -> dict[str, Any]:
    """The frozen campaign (the point alone, FROZEN_REPEATS repeats, portable gates) without the site's sections."""
    from orchestrator.judge.freeze_out import frozen_campaign, portable_gates

    gates, _ = portable_gates(frozen, margin)
    spec = frozen_campaign(frozen, FROZEN_REPEATS, gates)
    return {k: v for k, v in spec.items() if k not in SITE_SECTIONS}


def _rejected(frozen: Any) -> list[dict[str, str]]:
    """The alternatives that lost, with the kind and the reason (paths and secrets in a reason masked)."""
    return [{"point": r.point_id, "label": cards.publishable(r.label), "kind": r.kind, "why": cards.publishable(r.why)}
            for r in frozen.rejected]  # fmt: skip


def export_card(
    workspace: Path, campaign: str, ref: str, *, item: str = "pretrain_performance", margin: float | None = None,
    title: str | None = None, allow_failed: str | None = None,
) -> Export:  # fmt: skip
    """A card whose one item is the performance of point `ref` (all its completed repeats), the alternatives
    that lost to it (freeze's reasons) and the frozen campaign that reproduces it (the command runs it). A point
    that failed a check is refused (RunError, exit 1, naming it) unless `allow_failed` says why: then the card
    is unverified and its `failed_check` names the check and the reason."""
    with Store(workspace, create=False) as store:
        record = store.campaign(campaign) or {}
        refuse_ingested(record, campaign, "a card's reproducing campaign")
        cells = _point_cells(store, campaign, ref)
        done = _repeats(store, campaign, cells)
    if not done:
        states = ", ".join(c.cell_id for c in cells)
        raise UsageError(f"--point {ref!r}: no completed repeat to export (cells: {states})")
    summaries = [s for _, s, _ in done]
    window = min(int(s.get("window_steps") or 0) for s in summaries)
    if window < cards.MIN_WINDOW_STEPS:
        raise UsageError(f"--point {ref!r}: its window is {window} step(s); a card's last-10-steps figures need "
                         f"at least {cards.MIN_WINDOW_STEPS} (run more steps, or set collect.window)")  # fmt: skip
    figures = _figures(summaries)
    gates = cards.thresholds(figures, margin)
    fingerprint = rundir.read_fingerprint(done[0][2]) or {}
    cell = done[0][0]
    clean = all(s.get("loss_finite") and not s.get("nan_iterations") for s in summaries)
    # freeze --point's reasons; a point that failed a check: RunError naming it, unless allow_failed says why
    frozen = freeze(workspace, campaign, point=cell.point_id, allow_failed=allow_failed, done="exported as a card")
    reproduce = _reproduce(frozen, margin)
    body: dict[str, Any] = {
        "status": "verified" if clean and frozen.allowed_failed is None else "unverified",
        "precision": _precision(cell.recipe, done[0][2]),
        "command": f"mbx campaign run {reproduce['name']}.yaml",
        "last_verified": dt.date.today().isoformat(),
        "window_steps": window,
        "repeats": len(done),
        "metrics": {k: cards.significant(sum(v) / len(v)) for k, v in figures.items()},
        "thresholds": gates,
        "environment": {k: str(fingerprint[k]) for k in ENVIRONMENT_KEYS if fingerprint.get(k)},
        "expected_result": _expected(summaries, figures, gates),
        "rejected": _rejected(frozen),
        "campaign": reproduce,
    }
    if frozen.allowed_failed:
        body["failed_check"] = cards.publishable(frozen.allowed_failed)
    recipe = trainers.get(cell.trainer_kind).resolved_recipe(cell.recipe)
    if recipe is not None:
        body["recipe"] = recipe
    if cell.recipe.get("argv"):  # an external trainer: its own command line, as its users run it
        argv = cell.recipe.get("argv_as_written") or cell.recipe["argv"]
        body["trainer_command"] = cards.publishable(shlex.join(argv))
    document = {"title": title or campaign, "summary": str((record.get("spec") or {}).get("description") or ""),
                "items": {item: {_gpu(fingerprint): body}}}  # fmt: skip
    notes = [f"{len(cells) - len(done)} of {len(cells)} repeats did not complete and are left out"] if len(
        done) < len(cells) else []  # fmt: skip
    if frozen.allowed_failed:
        notes.append(f"the card is unverified: {frozen.allowed_failed}")
    notes.append(f"`campaign` is the frozen campaign (this point, {FROZEN_REPEATS} repeats, portable gates); save "
                 f"it as {reproduce['name']}.yaml, add your launchers: section, and the command reruns it")  # fmt: skip
    problems = cards.card_problems(document)
    if problems:
        raise UsageError(["the exported card would not validate:", *problems])
    return Export(document, cell.point_id, [c.cell_id for c, _, _ in done], notes)


def write_card(document: dict[str, Any], out: Path) -> None:
    """Write a card as YAML, atomically; a path that cannot be written → UsageError."""
    write_out(
        out,
        "# Model verification card (performance item written by `mbx card export`).\n" + dump_yaml(document),
    )


def read_card(path: Path) -> dict[str, Any]:
    """A card file that validates; every problem (unreadable, not YAML, invalid) → UsageError naming the file."""
    document = load_yaml_file(Path(path))
    problems = cards.card_problems(document)
    if problems:
        raise UsageError([f"{path}: {p}" for p in problems])
    return document


@dataclass
class Checked:
    """`mbx card check`: the card item used, its gates, notes, and each point's verdict."""

    item: str
    spec: GateSpec
    notes: list[str]
    points: list[PointVerdict]

    @property
    def verdict(self) -> str:
        """The points' verdicts combined (orchestrator/judge/outcome.py): fail, pass, or inconclusive (an
        interval across a threshold, nothing finished)."""
        return combine(p.verdict for p in self.points)

    def exit_code(self, inconclusive_ok: bool = False) -> int:
        return exit_code(self.verdict, inconclusive_ok)

    def outcome(self, campaign: str, card: str) -> Outcome:
        """The one closing line's outcome: `WORD CAMPAIGN against CARD: N point(s)` (an inconclusive one says how
        it exits, as every closing line)."""
        return Outcome("", (Part("card", self.verdict, f"{campaign} against {card}: {len(self.points)} point(s)"),))


def pick_item(document: dict[str, Any], wanted: str | None) -> tuple[str, dict[str, Any]]:
    """The measured item `wanted` names (a key path such as items.pretrain.H100, or its tail); the only one if
    None."""
    items = list(cards.measured_items(document["items"]))
    if wanted is not None:
        hits = [(p, i) for p, i in items if p == wanted or p.endswith("." + wanted.removeprefix("items."))]
    else:
        hits = items
    if len(hits) == 1:
        return hits[0]
    names = ", ".join(p for p, _ in items)
    what = (
        f"--item {wanted!r} names {len(hits)} items"
        if wanted
        else f"the card has {len(items)} measured items"
    )
    raise UsageError(f"{what}; choose one with --item (items: {names})")


def check_card(
    card_file: Path, workspace: Path, campaign: str, *, item: str | None = None, margin: float = 0.05,
    points: tuple[str, ...] = (),
) -> Checked:
    """Every point of `campaign` (or those `points` name: a point id, label or cell id each) judged from all its
    repeats against the card item's thresholds; an item with no structured thresholds is gated at its measured
    values with `margin`."""
    document = read_card(card_file)
    path, chosen = pick_item(document, item)
    notes = []
    if not chosen.get("thresholds"):
        chosen = cards.add_thresholds(chosen, margin)
        notes.append(f"{path} has no structured thresholds: gating at its measured values with a "
                     f"{margin * 100:.4g}% margin (--margin)")  # fmt: skip
    spec, skipped = cards.gate_spec(chosen)
    notes += skipped
    if spec == GateSpec():
        raise UsageError(f"{card_file}: {path} gives no threshold mbx can gate")
    with Store(workspace, create=False) as store:
        if store.campaign(campaign) is None:
            known = ", ".join(store.campaign_names()) or "none"
            raise UsageError(f"campaign {campaign!r} is not in the store {store.path} (known: {known})")
        wanted = {_point_cells(store, campaign, ref)[0].point_id for ref in points}  # each named point, once
        judged = judge_campaign(store, campaign, spec, None)
    return Checked(path, spec, notes, [v for v in judged.points if v.point_id in wanted] or judged.points)
