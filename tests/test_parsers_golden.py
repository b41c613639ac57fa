"""Golden values (Megatron-LM dict and legacy list schemas, Megatron-Bridge) and Bridge verification cards as reference figures."""

from __future__ import annotations

from pathlib import Path

import pytest

from reports.parsers import read_card, read_golden_values
from reports.window import summarize

DATA = Path(__file__).parent / "data" / "megatron"
GOLDEN = DATA / "golden_values"
BRIDGE = DATA / "bridge"
MOE_RESUME = (
    GOLDEN
    / "moe__gpt3_moe_mcore_te_tp4_ep2_etp2_pp2_resume_torch_dist_dist_optimizer__golden_values_dev_dgx_h100.json"
)
MOE_RESUME_2ND = MOE_RESUME.with_name(MOE_RESUME.stem + "_2nd.json")
MOE_SPEED = GOLDEN / "moe__gpt3_mcore_te_tp2_pp2_ep4_etp1_memory_speed__golden_values_dev_dgx_h100.json"
MIXTRAL = GOLDEN / "mixtral__mixtral_8x7b_alltoall_tp2pp4ep4_release_sm__golden_values_dev_dgx_h100.json"
GPT15B = GOLDEN / "gpt__gpt3_15b_8t_release_sm__golden_values_dev_dgx_h100.json"
LEGACY = GOLDEN / "gpt__gpt3_mcore_tp1_pp2_fp16__golden_values_dev_dgx_a100.json"
BRIDGE_GOLDEN = BRIDGE / "test_deepseek_recipes_pretrain_fsdp_gb200.golden_values.json"
BRIDGE_GOLDEN_OLD = BRIDGE / "test_deepseek_recipes_pretrain_fsdp_gb200.golden_values.at_c7b56f2.json"


def test_megatron_lm_dict_schema() -> None:
    g = read_golden_values(MOE_RESUME)
    assert g.schema == "megatron-lm"
    assert [r["step"] for r in g.rows] == list(range(1, 101))
    assert g.points == {
        "lm loss": 100,
        "num-zeros": 100,
        "mem-allocated-bytes": 100,
        "mem-max-allocated-bytes": 100,
        "iteration-time": 99,
    }
    r1, r2 = g.rows[0], g.rows[1]
    assert r1["loss"] == 10.92486 and r2["loss"] == 10.91069
    assert r1["step_time_ms"] is None  # iteration-time starts at step 2
    assert r2["step_time_ms"] == pytest.approx(8990.25)  # seconds in the file
    assert r1["mem_allocated_gib"] == pytest.approx(628063744 / 2**30)
    assert r2["mem_max_allocated_gib"] == pytest.approx(1143422976 / 2**30)
    assert r1["extra"]["num zeros"] == 6308.0
    assert r1["nan"] is None and r1["skipped"] is None  # a golden file does not say


def test_resumed_run_golden_marks_the_first_half_nan() -> None:
    g = read_golden_values(MOE_RESUME_2ND)
    assert g.missing["lm loss"] == 50 and g.missing["iteration-time"] == 51
    assert [r["step"] for r in g.rows] == list(range(51, 101))
    assert g.rows[0]["loss"] is not None and g.rows[0]["step_time_ms"] is None
    assert all(r["nan"] is None for r in g.rows)  # "nan" means "no value", not a diverged loss


def test_run_that_stopped_early_and_sparse_iteration_time() -> None:
    mixtral = read_golden_values(MIXTRAL)
    assert mixtral.points["lm loss"] + mixtral.missing["lm loss"] == 1193
    assert mixtral.missing["lm loss"] == 930
    assert mixtral.rows[-1]["step"] == 1310 and len(mixtral.rows) == 263
    gpt = read_golden_values(GPT15B)
    assert gpt.missing["lm loss"] == 57 and gpt.points["lm loss"] == 2544
    assert gpt.points["iteration-time"] == 2601 - 2474
    assert len(gpt.series("step_time_ms")) == 127


