"""Command trainers, pure parts: params rendered in both styles, placeholders, cell ids, schema errors."""

from __future__ import annotations

import pytest

from orchestrator.errors import ConfigError
from orchestrator.spec.campaign import Campaign
from orchestrator.spec.command import (
    TemplateError,
    attempt_argv,
    render_megatron_bridge,
    render_megatron_lm,
)
from orchestrator.trainers import expand

HOSTILE = "a b 'c' \"d\" $(touch /tmp/pwned) `id`; rm -rf / && echo\nnext line {x} ${HOME} *"


def campaign(trainer: dict, sweep: dict | None = None, **extra) -> Campaign:
    return Campaign.model_validate(
        {"name": "c", "trainer": {"kind": "command", **trainer}, "sweep": sweep or {}, **extra}
    )


def test_megatron_lm_style_flags_booleans_lists():
    argv = render_megatron_lm(
        {
            "num_layers": 4,
            "use_mcore_models": True,
            "bf16": False,
            "load": None,
            "moe_layer_freq": [1, 1, 0],
            "empty": [],
            "lr": 1.0e-4,
            "--already-dashed": "x",
            "tokenizer_type": "NullTokenizer",
        }
    )
    assert argv == [
        "--num-layers", "4", "--use-mcore-models", "--moe-layer-freq", "1", "1", "0",
        "--lr", "0.0001", "--already-dashed", "x", "--tokenizer-type", "NullTokenizer",
    ]  # fmt: skip


def test_megatron_lm_style_refuses_sections():
    with pytest.raises(TemplateError, match="flat flag names"):
        render_megatron_lm({"model": {"num_layers": 2}})


def test_megatron_bridge_style_dotted_overrides():
    argv = render_megatron_bridge(
        {
            "model": {
                "moe_flex_dispatcher_num_sms": 16,
                "moe_router_dtype": "fp32",
                "recompute_modules": ["moe_act", "layernorm"],
            },
            "train.train_iters": 50,
            "logger": {"log_interval": 1},
            "comm_overlap": {"tp_comm_overlap": True, "overlap_grad_reduce": False},
            "checkpoint": {"save": None},
        }
    )
    assert argv == [
        "model.moe_flex_dispatcher_num_sms=16", "model.moe_router_dtype=fp32",
        "model.recompute_modules=[moe_act,layernorm]", "train.train_iters=50", "logger.log_interval=1",
        "comm_overlap.tp_comm_overlap=true", "comm_overlap.overlap_grad_reduce=false", "checkpoint.save=null",
    ]  # fmt: skip


def test_template_placeholders_resources_params_env_and_runtime():
    c = campaign(
        {
            "command": [
                "torchrun",
                "--nproc-per-node",
                "{gpus_per_node}",
                "--nnodes={nodes}",
                "pretrain_gpt.py",
                "--save",
                "{run_dir}/ckpt",
                "--chunk",
                "{env.CHUNK}",
                "--tp",
                "{tp}",
                "{{literal}}",
                "${oc.env:X}",
            ],
            "params": {"tp": 2, "num_layers": 4},
        },  # fmt: skip
        resources={"nodes": 2, "gpus_per_node": 8},
        env={"values": {"CHUNK": "128"}},
    )
    (point,) = expand(c)
    argv = point.recipe["argv"]
    # tp is used by a placeholder, so it is not rendered again as --tp 2 at the end
    assert argv[:12] == ["torchrun", "--nproc-per-node", "8", "--nnodes=2", "pretrain_gpt.py", "--save",
                         "{run_dir}/ckpt", "--chunk", "128", "--tp", "2", "{{literal}}"]  # fmt: skip
    assert argv[12:] == ["${oc.env:X}", "--num-layers", "4"]
    final = attempt_argv(argv, "/w/c/x-r0/2", "x-r0", 2)
    assert final[6] == "/w/c/x-r0/2/ckpt" and final[11] == "{literal}" and final[12] == "${oc.env:X}"


def test_params_slot_places_rendered_params():
    c = campaign({"command": ["run.py", "{params}", "--", "tail"], "style": "megatron-bridge",
                  "params": {"model.tensor_model_parallel_size": 2}})  # fmt: skip
    (point,) = expand(c, strict=False)  # TP 2 on a world of 1: infeasible (kept, marked), still rendered
    assert point.recipe["argv"] == ["run.py", "model.tensor_model_parallel_size=2", "--", "tail"]


def test_hostile_values_stay_verbatim_through_both_stages():
    c = campaign(
        {"command": ["prog", "--name", "{run_name}"], "params": {"run_name": HOSTILE, "note": HOSTILE}}
    )
    (point,) = expand(c)
    final = attempt_argv(point.recipe["argv"], "/r", "x", 1)
    assert final == ["prog", "--name", HOSTILE, "--note", HOSTILE]
    bridge = campaign(
        {"command": ["prog"], "style": "megatron-bridge", "params": {"logger": {"name": HOSTILE}}}
    )
    (point,) = expand(bridge)
    assert attempt_argv(point.recipe["argv"], "/r", "x", 1) == ["prog", f"logger.name={HOSTILE}"]


