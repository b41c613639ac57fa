"""Bad campaign files: one clear message naming file, key path and what is allowed; exit 2; nothing written."""

from __future__ import annotations

import copy

import pytest
from conftest import TINY_MOE_RECIPE


def base_campaign(**over):
    data = {
        "name": "bad",
        "trainer": {"kind": "bundled", "recipe": copy.deepcopy(TINY_MOE_RECIPE)},
        "sweep": {"axes": {"model.moe.capacity_factor": [1.0, 2.0]}},
    }
    data.update(over)
    return data


def assert_clean_error(result, *needles: str) -> None:
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr + result.stdout
    for needle in needles:
        assert needle in result.stderr, f"{needle!r} not in:\n{result.stderr}"


@pytest.mark.parametrize("command", ["validate", "plan", "run"])
def test_unknown_top_level_key_names_file_and_suggests(mbx, write_campaign, tmp_path, command):
    path = write_campaign(base_campaign(sweeep={}))
    workspace = tmp_path / "ws"
    args = [command, str(path)] + (["--workspace", str(workspace)] if command == "run" else [])
    result = mbx("campaign", *args)
    assert_clean_error(result, str(path), "sweeep: unknown key (did you mean 'sweep'?)", "allowed: name,")
    assert not workspace.exists(), "a bad file must leave no state behind"


def test_bad_precision_lists_allowed_values(mbx, write_campaign):
    data = base_campaign()
    data["trainer"]["recipe"]["precision"] = "bf17"
    result = mbx("campaign", "validate", str(write_campaign(data)))
    assert_clean_error(result, "trainer.recipe.precision: must be one of", "'bf16'", "'fp8'", "(got 'bf17')")


def test_sweep_key_typo_names_the_axis_and_suggests(mbx, write_campaign):
    data = base_campaign(sweep={"axes": {"model.moe.capcity_factor": [1.0]}})
    result = mbx("campaign", "validate", str(write_campaign(data)))
    assert_clean_error(
        result, "sweep.axes.model.moe.capcity_factor: unknown key 'capcity_factor' in model.moe",
        "did you mean 'capacity_factor'?",
    )  # fmt: skip


def test_yaml_syntax_error_has_line_and_column(mbx, write_campaign):
    path = write_campaign("name: x\nsweep:\n  axes: [1, 2\n")
    assert_clean_error(mbx("campaign", "validate", str(path)), str(path), "line ", "invalid YAML")


def test_duplicate_key_is_refused(mbx, write_campaign):
    path = write_campaign("name: x\nname: y\n")
    assert_clean_error(mbx("campaign", "validate", str(path)), "line 2, column 1: duplicate key 'name'")


def test_zip_groups_must_have_equal_lengths(mbx, write_campaign):
    data = base_campaign(sweep={"zip": [{"model.hidden_size": [32, 64], "model.num_attention_heads": [2]}]})
    assert_clean_error(
        mbx("campaign", "validate", str(write_campaign(data))), "sweep.zip: ", "differ in length"
    )


def test_world_size_must_match_parallel_layout(mbx, write_campaign):
    data = base_campaign()
    data["trainer"]["recipe"]["parallel"] = {"data": 2}
    result = mbx("campaign", "validate", str(write_campaign(data)))
    assert_clean_error(result, "world size 1 ≠ TP·PP·CP·DP = 1·1·1·2 = 2")


def test_unsupported_parallelism_is_rejected_clearly(mbx, write_campaign):
    data = base_campaign(resources={"gpus_per_node": 2})
    data["trainer"]["recipe"]["parallel"] = {"tensor": 2}
    result = mbx("campaign", "validate", str(write_campaign(data)))
    assert_clean_error(result, "parallel.tensor: the bundled trainer supports only tensor = 1 (got 2)")


def test_experts_must_divide_by_expert_parallel(mbx, write_campaign):
    data = base_campaign(resources={"gpus_per_node": 3})
    data["trainer"]["recipe"]["parallel"] = {"expert": 3}
    result = mbx("campaign", "validate", str(write_campaign(data)))
    assert_clean_error(result, "num_experts (4) must be divisible by parallel.expert (3)")


def test_global_batch_must_divide_by_micro_batch_times_dp(mbx, write_campaign):
    data = base_campaign(resources={"gpus_per_node": 2})
    data["trainer"]["recipe"]["training"]["global_batch_size"] = 6
    result = mbx("campaign", "validate", str(write_campaign(data)))
    assert_clean_error(
        result, "training.global_batch_size: 6 is not divisible by micro_batch_size × DP = 2 × 2 = 4"
    )


def test_invalid_point_is_named_by_its_swept_values(mbx, write_campaign):
    data = base_campaign(sweep={"axes": {"model.moe.top_k": [2, 16]}})
    result = mbx("campaign", "validate", str(write_campaign(data)))
    assert_clean_error(
        result, "point [top_k=16]: trainer.recipe.model.moe: top_k (16) must be ≤ num_experts (4)"
    )
    assert "top_k=2]" not in result.stderr


def test_missing_file(mbx, tmp_path):
    missing = tmp_path / "nope.yaml"
    assert_clean_error(mbx("campaign", "validate", str(missing)), f"{missing}: file not found")


def test_bad_gate_and_launcher_values(mbx, write_campaign):
    data = base_campaign(gates={"tflops_per_gpu_min": -1, "step_time_max": 3})
    result = mbx("campaign", "validate", str(write_campaign(data)))
    assert_clean_error(
        result,
        "gates.tflops_per_gpu_min:",
        "gates.step_time_max: unknown key (did you mean 'step_time_ms_max'?)",
    )


def test_unknown_launcher_is_a_usage_error(mbx, write_campaign, tmp_path):
    path = write_campaign(base_campaign())
    result = mbx(
        "campaign", "run", str(path), "--launcher", "warp-drive", "--workspace", str(tmp_path / "ws")
    )
    assert_clean_error(result, "no such launcher 'warp-drive'; known: ", "local")


def test_good_file_validates(mbx, write_campaign):
    result = mbx("campaign", "validate", str(write_campaign(base_campaign())))
    assert result.returncode == 0, result.stderr
    assert "2 point(s) × 1 repeat(s) = 2 cell(s)" in result.stdout


def test_launcher_sections_are_checked_against_the_backends_settings(mbx, write_campaign):
    data = base_campaign(launchers={"local": {"paralel": 2}, "slurmx": {}, "nemo_run": {"bogus": 1}})
    result = mbx("campaign", "validate", str(write_campaign(data)))
    assert_clean_error(
        result,
        "launchers.local.paralel: unknown key (did you mean 'parallel'?); allowed: ",
        "launchers.slurmx: no such launcher; known: ",
        "launchers.nemo_run.bogus: unknown key",
    )


def test_dry_run_is_a_flag_not_a_launcher(mbx, write_campaign):
    result = mbx("campaign", "validate", str(write_campaign(base_campaign(launcher="dry-run"))))
    assert_clean_error(result, "launcher: 'dry-run' is not a backend", "mbx campaign run FILE --dry-run")


def test_params_slot_inside_an_argv_element_is_an_error_not_a_key_error(mbx, write_campaign):
    data = {"name": "cmd", "trainer": {"kind": "command", "command": ["echo", "a{params}"], "params": {"x": 1}}}
    assert_clean_error(
        mbx("campaign", "validate", str(write_campaign(data))),
        "trainer.command: 'a{params}': `{params}` must be a whole argv element",
    )
