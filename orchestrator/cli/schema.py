"""`mbx schema ...`: JSON Schemas of mbx files (campaign files, bundled-trainer recipes)."""

from __future__ import annotations

import json

import typer

from orchestrator.cli.terminal import noun_app

app = noun_app(
    "Print JSON Schemas of mbx files: campaign, recipe (JSON always).\n\n"
    "Example: mbx schema campaign > campaign.schema.json"
)


@app.command("campaign")
def schema_campaign() -> None:
    """JSON Schema of campaign files (for editors and CI linting).

    Example: mbx schema campaign > campaign.schema.json
    """
    from orchestrator.spec.campaign import Campaign

    typer.echo(json.dumps(Campaign.model_json_schema(), indent=2))


@app.command("recipe")
def schema_recipe() -> None:
    """JSON Schema of bundled-trainer recipes (trainer/recipe.py).

    Example: mbx schema recipe > recipe.schema.json
    """
    from orchestrator.spec.campaign import recipe_schema

    typer.echo(json.dumps(recipe_schema(), indent=2))
