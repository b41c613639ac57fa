"""Hostile campaign files and limits: bad bytes, deep nesting, alias bombs, odd paths, huge sweeps, error floods.

Each bad input ends in one `error: file: where: what to do` line (or a counted list) and exit 2, quickly."""

from __future__ import annotations

import copy
import os
import time

import pytest
from conftest import TINY_MOE_RECIPE

from orchestrator.cli.app import shown_problems
from orchestrator.errors import ConfigError
from orchestrator.run.plan_view import plan_text
from orchestrator.spec import sweep
from orchestrator.spec.campaign import Campaign
from orchestrator.spec.yamlio import MAX_DEPTH, load_yaml_text
from orchestrator.trainers import expand


def assert_one_error(result, *needles: str) -> None:
    """Exit 2, no traceback, exactly one `error:` line holding every needle."""
    assert result.returncode == 2, (result.returncode, result.stdout[-2000:], result.stderr[-2000:])
    assert "Traceback" not in result.stdout + result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, result.stderr[-3000:]
    for needle in needles:
        assert needle in errors[0], f"{needle!r} not in {errors[0]!r}"


def tiny(sweep_section: dict | None = None, **over) -> dict:
    data = {"name": "lim", "trainer": {"recipe": copy.deepcopy(TINY_MOE_RECIPE)}, "sweep": sweep_section or {}}
    data.update(over)
    return data


# ---- reading the file ---------------------------------------------------------------------------------------
def test_non_utf8_bytes_name_line_and_byte(mbx, tmp_path):
    path = tmp_path / "c.yaml"
    path.write_bytes(b"name: x\n\xff\n")
    assert_one_error(mbx("campaign", "validate", str(path)), f"{path}: line 2, column 1: not UTF-8 text (byte 0xff)")


@pytest.mark.parametrize("flow", [False, True], ids=["mappings-300", "flow-lists-600"])
def test_deep_nesting_is_refused_not_a_recursion_error(mbx, write_campaign, flow):
    if flow:
        text = "name: x\ndescription: " + "[" * 600 + "]" * 600 + "\n"
    else:
        text = "name: x\ndescription:\n" + "".join("  " * (i + 1) + "a:\n" for i in range(300)) + "  " * 301 + "1\n"
    assert len(text) < 100_000
    assert_one_error(mbx("campaign", "validate", str(write_campaign(text))), f"nested more than {MAX_DEPTH} levels")


def test_nesting_through_aliases_counts(mbx, write_campaign):
    text = "name: x\na0: &a0 " + "[" * 40 + "1" + "]" * 40 + "\n"
    text += "".join(f"a{i}: &a{i} {'[' * 40}*a{i - 1}{']' * 40}\n" for i in range(1, 20))
    assert_one_error(mbx("campaign", "validate", str(write_campaign(text))), "through aliases")


def test_alias_bomb_is_refused_in_a_line(mbx, write_campaign):
    text = "name: x\na: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n"
    for prev, name in zip("abcdefgh", "bcdefghi", strict=True):
        text += f"{name}: &{name} [{', '.join(['*' + prev] * 9)}]\n"
    assert len(text) < 500  # the 456-byte file printed 75 MB of errors
    started = time.monotonic()
    result = mbx("campaign", "validate", str(write_campaign(text)))
    assert time.monotonic() - started < 30
    assert_one_error(result, "aliases (*name) expand the file to", "at most 100,000")
    assert len(result.stderr) < 2000


def test_recursive_alias_is_refused(mbx, write_campaign):
    assert_one_error(mbx("campaign", "validate", str(write_campaign("name: x\nd: &a [1, *a]\n"))),
                     "line 2, column 4: an alias refers to a section that contains it")  # fmt: skip


def test_small_aliases_and_merge_keys_still_work():
    data = load_yaml_text("base: &b {nodes: 2, gpus_per_node: 1}\nresources:\n  <<: *b\n  nodes: 4\nother: *b\n")
    assert data["resources"] == {"nodes": 4, "gpus_per_node": 1}
    assert data["other"] == {"nodes": 2, "gpus_per_node": 1}


