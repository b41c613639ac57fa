"""The CLI on a login node: --help teaches and imports no torch; validate/plan never import torch either."""

from __future__ import annotations

import subprocess
import sys

from conftest import ROOT

PROBE = """
import sys
sys.argv = ["mbx", *{args!r}]
from orchestrator.cli.app import main
try:
    main()
except SystemExit:
    pass
heavy = sorted(m for m in ("torch", "wandb", "plotly", "submitit", "nemo_run") if m in sys.modules)
print("HEAVY:" + ",".join(heavy))
"""


def probe(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", PROBE.format(args=list(args))], cwd=ROOT, capture_output=True, text=True, timeout=120
    )


def test_help_lists_commands_and_imports_nothing_heavy():
    result = probe("--help")
    assert "campaign" in result.stdout and "report" in result.stdout and "schema" in result.stdout
    assert "HEAVY:\n" in result.stdout, result.stdout[-300:]


def test_campaign_help_teaches_the_commands():
    result = probe("campaign", "--help")
    for command in ("validate", "plan", "run", "status", "resume", "cancel"):
        assert command in result.stdout
    assert "HEAVY:\n" in result.stdout


def test_validate_and_plan_never_import_torch():
    for command in ("validate", "plan"):
        result = probe("campaign", command, str(ROOT / "campaigns" / "quickstart.yaml"))
        assert "torch" not in result.stdout.rsplit("HEAVY:", 1)[1], (command, result.stdout, result.stderr)


def test_schema_campaign_is_json_schema(mbx):
    import json

    result = mbx("schema", "campaign")
    schema = json.loads(result.stdout)
    assert schema["title"] == "Campaign" and "sweep" in schema["properties"]