def test_sweep_keys_address_params_resources_env():
    c = campaign(
        {"command": ["prog"], "style": "megatron-bridge",
         "params": {"model": {"moe_flex_dispatcher_num_sms": 16, "num_layers": 2}}},
        {"axes": {"model.moe_flex_dispatcher_num_sms": [8, 24], "params.model.num_layers": [4],
                  "env.NUM_OF_TOKENS_PER_CHUNK_COMBINE_API": [64, 128], "resources.gpus_per_node": [2]}},
    )  # fmt: skip
    points = expand(c)
    assert len(points) == 4 and len({p.cell_id for p in points}) == 4
    first = points[0]
    assert first.recipe["argv"] == ["prog", "model.moe_flex_dispatcher_num_sms=8", "model.num_layers=4"]
    assert first.env == {"NUM_OF_TOKENS_PER_CHUNK_COMBINE_API": "64"}
    assert first.resources["gpus_per_node"] == 2


def test_cell_ids_stable_and_follow_command_env_resources():
    spec = {"command": ["prog", "--out", "{run_dir}"], "params": {"a": 1}}
    one = expand(campaign(spec, {"axes": {"b": [1, 2]}}))
    again = expand(campaign(spec, {"axes": {"b": [1, 2]}}))
    assert [p.cell_id for p in one] == [p.cell_id for p in again]
    other_env = expand(campaign(spec, {"axes": {"b": [1, 2]}}, env={"values": {"X": "1"}}))
    other_res = expand(campaign(spec, {"axes": {"b": [1, 2]}}, resources={"nodes": 2}))
    hinted = expand(
        campaign({**spec, "seq_length": 4096, "log_format": "megatron-lm"}, {"axes": {"b": [1, 2]}})
    )
    assert not {p.cell_id for p in one} & {p.cell_id for p in other_env}
    assert not {p.cell_id for p in one} & {p.cell_id for p in other_res}
    assert [p.cell_id for p in hinted] == [p.cell_id for p in one], "log hints do not change what runs"
    # a param equal to its base value is the same command, hence the same cell
    same = expand(campaign(spec, {"cells": [{"a": 1}]}))
    base = expand(campaign(spec))
    assert same[0].cell_id == base[0].cell_id


def test_planned_steps_from_hint_or_params():
    assert expand(campaign({"command": ["p"], "params": {"train_iters": 30}}))[0].recipe["steps"] == 30
    bridge = campaign(
        {"command": ["p"], "style": "megatron-bridge", "params": {"train": {"train_iters": 20}}}
    )
    assert expand(bridge)[0].recipe["steps"] == 20
    assert (
        expand(campaign({"command": ["p"], "steps": 7, "params": {"train_iters": 30}}))[0].recipe["steps"]
        == 7
    )


@pytest.mark.parametrize(
    ("trainer", "sweep", "message"),
    [
        ({"command": ["p", "{nope}"]}, None, "unknown placeholder {nope}"),
        ({"command": ["p", "--x={lst}"], "params": {"lst": [1, 2]}}, None, "only a whole argv element"),
        ({"command": ["p"], "params": {"model": {"x": 1}}}, None, "flat flag names"),
        ({"command": ["p"]}, {"axes": {"recipe.model.x": [1]}}, "has no recipe"),
        ({"command": ["p"]}, {"axes": {"model.x": [1]}}, "flat flag names"),
        ({"command": ["p"]}, {"axes": {"resources.gpus": [1]}}, "unknown key 'gpus'"),
        ({"command": ["p", "{env.MISSING}"]}, None, "not set in env.values"),
    ],
)
def test_template_errors_are_config_errors(trainer, sweep, message):
    with pytest.raises(ConfigError) as err:
        expand(campaign(trainer, sweep))
    assert message in str(err.value)


def test_schema_errors(mbx, write_campaign):
    path = write_campaign(
        "name: bad\ntrainer:\n  kind: command\n  comand: [x]\n  style: megatron\nretry:\n  on: [infra, flaky]\n"
    )
    result = mbx("campaign", "validate", str(path))
    assert result.returncode == 2
    err = result.stderr
    assert "trainer.command: required key is missing" in err
    assert "trainer.comand: unknown key (did you mean 'command'?)" in err
    assert "trainer.style: must be one of 'megatron-lm' or 'megatron-bridge'" in err
    assert "retry.on: 'flaky' is not a failure class" in err and "Traceback" not in err
    kind = write_campaign("name: bad\ntrainer: {kind: cmd}\n", "kind.yaml")
    result = mbx("campaign", "validate", str(kind))
    assert (
        result.returncode == 2
        and "trainer.kind: must be one of 'bundled', 'command' (got 'cmd')" in result.stderr
    )


def test_dispatcher_template_campaign_validates():
    from conftest import ROOT

    from orchestrator.spec.loader import load_campaign

    path = ROOT / "campaigns" / "megatron_bridge_moe_dispatcher.yaml"
    points = expand(load_campaign(path), path)
    assert len(points) == 12
    envs = {p.env["NUM_OF_TOKENS_PER_CHUNK_COMBINE_API"] for p in points}
    assert envs == {"64", "128"}
    assert all("model.moe_flex_dispatcher_num_sms=" in " ".join(p.recipe["argv"]) for p in points)
    assert all(p.recipe["steps"] == 30 for p in points)
