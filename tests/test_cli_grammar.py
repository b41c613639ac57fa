"""The one CLI grammar (issues 22 and 34), checked on the real Typer app, every command: one sub-app per noun,
the same short flag for the same thing everywhere, one meaning (one help text) per option name, --workspace/-w
wherever a workspace is read and only for it (the baseline check is --check-baseline), --out/-o the path of what
is written (FILE or DIR), --json on every command that prints a result (parsed for real on a few), an example
in every help, --min-effect and --margin percents, old spellings working with a note, and the MBX_DEBUG hint
only where there is a traceback to show."""

from __future__ import annotations

import json
import pkgutil
from pathlib import Path
from typing import Any

import pytest
import typer
from conftest import ROOT
from typer.core import TyperOption

import orchestrator.cli
from orchestrator.cli.app import DEBUG_HINT, NOUNS, app, run

LM_LOG = ROOT / "tests" / "data" / "megatron" / "logs" / "megatron_lm__attn_bench_sink_te_1gpu_correctness__stdout.log"
QUICKSTART = ROOT / "campaigns" / "quickstart.yaml"
NOT_NOUNS = {"app", "options", "terminal", "status_view"}  # helpers of the CLI, not commands
NO_WORKSPACE = {"schema campaign", "schema recipe", "profile show", "card validate"}  # read files only
ALWAYS_JSON = {"schema campaign", "schema recipe"}  # their output is a JSON Schema: --json would add nothing


def commands(group: Any = None, path: str = "") -> dict[str, Any]:
    """Every leaf command of the real app, by its words (`campaign run`, `compare`)."""
    group = group or typer.main.get_command(app)
    ctx = typer.Context(group)
    found: dict[str, Any] = {}
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        words = f"{path} {name}".strip()
        if hasattr(command, "list_commands"):  # a group (Typer's vendored Click)
            found.update(commands(command, words))
        else:
            found[words] = command
    return found


def options(command: Any) -> list[TyperOption]:
    return [p for p in command.params if isinstance(p, TyperOption)]


