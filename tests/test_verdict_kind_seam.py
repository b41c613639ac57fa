"""A verdict kind is one module of orchestrator/judge/kinds/: dropped in beside parity (here from a temporary folder
joined to the package's path, in a fresh interpreter), the campaign schema and `mbx campaign validate` know its
section, a real run judges it, its part is on the closing line and in the exit code (run, regate, status) and the
point it rules out is rejected by freeze, and nothing else was edited."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import ROOT, TINY_MOE_RECIPE

from orchestrator.judge import verdict_kinds
from orchestrator.judge.kinds.parity import ParityKind

TOY = '''
"""A toy verdict kind: every cell whose label has the `refuse` text fails it."""
from pydantic import BaseModel, ConfigDict
from rich.text import Text
from orchestrator.judge.parts import FAIL, PASS, Part, combine
from orchestrator.judge.verdict_kinds import VerdictKind, register


class Toycheck(BaseModel):
    model_config = ConfigDict(extra="forbid")
    refuse: str


@register
class ToycheckKind(VerdictKind):
    name = "toycheck"
    Section = Toycheck
    description = "A toy check: the cells whose label has `refuse` fail it."

    def judge(self, store, name, campaign):
        refuse = campaign.toycheck.refuse
        return [{"cell": c.cell_id, "label": c.label, "verdict": FAIL if refuse in c.label else PASS}
                for c in store.cells(name)]

    def announce(self, records):
        return [Text(f"toycheck judged {len(records)} cell(s)")]

    def part(self, records):
        verdict = combine(r["verdict"] for r in records)
        refused = sum(r["verdict"] == FAIL for r in records)
        return Part(self.name, verdict, f"toycheck {verdict.upper()}: {refused} of {len(records)} cell(s) refused")

    def blame(self, records):
        return {r["cell"]: (FAIL, f"toycheck FAIL: [{r['label']}] refused") for r in records if r["verdict"] == FAIL}

    def closing_lines(self, records):
        return [f"  toycheck fail: {r['cell']} [{r['label']}]" for r in records if r["verdict"] == FAIL]
'''

SCRIPT = """
import contextlib, io, json, sys
import orchestrator.judge.kinds as kinds
folder, good, bad, workspace = sys.argv[1:]
kinds.__path__.append(folder)  # before the campaign schema is made: it lists the kinds by name
from orchestrator.cli.app import main
from orchestrator.judge import verdict_kinds
from orchestrator.spec.campaign import Campaign

def cli(*args):
    sys.argv, out = ["mbx", *args], io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            main()
        except SystemExit as exit:
            return [exit.code, out.getvalue()]
    return [0, out.getvalue()]

schema = Campaign.model_json_schema()
ws = ["--workspace", workspace]
print("RESULT:" + json.dumps({
    "names": verdict_kinds.names(), "property": schema["properties"].get("toycheck"),
    "validate": cli("campaign", "validate", good), "bad": cli("campaign", "validate", bad),
    "run": cli("campaign", "run", good, *ws, "--no-report"), "regate": cli("campaign", "regate", "toys", *ws),
    "status": cli("campaign", "status", "toys", *ws), "freeze": cli("freeze", "toys", *ws, "--json"),
}))
"""


def test_a_new_verdict_kind_is_one_module(tmp_path: Path, cache_env: dict[str, str]) -> None:
    folder = tmp_path / "more_kinds"
    folder.mkdir()
    (folder / "toycheck.py").write_text(TOY)
    recipe = copy.deepcopy(TINY_MOE_RECIPE)
    recipe["training"]["steps"] = 6
    campaign = {"name": "toys", "trainer": {"recipe": recipe}, "toycheck": {"refuse": "seed=8"},
                "sweep": {"axes": {"training.seed": [7, 8]}}, "collect": {"window": 4},
                "wandb": {"mode": "disabled"}, "env": {"values": {"OMP_NUM_THREADS": "1"}}}  # fmt: skip
    good = tmp_path / "toys.yaml"
    good.write_text(yaml.safe_dump(campaign, sort_keys=False))
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({**campaign, "toycheck": {"refuze": "seed=8"}}, sort_keys=False))
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(folder), str(good), str(bad), str(tmp_path / "ws")],
                          cwd=ROOT, capture_output=True, text=True, timeout=300, env={**_env(), **cache_env})  # fmt: skip
    (line,) = [x for x in proc.stdout.splitlines() if x.startswith("RESULT:")] or [proc.stdout + proc.stderr]
    out = json.loads(line.removeprefix("RESULT:"))
    assert out["names"] == ["parity", "toycheck"]
    assert out["property"]["description"] == "A toy check: the cells whose label has `refuse` fail it."
    assert out["validate"][0] == 0, out["validate"]
    assert out["bad"][0] == 2
    assert "toycheck.refuze: unknown key (did you mean 'refuse'?); allowed: refuse" in out["bad"][1]

    code, text = out["run"]
    assert code == 1, text  # every gate passed: the toy kind alone fails the run
    assert "toycheck judged 2 cell(s)" in text
    closing = next(x for x in text.splitlines() if x.startswith("FAIL 2/2 completed"))
    assert "toycheck FAIL: 1 of 2 cell(s) refused" in closing
    assert "gates PASS: 2 of 2 point(s) passed" in closing
    assert "  toycheck fail: " in text and "[seed=8]" in text
    for command in ("regate", "status"):
        assert "toycheck FAIL: 1 of 2 cell(s) refused" in out[command][1], out[command]
    assert out["regate"][0] == 1

    code, text = out["freeze"]
    frozen = json.loads(text[text.index("{") :])
    assert "seed=7" in frozen["label"], text
    rejected = [r for r in frozen["rejected"] if r["kind"] == "toycheck"]
    assert len(rejected) == 1 and "seed=8" in rejected[0]["label"], frozen["rejected"]


def _env() -> dict[str, str]:
    import os

    return dict(os.environ)


def test_a_verdict_kind_registers_only_from_its_own_module() -> None:
    class Stray(ParityKind):  # defined here, not in orchestrator/judge/kinds/parity.py
        pass

    with pytest.raises(RuntimeError, match=r"must be defined in orchestrator\.judge\.kinds\.parity"):
        verdict_kinds.register(Stray)
    assert type(verdict_kinds.get("parity")) is ParityKind
    with pytest.raises(KeyError, match="no such verdict kind 'nope'; known: parity"):
        verdict_kinds.get("nope")


def test_parity_is_the_campaign_section_it_was(mbx, write_campaign) -> None:
    """Found through the registry, `parity:` is the key it was: in the schema (no title of its own, between
    `software` and `profile`), and an unknown key under it is named with the keys allowed there."""
    from orchestrator.spec.campaign import Campaign

    properties = Campaign.model_json_schema()["properties"]
    assert properties["parity"] == {
        "anyOf": [{"$ref": "#/$defs/Parity"}, {"type": "null"}],
        "default": None,
        "description": "Numerics parity: a toggle whose on/off pairs must train the same.",
    }
    assert list(properties)[-3:] == ["software", "parity", "profile"]
    file = write_campaign({"name": "p", "parity": {"toggle": {"training.seed": [1, 2]}, "tolerence": 1}})
    done = mbx("campaign", "validate", str(file))
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    allowed = "allowed: toggle, pairs, metrics, eval_check, checkpoint"
    assert f"{file}: parity.tolerence: unknown key; {allowed}" in done.stderr, done.stderr
    bad = mbx("campaign", "validate", str(write_campaign({"name": "p", "parity": 3})))
    wrong = "parity: Input should be a valid dictionary or instance of Parity (got 3)"
    assert wrong in bad.stderr, bad.stderr
