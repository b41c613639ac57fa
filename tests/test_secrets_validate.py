"""A secret typed into a campaign is refused at validate (exit 2, the key path named, the value never shown);
campaigns without one validate without loading the scanner's plugins."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml
from conftest import ROOT, run_mbx
from planted_secrets import PLANTED, plant

from orchestrator.errors import ConfigError
from orchestrator.spec.loader import load_campaign

HEX = "0123456789abcdef0123456789abcdef01234567"
HF = "hf_abcdefghijklmnopqrstuvwxyz0123456789"


def _campaign(tmp_path, **extra):
    data = {"name": "sec", "trainer": {"kind": "command", "command": ["python", "train.py"],
                                       "log_format": "megatron-lm"}, **extra}  # fmt: skip
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.mark.parametrize(
    ("extra", "where"),
    [
        ({"env": {"values": {"HF_TOKEN": HF}}}, "env.values.HF_TOKEN"),
        ({"env": {"values": {"NOTE": f"WANDB_API_KEY={HEX}"}}}, "env.values.NOTE"),
        ({"sweep": {"axes": {"env.EXTRA": ["x", "password=hunter2x"]}}}, "sweep.axes.env.EXTRA[1]"),
        ({"description": f"run with AWS_SECRET_ACCESS_KEY={HEX}"}, "description"),
    ],
)
def test_secret_values_are_refused_at_validate(tmp_path, extra, where):
    result = run_mbx("campaign", "validate", str(_campaign(tmp_path, **extra)))
    assert result.returncode == 2, result.stdout + result.stderr
    assert f"{where}: contains" in result.stderr and "env.pass" in result.stderr
    for secret in (HEX, HF, "hunter2x"):
        assert secret not in result.stdout + result.stderr


def test_secret_in_a_command_argv_is_refused(tmp_path):
    path = _campaign(tmp_path)
    data = yaml.safe_load(path.read_text())
    data["trainer"]["command"] += ["--wandb-api-key", HEX]
    path.write_text(yaml.safe_dump(data))
    result = run_mbx("campaign", "validate", str(path))
    assert result.returncode == 2 and "trainer.command[3]: contains" in result.stderr
    assert HEX not in result.stdout + result.stderr


def test_names_and_shas_are_not_secrets(tmp_path):
    path = _campaign(tmp_path, env={"values": {"NCCL_NVLS_ENABLE": "0", "GIT_REV": HEX},
                                    "pass": ["WANDB_API_KEY", "HF_TOKEN"]},
                     description="secrets are passed by name: [/x] [bold]WANDB_API_KEY[/bold]")  # fmt: skip
    result = run_mbx("campaign", "validate", str(path))
    assert result.returncode == 0, result.stdout + result.stderr


def test_validate_of_the_quickstart_does_not_load_detect_secrets():
    code = ("import sys; from orchestrator.cli.app import main; sys.argv = ['mbx', 'campaign', 'validate', "
            f"{str(ROOT / 'campaigns' / 'quickstart.yaml')!r}]\n"
            "try:\n    main()\nexcept SystemExit:\n    pass\n"
            "print('LOADED' if 'detect_secrets' in sys.modules else 'CLEAN')")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.stdout.strip().endswith("CLEAN"), out.stdout + out.stderr


@pytest.mark.parametrize("name", [name for name, (where, _) in PLANTED.items() if where])
def test_each_planted_secret_is_refused_alone(tmp_path, name):
    """Each form the scanner missed, in each field validate skipped (issue 32), refused on its own: its key path
    named, its value never shown (the walk in test_secrets_walk.py runs the CLI on all of them at once)."""
    base = {"name": "sec", "trainer": {"kind": "command", "command": ["python", "train.py", "--x", "1"],
                                       "log_format": "megatron-lm"}}  # fmt: skip
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(plant(base, [name]), sort_keys=False))
    with pytest.raises(ConfigError) as refused:
        load_campaign(path)
    where, value = PLANTED[name]
    assert f"{where}: contains" in str(refused.value) and value not in str(refused.value)


def test_a_planted_secret_is_masked_in_the_schema_messages_too(tmp_path):
    """A field that is both wrong and secret (an unquoted all-digit key where a string belongs): the schema's message
    quotes the masked value."""
    path = tmp_path / "c.yaml"
    path.write_text(f"name: sec\nenv:\n  values:\n    WANDB_API_KEY: {'1234567890' * 4}\n")
    with pytest.raises(ConfigError) as refused:
        load_campaign(path)
    assert "env.values.WANDB_API_KEY: contains" in str(refused.value) and "1234567890" * 4 not in str(refused.value)


def test_a_secret_that_is_a_mapping_key_is_not_shown(tmp_path):
    """A key can be the secret (issue 32's review): the key path in the message is masked too."""
    path = _campaign(tmp_path, env={"values": {HF: "x"}})
    data = yaml.safe_load(path.read_text())
    data["trainer"]["params"] = {"password=hunterKey9": 1}
    path.write_text(yaml.safe_dump(data))
    result = run_mbx("campaign", "validate", str(path))
    assert result.returncode == 2 and "env.values.<redacted>: contains" in result.stderr, result.stderr
    assert "trainer.params.password=<redacted>: contains" in result.stderr
    assert HF not in result.stdout + result.stderr and "hunterKey9" not in result.stdout + result.stderr