def test_extra_loss_series() -> None:
    g = read_golden_values(MOE_SPEED)
    assert g.rows[0]["extra"]["mtp_1 loss"] == 11.0765
    assert g.rows[0]["step_time_ms"] == pytest.approx(73100.19)
    assert len(g.series("mtp_1 loss")) == 50
    summary = summarize(g.rows)  # the window skips step 1's 73 s warm-up
    assert summary.window_first_step == 41 and summary.step_time_ms < 5000


def test_legacy_list_schema() -> None:
    g = read_golden_values(LEGACY)
    assert g.schema == "megatron-lm-legacy"
    assert g.series("loss") == dict(
        zip(
            range(0, 50, 5),
            [
                10.83369,
                10.86796,
                10.8992,
                10.86517,
                10.85506,
                10.82693,
                10.6268,
                10.61756,
                10.53014,
                10.24593,
            ],
            strict=True,
        )
    )
    assert sorted(g.series("num zeros")) == [0, 5, 10, 15, 20, 25, 30]  # end_step 33 is not on the grid
    assert g.scalars["iteration_timing_avg"] == pytest.approx(0.11905411764705882)
    assert g.scalars["step_time_ms"] == pytest.approx(119.05411764705882)


def test_bridge_golden_values() -> None:
    g = read_golden_values(BRIDGE_GOLDEN)
    assert g.schema == "megatron-bridge"
    assert [r["step"] for r in g.rows] == list(range(1, 51))  # key "0" is iteration 1
    first = g.rows[0]
    assert first["loss"] == 11.89415 and first["step_time_ms"] == 53048.6 and first["tflops_per_gpu"] == 1.0
    assert g.rows[-1]["loss"] == 8.127562 and g.rows[-1]["tflops_per_gpu"] == 281.6
    assert g.scalars["alloc"] == 81.904 and g.scalars["max_alloc"] == 93.2
    assert g.scalars["mem_max_allocated_gib"] == pytest.approx(93.2e9 / 2**30)
    old = read_golden_values(BRIDGE_GOLDEN_OLD)
    assert old.scalars["max_alloc"] == 89.352 and len(old.rows) == 50


def test_empty_and_foreign_files(tmp_path: Path) -> None:
    (tmp_path / "empty.json").write_text("")
    (tmp_path / "braces.json").write_text("{}")
    (tmp_path / "list.json").write_text("[1, 2]")
    (tmp_path / "other.json").write_text('{"name": "x"}')
    assert read_golden_values(tmp_path / "empty.json").rows == []
    assert read_golden_values(tmp_path / "braces.json").schema == "empty"
    for name in ("list.json", "other.json"):
        with pytest.raises(ValueError):
            read_golden_values(tmp_path / name)


def figure(figures, item: str, metric: str):
    (match,) = [f for f in figures if f.item == item and f.metric == metric]
    return match


def test_qwen3_card() -> None:
    figures = read_card(BRIDGE / "qwen3-30b-a3b.card.yaml")
    f = figure(figures, "pretrain.H100", "last_10_steps_model_tflops_per_gpu_avg")
    assert (f.value, f.gpu, f.status, f.precision) == (199.12, "H100", "verified", "bf16")
    assert (
        figure(figures, "pretrain_performance.GB300", "last_10_steps_model_tflops_per_gpu_avg").value
        == 1030.07
    )
    assert figure(figures, "pretrain.H100", "last_10_steps_step_time_ms_avg").value == 30289.55  # "30289.550"
    point = figure(
        figures, "pretrain_weak_scaling.GB300.points[1]", "last_10_steps_tokens_per_second_per_gpu_avg"
    )
    assert (point.gpu, point.num_gpus, point.global_batch_size, point.status) == (
        "GB300",
        32,
        2048,
        "verified",
    )
    assert point.precision == "fp8_mx"
    assert {f.gpu for f in figures} == {"H100", "GB200", "GB300"}
    assert len(figures) == 14 * 5


def test_gpt_oss_card() -> None:
    figures = read_card(BRIDGE / "gpt-oss-20b.card.yaml")
    assert figure(figures, "pretrain.H100", "last_10_steps_model_tflops_per_gpu_avg").value == 117.01
    assert {f.item for f in figures} == {
        "pretrain.H100",
        "sft.H100",
        "sft_long_context.H100",
        "peft.H100",
        "checkpoint_resume.H100",
    }