def test_directory_fifo_and_device_are_refused(mbx, tmp_path):
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    assert_one_error(mbx("campaign", "validate", str(tmp_path)), f"{tmp_path}: is a directory, not a YAML file")
    assert_one_error(mbx("campaign", "validate", str(fifo), timeout=60), f"{fifo}: is not a regular file")
    assert_one_error(mbx("campaign", "validate", "/dev/zero", timeout=60), "/dev/zero: is not a regular file")


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads a mode-000 file: permissions cannot be tested as root")
def test_unreadable_file(mbx, write_campaign):
    path = write_campaign("name: x\n")
    path.chmod(0)
    assert_one_error(mbx("campaign", "validate", str(path)), "cannot read (Permission denied)")


def test_missing_recipe_file_and_a_directory_as_recipe_file(mbx, write_campaign, tmp_path):
    data = tiny(trainer={"recipe_file": "."})
    assert_one_error(mbx("campaign", "validate", str(write_campaign(data))), "is a directory")


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("name: x\ndescription: " + "9" * 5000 + "\n", "line 2, column 14: cannot read this value"),
        ("name: x\n? [a, b]\n: 1\n", "line 2, column 3: a mapping key must be a string or a number"),
        ("name: x\nlauncher: !!binary aGVsbG8=\n", "line 2, column 11: the YAML tag !!binary is not supported"),
        ("name: x\ndescription: !!set {a, b}\n", "the YAML tag !!set is not supported"),
        ("name: x\x00\n", "line 1, column 8: control character #x0000 is not allowed in YAML"),
    ],
    ids=["5000-digit-int", "list-as-key", "binary", "set", "nul"],
)
def test_values_python_cannot_hold_or_json_cannot_write(mbx, write_campaign, text, needle):
    assert_one_error(mbx("campaign", "validate", str(write_campaign(text))), needle)


def test_a_date_stays_a_string(mbx, write_campaign):
    """YAML 1.1 reads 2026-12-03 as a date, which no JSON (cell ids, plan --json) can hold: it stays text."""
    path = write_campaign("name: x\ntrainer:\n  kind: command\n  command: [echo]\n  params: {start: 2026-12-03}\n")
    result = mbx("campaign", "plan", str(path), "--json")
    assert result.returncode == 0, result.stderr[-2000:]
    assert '"start": "2026-12-03"' in result.stdout


# ---- sweep size ---------------------------------------------------------------------------------------------
def test_huge_axis_is_refused_from_its_length_fast(mbx, write_campaign):
    data = tiny({"axes": {"training.seed": list(range(50_000))}})  # 100,000 values: refused by the YAML limit
    started = time.monotonic()
    result = mbx("campaign", "validate", str(write_campaign(data)))
    assert time.monotonic() - started < 20  # 23.6 s before (100,000 values)
    assert_one_error(result, "sweep: 50,000 cells", "more than the limit of 10,000", "--max-cells 50000")


def test_size_is_counted_before_anything_is_expanded(monkeypatch):
    def boom(*args, **kwargs):
        raise AssertionError("expanded")

    monkeypatch.setattr(sweep, "assignments", boom)
    campaign = Campaign.model_validate(
        tiny({"axes": {"training.seed": list(range(200)), "training.steps": list(range(1, 101))},
              "cells": [{"training.seed": 1}] * 5, "repeats": 3})  # fmt: skip
    )
    assert sweep.cell_count(campaign) == (200 * 100 + 5) * 3
    with pytest.raises(ConfigError, match="60,015 cells"):
        expand(campaign)


def test_max_cells_raises_and_lowers_the_limit():
    campaign = Campaign.model_validate(tiny({"axes": {"training.seed": list(range(12))}, "repeats": 2}))
    assert len(expand(campaign, max_cells=24)) == 24
    with pytest.raises(ConfigError, match="24 cells .* more than the limit of 23"):
        expand(campaign, max_cells=23)


def test_max_cells_flag_and_environment(mbx, write_campaign):
    """Needs `--max-cells` on validate/plan/run (orchestrator/cli/campaign.py, the lead's change)."""
    path = write_campaign(tiny({"axes": {"training.seed": list(range(12))}}))
    assert_one_error(mbx("campaign", "validate", str(path), "--max-cells", "11"), "limit of 11")
    assert_one_error(mbx("campaign", "plan", str(path), env={"MBX_MAX_CELLS": "5"}), "limit of 5")
    assert mbx("campaign", "validate", str(path), "--max-cells", "12").returncode == 0


