"""A trainer kind is one module of orchestrator/trainers/kinds/: dropped in beside the shipped ones (here from a
temporary folder joined to the package's path, in a fresh interpreter), the campaign schema, `mbx campaign
validate` and `plan`, expansion and a lost campaign's rebuild all know it, and nothing else was edited."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

from orchestrator.spec.trainer_section import TrainerSection
from orchestrator.trainers import registry
from orchestrator.trainers.kinds.bundled import BundledKind

TOY = '''
"""A toy trainer kind: `python -c CODE` on every rank."""
from typing import Any, Literal
from orchestrator.spec.campaign import Campaign
from orchestrator.spec.sweep import ResolvedPoint
from orchestrator.spec.trainer_section import TrainerSection
from orchestrator.trainers.base import Rebuilt, TrainerKind
from orchestrator.trainers.registry import register


class ToyTrainer(TrainerSection):
    kind: Literal["toy"]
    code: str


@register
class ToyKind(TrainerKind):
    name = "toy"
    Section = ToyTrainer

    def key_problems(self, campaign, locations):
        return [f"{where}: a toy sweeps only `code`" for where, key in locations if key != "code"]

    def resolver(self, campaign, campaign_file):
        def resolve(assignment, where):
            code = assignment.get("code", campaign.trainer.code)
            return ResolvedPoint({"toy_code": code}, campaign.resources.model_dump(), {},
                                 {"trainer": self.name, "code": code})
        return resolve

    def args(self, cell, run_dir, attempt):
        return ["-c", cell.recipe["toy_code"]]

    def planned_steps(self, cell):
        return None

    def claims(self, recipes):
        return all("toy_code" in recipe for recipe in recipes)

    def rebuilt(self, recipes):
        return Rebuilt({"kind": self.name, "code": recipes[0]["toy_code"]}, sweeps_recipe=False, keeps_env=False)
'''

SCRIPT = """
import json, sys
from pathlib import Path
import orchestrator.trainers.kinds as kinds
folder, good, bad, lost = sys.argv[1:]
kinds.__path__.append(folder)
from orchestrator.cli.app import main
from orchestrator import trainers
from orchestrator.run.rebuild_rundirs import rebuild_from_run_dirs
from orchestrator.spec.campaign import Campaign
from orchestrator.spec.loader import load_campaign

def cli(*args):
    sys.argv = ["mbx", *args]
    try:
        main()
    except SystemExit as exit:
        return exit.code
    return 0

out = {"names": trainers.names(), "validate": cli("campaign", "validate", good),
       "plan": cli("campaign", "plan", good), "bad": cli("campaign", "validate", bad)}
campaign = load_campaign(Path(good))
out["kinds"] = sorted({p.trainer_kind for p in trainers.expand(campaign)})
out["schema"] = sorted(Campaign.model_json_schema()["$defs"])
record, cells, note = rebuild_from_run_dirs(Path(lost))
out["rebuilt"] = [record["spec"]["trainer"], sorted({c.trainer_kind for c in cells})]
print("RESULT:" + json.dumps(out))
"""


def test_a_new_trainer_kind_is_one_module(tmp_path: Path) -> None:
    from trainer import rundir

    folder = tmp_path / "more_kinds"
    folder.mkdir()
    (folder / "toy.py").write_text(TOY)
    good = tmp_path / "toy.yaml"
    good.write_text(
        "name: toys\ntrainer: {kind: toy, code: 'print(1)'}\n"
        "sweep: {axes: {code: ['print(1)', 'print(2)']}}\n"
    )
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: toys\ntrainer: {kind: toy, cod: 'print(1)'}\n")
    lost = tmp_path / "ws" / "lost"
    run_dir = lost / "abc-r0" / "1"
    run_dir.mkdir(parents=True)
    rundir.write_launch(run_dir, {"campaign": "lost", "launcher": "local", "written_at": 1.0})
    (run_dir / rundir.RECIPE).write_text("toy_code: print(3)\n")
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(folder), str(good), str(bad), str(lost)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    (line,) = [x for x in proc.stdout.splitlines() if x.startswith("RESULT:")] or [proc.stdout + proc.stderr]
    out = json.loads(line.removeprefix("RESULT:"))
    assert out["names"] == ["bundled", "command", "toy"]
    assert (out["validate"], out["plan"], out["bad"]) == (0, 0, 2)
    assert "trainer.cod: unknown key (did you mean 'code'?); allowed: kind, code" in proc.stdout + proc.stderr
    assert out["kinds"] == ["toy"]
    assert "ToyTrainer" in out["schema"]
    assert out["rebuilt"] == [{"kind": "toy", "code": "print(3)"}, ["toy"]]


def test_a_kind_registers_only_from_its_own_module_with_its_own_section() -> None:
    class Stray(BundledKind):  # defined here, not in orchestrator/trainers/kinds/bundled.py
        pass

    with pytest.raises(RuntimeError, match=r"must be defined in orchestrator\.trainers\.kinds\.bundled"):
        registry.register(Stray)

    class Loose(TrainerSection):
        pass

    class Misnamed(BundledKind):
        Section = Loose

    Misnamed.__module__ = "orchestrator.trainers.kinds.bundled"
    with pytest.raises(RuntimeError, match=r"Section must have `kind: Literal\['bundled'\]`"):
        registry.register(Misnamed)
    assert type(registry.get("bundled")) is BundledKind
