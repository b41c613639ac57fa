"""The one secret scanner (reports/secrets.py: detect-secrets' plugins plus mbx's rules), both ways: every secret
of issues 21 and 23 is caught by the real `mbx card validate` (exit 2, the value masked in the message), and
markup, SHAs, hashes, paths, numbers, model names and names-without-values are not; W&B configs, summary.md and
the report pages mask what it finds; `card validate` no longer calls a markup tag an absolute path."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from reports import secrets
from reports.card import card_problems
from reports.markdown import md_code, md_description, md_text
from reports.wandb_log import REDACTED, scrub

W_KEY = "0123456789abcdef0123456789abcdef01234567"  # 40 hex, a W&B API key's shape
HF = "hf_abcdefghijklmnopqrstuvwxyzABCDEFGH12"
AWS_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
NGC = "nvapi-AbCdEfGhIjKlMnOpQrStUvWxYz0123456789_-abcdefghijkl"
SHA = "6cee5e81ee83917806bbde320786a8fb61efebee"

SECRETS = [  # (text, the secret value in it)
    (f"WANDB_API_KEY={W_KEY} python train.py", W_KEY),
    (f"HF_TOKEN={HF} torchrun x.py", HF),
    ("HF_TOKEN=abcdefgh12345678 torchrun x.py", "abcdefgh12345678"),
    (f"AWS_SECRET_ACCESS_KEY={AWS_SECRET} aws s3 cp", AWS_SECRET),
    ("AWS_ACCESS_KEY_ID=AKIAIOSFODNN7EXAMPLE", "AKIAIOSFODNN7EXAMPLE"),
    (f"NGC_API_KEY={NGC} docker pull", NGC),
    (f"./train.sh --wandb-key {W_KEY}", W_KEY),
    (f"./train.sh --wandb-api-key {W_KEY}", W_KEY),
    (f"./train.sh --wandb-api-key={W_KEY}", W_KEY),
    ("./train.sh --token abcdefghijkl1234", "abcdefghijkl1234"),
    ("./train.sh --password hunter2", "hunter2"),
    ("mysql password=hunter2", "hunter2"),
    ('db password: "hunter2"', "hunter2"),
    ("export DB_PASSWORD='s3cr3t'", "s3cr3t"),
    ("key sk-proj-abcdefghijklmnopqrstuvwxyz0123456789", "sk-proj-abcdefghijklmnopqrstuvwxyz0123456789"),
    (f"pulled with {NGC}", NGC),
    (f"token in the log: {HF}", HF),
    ("git clone https://alice:pa55word@example.com/r.git", "pa55word"),  # detect-secrets' BasicAuthDetector
    ("export GITHUB_TOKEN=ghp_abcdefghijklmnopqrstuvwxyz0123456789", "ghp_abcdefghijklmnopqrstuvwxyz0123456789"),
]
NOT_SECRETS = [
    "[/x]",
    "a description with [bold]markup[/bold], [/] and [/red] tags",
    f"--hf-revision {SHA}",
    f"git_sha: {SHA}",
    f"commit={SHA}",
    f'"{SHA}"',
    "a3f9c0e1b2d4f6a8c0e2b4d6f8a0c2e4b6d8f0a2c4e6b8d0f2a4c6e8b0d2f4a6",  # a sha256 of cell ids
    "3f2a9c01d2 cell-3f2a9c01d2-r0",
    "NCCL_NVLS_ENABLE=0",
    "EOD_TOKEN=0 --pad-token 50256",
    "/home/user/x /lustre/fsw/a ./relative/path",
    "deepseek-ai/DeepSeek-V3 Qwen/Qwen3-30B-A3B nvcr.io/nvidia/nemo:26.06",
    "WANDB_API_KEY",
    "env.pass: [WANDB_API_KEY]",
    "WANDB_API_KEY=$WANDB_API_KEY HF_TOKEN=${HF_TOKEN} --wandb-key $WANDB_API_KEY",
    "api_key: <your key>",
    "secrets are passed by name only; no secrets: passed by name",
    "monkey=bananas123",
    "mbx bisect --key env.NCCL_ALGO",
    "--tokenizer-model gpt2 --tokenizer-type HuggingFaceTokenizer max_tokens=4096",
    "--password-file /run/secrets/pw",
    "bos_token: <s>",
    "1.2.3.4 12345678 3.14e-05",
]


@pytest.mark.parametrize(("text", "value"), SECRETS)
def test_each_secret_is_found_and_masked(text: str, value: str) -> None:
    found = secrets.scan_text(text)
    assert found, text
    masked = secrets.mask(text)
    assert value not in masked and secrets.MASK in masked
    assert all(value not in f.describe() for f in found)


@pytest.mark.parametrize("text", NOT_SECRETS)
def test_no_false_positive(text: str) -> None:
    assert secrets.scan_text(text) == [], [f.describe() for f in secrets.scan_text(text)]
    assert secrets.mask(text) == text


def test_keys_give_context_both_ways() -> None:
    document = {
        "wandb_api_key": W_KEY,
        "db": {"password": "ab"},  # a short password counts when the key says password
        "software": {"sha": SHA, "commit": SHA, "ref": SHA, "revision": SHA},
        "env": {"pass": ["WANDB_API_KEY", "HF_TOKEN"], "values": {"NCCL_NVLS_ENABLE": "0"}},
        "cells": {"hash": "a3f9c0e1b2d4f6a8c0e2b4d6f8a0c2e4b6d8f0a2c4e6b8d0f2a4c6e8b0d2f4a6"},
    }
    assert [f.where for f in secrets.scan_tree(document)] == ["wandb_api_key", "db.password"]
    redacted = secrets.redact_tree(document)
    assert redacted["wandb_api_key"] == secrets.MASK and redacted["db"]["password"] == secrets.MASK
    assert redacted["software"] == document["software"] and redacted["env"] == document["env"]


def _card(command: str, **extra: object) -> dict:
    body = {"status": "verified", "precision": "bf16", "command": command,
            "metrics": {"last_10_steps_model_tflops_per_gpu_avg": 300.0}, **extra}  # fmt: skip
    return {"title": "m", "items": {"pretrain": {"H200": body}}}


def test_card_validate_cli_refuses_every_secret_and_masks_it(mbx, tmp_path: Path) -> None:
    files = []
    for i, (text, _) in enumerate(SECRETS):
        files.append(tmp_path / f"s{i}.card.yaml")
        files[-1].write_text(yaml.safe_dump(_card(text)))
    result = mbx("card", "validate", *map(str, files))
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    for file, (_, value) in zip(files, SECRETS, strict=True):
        assert f"{file}: items.pretrain.H200.command: contains " in result.stderr, (file, result.stderr)
        assert value not in result.stderr + result.stdout
    assert "contains a credential (WANDB_API_KEY=<redacted>)" in result.stderr
    assert "contains a credential (--wandb-api-key=<redacted>)" in result.stderr
    assert "contains a credential (password=<redacted>)" in result.stderr


def test_card_validate_cli_passes_every_non_secret(mbx, tmp_path: Path) -> None:
    # no absolute paths here: those are refused for their own reason (a card is published)
    texts = [t for t in NOT_SECRETS if not any(p in t for p in ("/home", "/run/", "/lustre"))]
    card = tmp_path / "fine.card.yaml"
    extra = {"software": {"sha": SHA}, "env": {"pass": ["WANDB_API_KEY"], "values": {"NCCL_NVLS_ENABLE": "0"}}}
    card.write_text(yaml.safe_dump(_card(" ; ".join(texts), notes=texts, description="[/x] and [/]", **extra)))
    result = mbx("card", "validate", str(card))
    assert result.returncode == 0, result.stderr


def test_markup_tags_are_not_absolute_paths_but_paths_still_are() -> None:
    for text in ("[/x]", "see [bold]this[/bold] and [/]", "[/bold red]"):
        assert card_problems(_card("./train.sh", description=text)) == [], text
    for text, path in (("[red]/x[/red]", "/x"), ("in [/tmp/x]", "/tmp/x"), ("/home/user/ckpt", "/home/user/ckpt")):
        problems = card_problems(_card("./train.sh", description=text))
        assert any(f"absolute path ({path!r})" in p for p in problems), (text, problems)
    problems = card_problems(_card("./train.sh", save_dir="/lustre/fsw/alice/ckpt"))
    assert any("personal or site directory" in p for p in problems), problems


def test_wandb_scrub_masks_secret_values_under_innocent_keys() -> None:
    config = {
        "env": {"values": {"FOO": HF, "NCCL_NVLS_ENABLE": "0"}},
        "trainer": {"command": ["./train.sh", "--wandb-key", W_KEY], "line": f"x --wandb-api-key {W_KEY}"},
        "note": f"run with WANDB_API_KEY={W_KEY}",
        "software": {"sha": SHA},
        "bos_token": "<s>",
        "hf_token": "anything",  # the key rule still holds
    }
    got = scrub(config)
    assert got["env"]["values"] == {"FOO": REDACTED, "NCCL_NVLS_ENABLE": "0"}
    assert got["trainer"]["line"] == f"x --wandb-api-key {REDACTED}"
    assert got["note"] == f"run with WANDB_API_KEY={REDACTED}"
    assert got["software"] == {"sha": SHA} and got["bos_token"] == "<s>" and got["hf_token"] == REDACTED
    assert W_KEY not in str(got) and HF not in str(got)


def test_summary_markdown_masks_secrets() -> None:
    assert md_text(f"failed: HF_TOKEN={HF}") == "failed: HF_TOKEN=\\<redacted\\>"
    assert W_KEY not in md_code(f"--wandb-key {W_KEY}") and md_code(SHA) == f"`{SHA}`"
    assert W_KEY not in md_description(f"run `train.sh --wandb-key {W_KEY}` with password=hunter2")
    assert "hunter2" not in md_description("password=hunter2") and md_text("[/x]") == "\\[/x\\]"


def test_report_pages_mask_secrets() -> None:
    from reports.site_format import environment

    template = environment().from_string("{{ a }}|{{ b }}|{{ c }}")
    page = template.render(a=f"stderr: WANDB_API_KEY={W_KEY}", b=SHA, c="[/x] <b>")
    assert W_KEY not in page and "WANDB_API_KEY=&lt;redacted&gt;" in page
    assert SHA in page and "[/x] &lt;b&gt;" in page
