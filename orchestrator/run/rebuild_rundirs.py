"""A campaign rebuilt from its run directories alone, for `mbx store rebuild` when its campaign.json is lost.

Each cell directory `<campaign>/<point>-r<repeat>/<n>/` keeps what its newest attempt ran: recipe.yaml (the
bundled trainer's whole recipe; a command's recipe, rendered argv and environment) and launch.json (launcher,
nodes, ranks per node, when). The trainer kind that claims the recipes (`TrainerKind.claims`, else the default
kind) guesses the campaign's `trainer:` section (`TrainerKind.rebuilt`); with it the cells (their recipes,
resources, and as params the recipe keys whose values differ between cells, where the kind sweeps its recipe) and
a campaign spec that sweeps those keys. When expanding that
spec gives back a cell's id, the cell takes the expansion's row (exact label, params, order). What run dirs never
hold is said: the campaign file, its gates and window (defaults used to judge results), environment values of
bundled cells, retry and launcher settings.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from orchestrator import trainers
from orchestrator.rows import DEFAULT_KIND, CellRow
from orchestrator.spec.campaign import Campaign
from trainer import rundir

LOST = "the campaign file, gates and window (results judged with the defaults), retry and launcher settings"


def campaign_dirs(workspace: Path) -> list[Path]:
    """Directories of the workspace that hold run dirs (`<dir>/<cell>/<n>/launch.json`)."""
    found = []
    for directory in sorted(workspace.iterdir()) if workspace.is_dir() else []:
        if directory.is_dir() and not directory.name.startswith(".") and _cell_dirs(directory):
            found.append(directory)
    return found


def _cell_dirs(directory: Path) -> list[Path]:
    return [d for d in sorted(directory.iterdir()) if d.is_dir() and _newest(d) is not None]


def _newest(cell_dir: Path) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """(recipe, launch record) of the newest attempt of a cell that has both readable."""
    numbered = sorted((int(d.name), d) for d in cell_dir.iterdir() if d.name.isdigit() and d.is_dir())
    for _, run_dir in reversed(numbered):
        launch, recipe = rundir.read_launch(run_dir), _read_recipe(run_dir / rundir.RECIPE)
        if isinstance(launch, dict) and isinstance(recipe, dict):
            return recipe, launch
    return None


def _read_recipe(path: Path) -> Any:
    try:
        return yaml.load(path.read_text(encoding="utf-8"), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except (OSError, ValueError, yaml.YAMLError, RecursionError):
        return None


def _flat(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict) and value:
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _swept(recipes: list[dict[str, Any]]) -> dict[str, list[Any]]:
    """Dotted recipe keys whose values differ between cells, with their values in order of appearance."""
    flats = [_flat(r) for r in recipes]
    keys = sorted({k for f in flats for k in f} - {"argv", "env"})
    axes: dict[str, list[Any]] = {}
    for key in keys:
        values: list[Any] = []
        for flat in flats:
            value = flat.get(key)
            if value not in values:
                values.append(value)
        if len(values) > 1 and all(not isinstance(v, (dict, list)) for v in values):
            axes[key] = values
    return axes


def rebuild_from_run_dirs(directory: Path) -> tuple[dict[str, Any], list[CellRow], str]:
    """(campaign record, cells, what could not be recovered) of the campaign in `directory`; ValueError when its
    run dirs do not make a valid campaign."""
    name = directory.name
    found = [(cell_dir.name, *newest) for cell_dir in _cell_dirs(directory) if (newest := _newest(cell_dir))]
    if not found:
        raise ValueError("no run dir with a readable recipe.yaml and launch.json")
    owners = {str(launch.get("campaign")) for _, _, launch in found} - {name}
    if owners:
        raise ValueError(f"its run dirs were launched for campaign {sorted(owners)[0]!r} (a copy?)")
    recipes = [{k: v for k, v in recipe.items() if k != "env"} for _, recipe, _ in found]
    kind = next((k for k in trainers.every_kind().values() if k.claims(recipes)), trainers.get(DEFAULT_KIND))
    guess = kind.rebuilt(recipes)
    axes = _swept(recipes) if guess.sweeps_recipe else {}
    first_launch = found[0][2]
    launcher = str(first_launch.get("launcher") or "local")
    spec: dict[str, Any] = {
        "name": name,
        "trainer": guess.section,
        "resources": {"nodes": int(first_launch.get("nodes") or 1),
                      "gpus_per_node": int(first_launch.get("ranks_per_node") or 1)},
        "launcher": launcher,
    }  # fmt: skip
    if axes:
        spec["sweep"] = {"axes": axes}
    campaign = Campaign.model_validate(spec)  # pydantic's ValidationError is a ValueError
    expanded = _expanded(campaign)
    cells = []
    for ordinal, (cell_id, recipe, launch) in enumerate(found):
        row = expanded.get(cell_id) or _guessed(name, cell_id, recipe, launch, axes, guess.keeps_env, kind.name)
        row.ordinal = ordinal
        cells.append(row)
    times = [float(t) for _, _, launch in found if isinstance(t := launch.get("written_at"), (int, float))]
    record = {"name": name, "source_file": None, "spec": campaign.model_dump(mode="json"), "launcher": launcher,
              "created_at": min(times, default=0.0), "updated_at": max(times, default=0.0)}  # fmt: skip
    labels = "" if all(c.cell_id in expanded for c in cells) else "cell labels, "
    env = "" if guess.keeps_env else "environment values, "
    note = (f"{len(cells)} cell(s) rebuilt from their run directories; not recoverable from them: {labels}{env}"
            f"{LOST}; `mbx campaign run <its file>` restores them")  # fmt: skip
    return record, cells, note


def _expanded(campaign: Campaign) -> dict[str, CellRow]:
    """The rebuilt spec's own cells by id (empty when it does not expand)."""
    from orchestrator.run.store import cell_rows

    try:
        cells = cell_rows(campaign, trainers.expand(campaign, None, None, strict=False))
        return {row.cell_id: row for row in cells}
    except Exception:  # noqa: BLE001 - the run dirs' own recipes are used instead
        return {}


def _guessed(name: str, cell_id: str, recipe: dict[str, Any], launch: dict[str, Any], axes: dict[str, Any],
             keeps_env: bool, kind: str) -> CellRow:  # fmt: skip
    """A cell as its run dir shows it, when the rebuilt spec does not expand to it."""
    point_id, _, repeat = cell_id.rpartition("-r")
    flat = _flat(recipe)
    params = {key: flat.get(key) for key in axes}
    label = ", ".join(f"{key.rsplit('.', 1)[-1]}={value}" for key, value in params.items()) or "base"
    cell_recipe = {k: v for k, v in recipe.items() if k != "env"}
    return CellRow(
        campaign=name, cell_id=cell_id, point_id=point_id or cell_id, repeat=int(repeat) if repeat.isdigit() else 0,
        ordinal=0, label=label, params=params, recipe=cell_recipe,
        resources={"nodes": int(launch.get("nodes") or 1), "gpus_per_node": int(launch.get("ranks_per_node") or 1)},
        env=dict(recipe.get("env") or {}) if keeps_env else {}, trainer_kind=kind,
    )  # fmt: skip
