"""Megatron layout checks of command trainers (orchestrator/spec/megatron_layout.py): the argv is read as Megatron-LM
or Megatron-Bridge would, every rule names its flag, the wording is the bundled trainer's, and a command point
that breaks a rule is infeasible (kept and marked; refused under strict expansion)."""

from __future__ import annotations

import pytest

from orchestrator.errors import ConfigError
from orchestrator.spec.campaign import Campaign
from orchestrator.spec.megatron_layout import estimate_args, layout_problems, megatron_args
from orchestrator.trainers import expand
from trainer.memory import estimate_megatron
from trainer.recipe import Recipe
from trainer.recipe import layout_problems as bundled_layout_problems


def flags(**values) -> list[str]:
    """Megatron-LM argv of keyword flags (underscores → dashes; True → a bare flag)."""
    argv = ["python", "pretrain_gpt.py"]
    for name, value in values.items():
        flag = "--" + name.replace("_", "-")
        argv += [flag] if value is True else [flag, str(value)]
    return argv


def problems(world: int, argv: list[str]) -> list[str]:
    args, spelled = megatron_args(argv)
    return layout_problems(args, spelled, world)


def bundled(world: int, **sections) -> list[str]:
    """The bundled trainer's layout problems of a small MoE recipe with these sections."""
    base = {"model": {"vocab_size": 128, "hidden_size": 32, "num_layers": 2, "num_attention_heads": 2,
                      "ffn_hidden_size": 64, "moe": {"num_experts": 4, "top_k": 2, "ffn_hidden_size": 32}}}  # fmt: skip
    return bundled_layout_problems(Recipe.model_validate({**base, **sections}), world)


def tail(problem: str) -> str:
    """A problem without its key path (`key: text` → `text`)."""
    return problem.split(": ", 1)[1]


def test_argv_is_read_as_megatron_and_hydra_read_it():
    args, spelled = megatron_args(
        ["torchrun", "--nproc-per-node=8", "pretrain_gpt.py", "--tensor-model-parallel-size", "2", "--bf16",
         "--moe-layer-freq", "1", "0", "--lr=1e-4", "--", "model.num_moe_experts=64", "+train.global_batch_size=512",
         "model.gated_linear_unit=true", "--tensor-model-parallel-size", "4"]
    )  # fmt: skip
    assert args["tensor-model-parallel-size"] == 4  # the last occurrence wins, as argparse
    assert args["bf16"] is True and args["moe-layer-freq"] == [1, 0] and args["lr"] == 1e-4
    assert args["nproc-per-node"] == 8
    assert args["num-experts"] == 64 and args["global-batch-size"] == 512 and args["swiglu"] is True
    assert spelled["num-experts"] == "model.num_moe_experts"
    assert spelled["global-batch-size"] == "train.global_batch_size"
    assert spelled["tensor-model-parallel-size"] == "--tensor-model-parallel-size"


def test_tp_pp_cp_must_tile_the_world_as_the_bundled_trainer_says():
    (problem,) = problems(1, flags(tensor_model_parallel_size=4, pipeline_model_parallel_size=4))
    assert problem.startswith("parallel (--tensor-model-parallel-size, --pipeline-model-parallel-size): ")
    assert tail(problem) == "world size 1 is not divisible by TP·PP·CP = 4·4·1"
    (same,) = [p for p in bundled(1, parallel={"tensor": 4, "pipeline": 4}) if p.startswith("parallel: ")]
    assert tail(same) == tail(problem)
    assert problems(16, flags(tensor_model_parallel_size=4, pipeline_model_parallel_size=4)) == []


def test_experts_must_divide_by_ep_and_ep_etp_must_fit_dp_cp_tp():
    found = problems(8, flags(num_experts=6, expert_model_parallel_size=4, tensor_model_parallel_size=2))
    assert found == [
        "--num-experts (6) must be divisible by --expert-model-parallel-size (4)"
    ]  # EP·ETP 8 fits 8
    found = problems(8, flags(num_experts=8, expert_model_parallel_size=8, tensor_model_parallel_size=2))
    assert found == ["--expert-model-parallel-size: EP·ETP (8·2 = 16) must divide DP·CP·TP (4·1·2 = 8)"]
    # expert tensor parallelism 1 folds the experts over all eight ranks
    assert problems(8, flags(num_experts=8, expert_model_parallel_size=8, tensor_model_parallel_size=2,
                             expert_tensor_parallel_size=1)) == []  # fmt: skip


def test_global_batch_divisibility_has_the_bundled_wording():
    (problem,) = problems(2, flags(global_batch_size=6, micro_batch_size=2))
    assert problem == "--global-batch-size: 6 is not divisible by micro_batch_size × DP = 2 × 2 = 4"
    (same,) = bundled(2, training={"global_batch_size": 6, "micro_batch_size": 2})
    assert tail(same) == tail(problem)