def test_repeats_have_a_ceiling(mbx, write_campaign):
    result = mbx("campaign", "validate", str(write_campaign(tiny({"repeats": 100_000}))))
    assert_one_error(result, "sweep.repeats: Input should be less than or equal to 1000")


# ---- silent nonsense ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("rules", [[{"model.moe.top_k": [1, 2]}], [{}]], ids=["matches-all", "empty-rule"])
def test_exclude_that_drops_every_point_is_an_error(mbx, write_campaign, tmp_path, rules):
    path = write_campaign(tiny({"axes": {"model.moe.top_k": [1, 2]}, "exclude": rules}))
    assert_one_error(mbx("campaign", "validate", str(path)), "sweep.exclude: the rules exclude every point")
    workspace = tmp_path / "ws"
    result = mbx("campaign", "run", str(path), "--workspace", str(workspace))
    assert_one_error(result, "sweep.exclude")
    assert not workspace.exists()


def test_unknown_launcher_fails_validate(mbx, write_campaign):
    result = mbx("campaign", "validate", str(write_campaign(tiny(launcher="nope"))))
    assert_one_error(result, "launcher: no such launcher 'nope'; known: ", "local")


# ---- error output --------------------------------------------------------------------------------------------
def test_error_output_is_the_first_50_then_a_count(mbx, write_campaign):
    data = tiny({"axes": {"model.moe.top_k": list(range(5, 205))}})  # every top_k > num_experts (4)
    result = mbx("campaign", "validate", str(write_campaign(data)))
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert result.returncode == 2 and len(errors) == 51, result.stderr[-2000:]
    assert errors[-1] == "error: … and 150 more problem(s) (MBX_MAX_ERRORS=0 shows every one)"
    every = mbx("campaign", "validate", str(write_campaign(data)), env={"MBX_MAX_ERRORS": "0"})
    assert len([line for line in every.stderr.splitlines() if line.startswith("error: ")]) == 200


def test_a_long_value_is_quoted_cut(mbx, write_campaign):
    result = mbx("campaign", "validate", str(write_campaign(tiny(name="x" * 100_000))))
    assert_one_error(result, "name: String should match pattern", "…)")
    assert len(result.stderr) < 3000


def test_shown_problems_cuts_long_lines():
    lines = shown_problems(["a" * 5000, "b"], limit=1)
    assert len(lines[0]) == 2000 and lines[0].endswith("…")
    assert lines[1].startswith("… and 1 more problem(s)")


# ---- the plan table -----------------------------------------------------------------------------------------
def test_plan_text_escapes_control_characters_and_cuts_long_values():
    campaign = Campaign.model_validate(tiny({"axes": {"env.FOO": ["a\x1b[2Jb\nc", "y" * 500, "[/x]"]}}))
    text = plan_text(campaign.name, expand(campaign), ["env.FOO"])
    assert "\x1b" not in text and "a\\x1b[2Jb\\nc" in text
    assert "y" * 39 + "…" in text and "y" * 41 not in text
    assert "[/x]" in text and text.startswith("lim: 3 cell(s)")
    assert len({len(line) for line in text.splitlines()[1:3]}) == 1  # header and rule line up


def test_a_huge_file_is_refused_before_parsing(mbx, write_campaign):
    text = "name: x\ndescription: [" + "1, " * 1_500_000 + "1]\n"
    started = time.monotonic()
    assert_one_error(mbx("campaign", "validate", str(write_campaign(text))), "larger than 4 MiB")
    assert time.monotonic() - started < 20


def test_control_characters_in_keys_cannot_forge_output_lines(mbx, write_campaign):
    data = tiny({"axes": {"model.x\nerror: all good\x1b[2J": [1]}})
    result = mbx("campaign", "validate", str(write_campaign(data)))
    assert_one_error(result, "sweep.axes.model.x\\nerror: all good\\x1b[2J: unknown key")
    assert "\x1b" not in result.stderr