def mbx(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of `mbx ARGS` in this process, through the entry point's error handling."""
    capsys.readouterr()
    try:
        run(app, list(args))
        code = 0
    except SystemExit as done:
        code = done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
    out, err = capsys.readouterr()
    return code, out, err


ALL = commands()


def test_the_top_level_is_one_noun_per_cli_module() -> None:
    modules = {m.name for m in pkgutil.iter_modules(orchestrator.cli.__path__)} - NOT_NOUNS
    assert {noun.module for noun in NOUNS.values()} == modules
    assert {words.split()[0] for words in ALL} == set(NOUNS)
    assert len(ALL) >= 21, sorted(ALL)


def test_a_short_flag_means_one_thing_everywhere() -> None:
    meaning: dict[str, set[str]] = {}
    for words, command in ALL.items():
        for option in options(command):
            longs = [o for o in option.opts if o.startswith("--")]
            for short in (o for o in option.opts + option.secondary_opts if not o.startswith("--")):
                meaning.setdefault(short, set()).add(longs[0] if longs else f"? in {words}")
    clashes = {short: longs for short, longs in meaning.items() if len(longs) > 1}
    assert not clashes, clashes
    assert meaning["-p"] == {"--point"} and meaning["-w"] == {"--workspace"} and meaning["-o"] == {"--out"}


def test_workspace_is_spelled_the_same_wherever_one_is_read() -> None:
    for words, command in ALL.items():
        spelled = [o.opts for o in options(command) if "--workspace" in o.opts]
        if words in NO_WORKSPACE:
            assert not spelled, words
        else:
            assert spelled and set(spelled[0]) == {"--workspace", "-w"}, f"{words}: {spelled}"


def test_every_command_that_prints_a_result_has_json_and_an_example() -> None:
    missing_json = [w for w, c in ALL.items() if w not in ALWAYS_JSON and not any("--json" in o.opts for o in options(c))]
    assert not missing_json
    no_example = [w for w, c in ALL.items() if "Example: mbx " not in (c.help or "")]
    assert not no_example


def test_min_effect_is_one_option_a_percent_everywhere() -> None:
    found = {w: o for w, c in ALL.items() for o in options(c) if "--min-effect" in o.opts}
    assert set(found) == {"compare", "bisect", "freeze"}
    assert {o.metavar for o in found.values()} == {"PERCENT"}
    assert all("in percent" in (o.help or "") for o in found.values())


def test_one_option_name_one_meaning_one_help_text() -> None:
    """What differs between commands is the default (`[default: (...)]`) and --out's FILE/DIR, never the help; a
    hidden option is an old spelling, said so."""
    helps: dict[str, dict[str, str]] = {}
    for words, command in ALL.items():
        for option in options(command):
            name = next(o for o in option.opts if o.startswith("--"))
            if option.hidden:
                assert (option.help or "").startswith("Before 20"), f"{words} {name}: a hidden old spelling"
            else:
                helps.setdefault(name, {})[words] = option.help or ""
    meanings = {name: set(by.values()) for name, by in helps.items()}
    assert not {name: by for name, by in helps.items() if len(meanings[name]) > 1}
    assert len([name for name, by in helps.items() if len(by) > 1]) >= 15  # shared names, not one-off ones


def test_out_is_the_path_of_what_is_written_file_or_dir() -> None:
    found = {w: o for w, c in ALL.items() for o in options(c) if "--out" in o.opts}
    assert {w: o.metavar for w, o in found.items()} == {
        "freeze": "DIR", "report": "DIR", "card export": "FILE", "golden export": "FILE"}  # fmt: skip
    assert all(o.show_default for o in found.values())  # each says where its output goes without --out


def test_margin_is_a_percent_everywhere(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    found = {w: o for w, c in ALL.items() for o in options(c) if "--margin" in o.opts}
    assert set(found) == {"freeze", "card export", "card check"}
    assert {o.metavar for o in found.values()} == {"PERCENT"}
    assert all("in percent" in (o.help or "") for o in found.values())
    card = str(tmp_path / "missing.card.yaml")
    code, _, err = mbx(capsys, "card", "check", "c", card, "-w", str(tmp_path), "--margin", "60")
    assert code == 2 and err.strip() == "error: --margin 60: 60 is not a percent in [0, 50]"
    code, _, err = mbx(capsys, "card", "check", "c", card, "-w", str(tmp_path), "--margin", "3x")
    assert code == 2 and "--margin 3x: '3x' is not a number (a percent" in err
    code, _, err = mbx(capsys, "card", "check", "c", card, "-w", str(tmp_path), "--margin", "0.05")  # old: 5%
    assert code == 2 and "note: --margin 0.05 is 0.05% (a percent: 3 is 3%; before 2026-12-06 it was a fraction)" in err


def _with_missing_baseline(tmp_path: Path) -> Path:
    path = tmp_path / "rel.yaml"
    path.write_text(QUICKSTART.read_text(encoding="utf-8") + "\nbaseline: nowhere\n", encoding="utf-8")
    return path


@pytest.mark.parametrize("action", ["validate", "plan"])
def test_workspace_is_only_the_workspace_and_check_baseline_checks(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, action: str
) -> None:
    path, ws = str(_with_missing_baseline(tmp_path)), str(tmp_path / "ws")
    monkeypatch.setenv("MBX_WORKSPACE", ws)  # the workspace, as for every command: no check without asking
    code, _, err = mbx(capsys, "campaign", action, path, "--json")
    assert code == 0 and "baseline" not in err, err
    code, _, err = mbx(capsys, "campaign", action, path, "--check-baseline", "--json")
    assert code == 2 and f"baseline: no campaign named 'nowhere' in workspace {Path(ws).resolve()}" in err
    monkeypatch.delenv("MBX_WORKSPACE")
    code, _, err = mbx(capsys, "campaign", action, path, "-w", ws, "--json")  # the spelling before 2026-12-06
    assert code == 2 and "no campaign named 'nowhere'" in err
    assert "note: --workspace/-w alone checks the baseline as before 2026-12-06; write --check-baseline" in err


def test_freeze_repeats_is_frozen_repeats_the_old_spelling_with_a_note(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    ws = str(tmp_path / "ws")
    code, _, err = mbx(capsys, "freeze", "nothing", "-w", ws, "--repeats", "5")
    assert code == 2 and "note: freeze --repeats is now --frozen-repeats" in err and "no workspace at" in err
    code, _, err = mbx(capsys, "freeze", "nothing", "-w", ws, "--repeats", "5", "--frozen-repeats", "4")
    assert code == 2 and err.strip() == (
        "error: --repeats and --frozen-repeats: give --frozen-repeats only (--repeats is its old name)"
    )


def test_json_output_parses(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, out, _ = mbx(capsys, "campaign", "validate", str(QUICKSTART), "--json")
    assert code == 0 and json.loads(out)["campaign"] == "quickstart"
    code, out, _ = mbx(capsys, "campaign", "plan", str(QUICKSTART), "--json")
    assert code == 0 and len(json.loads(out)) == json.loads(mbx(capsys, "campaign", "validate", str(QUICKSTART),
                                                                 "--json")[1])["cells"]  # fmt: skip
    ws = str(tmp_path / "ws")
    code, out, err = mbx(capsys, "ingest", "past", str(LM_LOG), "-w", ws, "--json")  # the campaign first
    assert code == 0, err
    ingested = json.loads(out)
    assert ingested["campaign"] == "past" and ingested["state"] == "completed"
    code, out, _ = mbx(capsys, "campaign", "list", "-w", ws, "--json")
    assert (code, json.loads(out)) == (0, ["past"])
    code, out, _ = mbx(capsys, "campaign", "status", "past", "-w", ws, "--json")
    assert code == 0 and [c["cell_id"] for c in json.loads(out)["cells"]] == [ingested["cell_id"]]
    code, out, err = mbx(capsys, "campaign", "regate", "past", "-w", ws, "--json")  # progress to stderr
    regated = json.loads(out)
    assert (code, regated["exit_code"], regated["cells"][0]["verdict"]) == (0, 0, "pass") and "judged" in err
    code, out, err = mbx(capsys, "store", "rebuild", "-w", ws, "--json")
    assert code == 0, err
    assert json.loads(out)["campaigns"] == [{"name": "past", "cells": 1, "attempts": 1}]


def test_old_spellings_still_parse(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    ws = str(tmp_path / "ws")
    code, out, err = mbx(capsys, "ingest", str(LM_LOG), "--campaign", "old", "-w", ws, "--json")  # LOG -c NAME
    assert code == 0 and json.loads(out)["campaign"] == "old", err
    code, _, err = mbx(capsys, "ingest", str(LM_LOG), "-w", ws)  # a log where the campaign goes
    assert code == 2 and "the campaign comes first" in err


def test_bad_min_effect_is_one_line_exit_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = mbx(capsys, "freeze", "nothing", "-w", str(tmp_path), "--min-effect", "2,tflops=1")
    assert code == 2 and err.strip() == "error: --min-effect 2,tflops=1: per-metric values apply to `mbx compare` only; give one percent"


def test_bad_input_exits_2_without_the_debug_hint(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, out, err = mbx(capsys, "campaign", "validate", str(tmp_path / "missing.yaml"))
    assert code == 2 and out == ""
    assert err.startswith("error: ") and "missing.yaml" in err and len(err.strip().splitlines()) == 1
    assert "MBX_DEBUG" not in err and "Traceback" not in err


def test_an_internal_error_shows_the_hint_and_mbx_debug_the_traceback(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    broken = typer.Typer()

    @broken.command()
    def crash() -> None:
        {}["missing"]  # a bug: nothing in mbx raises this on purpose

    monkeypatch.delenv("MBX_DEBUG", raising=False)
    with pytest.raises(SystemExit) as done:
        run(broken, [])
    err = capsys.readouterr().err
    assert done.value.code == 1 and "error: internal error: KeyError: 'missing'" in err and DEBUG_HINT in err
    assert "Traceback" not in err
    monkeypatch.setenv("MBX_DEBUG", "1")
    with pytest.raises(KeyError):
        run(broken, [])