def test_heads_over_tp_and_layers_over_pp():
    found = problems(8, flags(num_attention_heads=6, num_query_groups=2, tensor_model_parallel_size=4))
    assert found == [
        "--num-attention-heads: 6 is not divisible by TP (4)",
        "--num-query-groups: 2 is not divisible by TP (4)",
    ]
    (layers,) = problems(4, flags(num_layers=6, pipeline_model_parallel_size=4))
    assert layers.startswith("--num-layers: 6 is not divisible by PP (4)")
    uneven = flags(num_layers=6, pipeline_model_parallel_size=4, decoder_first_pipeline_num_layers=3)
    assert problems(4, uneven) == []


def test_virtual_pipeline_rules():
    (few_stages,) = problems(
        2, flags(num_layers=8, pipeline_model_parallel_size=2, num_layers_per_virtual_pipeline_stage=2)
    )
    assert "needs PP > 2 (got PP = 2)" in few_stages
    assert problems(2, flags(num_layers=8, pipeline_model_parallel_size=2, num_layers_per_virtual_pipeline_stage=2,
                             overlap_p2p_comm=True)) == []  # fmt: skip
    (split,) = problems(
        4, flags(num_layers=8, pipeline_model_parallel_size=4, num_layers_per_virtual_pipeline_stage=3)
    )
    assert "the 2 layers of a pipeline stage (num_layers / PP = 8 / 4) are not divisible by 3" in split
    both = problems(4, flags(num_layers=16, pipeline_model_parallel_size=4, num_layers_per_virtual_pipeline_stage=2,
                             num_virtual_stages_per_pipeline_rank=2))  # fmt: skip
    assert any("only one of" in p for p in both)
    (micro,) = problems(4, flags(num_layers=16, pipeline_model_parallel_size=4, num_virtual_stages_per_pipeline_rank=2,
                                 global_batch_size=2, micro_batch_size=1))  # fmt: skip
    assert micro.startswith(
        "--global-batch-size: the interleaved schedule needs at least PP (4) micro-batches"
    )


def test_a_real_moe_layout_passes_and_is_estimated():
    argv = flags(num_layers=32, hidden_size=4096, num_attention_heads=32, group_query_attention=True,
                 num_query_groups=8, seq_length=4096, vocab_size=128256, num_experts=64, moe_router_topk=8,
                 moe_ffn_hidden_size=1024, swiglu=True, bf16=True, tensor_model_parallel_size=1,
                 pipeline_model_parallel_size=4, expert_model_parallel_size=8, micro_batch_size=1,
                 global_batch_size=512, use_distributed_optimizer=True, num_layers_per_virtual_pipeline_stage=4)  # fmt: skip
    assert problems(64, argv) == []
    args = estimate_args(megatron_args(argv)[0], 64)
    assert args is not None and args["world-size"] == 64
    est = estimate_megatron(args)
    assert 1 < est.peak_gib < 139.8
    assert estimate_args(megatron_args(flags(hidden_size=4096))[0], 8) is None  # no model shape: no estimate


def command_campaign(**sweep) -> Campaign:
    return Campaign.model_validate({
        "name": "layout", "trainer": {"kind": "command", "command": ["pretrain_gpt.py"],
                                      "params": {"num_layers": 4, "hidden_size": 256, "num_attention_heads": 8,
                                                 "seq_length": 128, "vocab_size": 1024}},
        "sweep": {"zip": [sweep]},
    })  # fmt: skip


def test_command_points_breaking_a_rule_are_infeasible_or_refused():
    campaign = command_campaign(tensor_model_parallel_size=[1, 4], pipeline_model_parallel_size=[1, 4])
    ok, bad = expand(campaign, strict=False)
    assert ok.infeasible == ()
    (problem,) = bad.infeasible
    assert problem.startswith(
        "point [tensor_model_parallel_size=4, pipeline_model_parallel_size=4]: parallel ("
    )
    assert problem.endswith("world size 1 is not divisible by TP·PP·CP = 4·4·1")
    with pytest.raises(ConfigError) as err:
        expand(campaign)
    assert err.value.problems == [problem]


def test_bridge_overrides_give_an_estimate():
    argv = ["run.py", "model.num_layers=4", "model.hidden_size=1024", "model.num_attention_heads=16",
            "model.num_query_groups=4", "model.seq_length=2048", "model.vocab_size=32000",
            "train.micro_batch_size=1", "train.global_batch_size=8", "mixed_precision=bf16_mixed"]  # fmt: skip
    args, _ = megatron_args(argv)
    assert args["bf16"] is True and args["group-query-attention"] is True
    bf16 = estimate_megatron(estimate_args(args, 1))
    fp32 = estimate_megatron(estimate_args({**args, "bf16": False}, 1))
    assert bf16.parts["parameters"] * 2 == fp32.parts["parameters"]
