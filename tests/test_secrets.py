"""The one secret scanner (reports/secrets.py: detect-secrets' plugins plus mbx's rules), both ways: every secret
of issues 21 and 23 is caught by the real `mbx card validate` (exit 2, the value masked in the message), and
markup, SHAs, hashes, paths, numbers, model names and names-without-values are not; W&B configs, summary.md and
the report pages mask what it finds; `card validate` no longer calls a markup tag an absolute path."""

from __future__ import annotations

import dataclasses
import re
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.judge.compare_config import MAX_VALUE, cell_config, config_diff
from orchestrator.run.store import CellRow
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
    # issue 32: the forms the scanner missed
    ('DB_PASSWORD: "-hunter2hunter"', "-hunter2hunter"),
    ("./train.sh --db-password -cmdPassw0rdX", "-cmdPassw0rdX"),
    ("ADMIN_PASSWORD: HUNTER_TWO_2024", "HUNTER_TWO_2024"),
    ("WANDB_API_KEY=" + "1234567890" * 4, "1234567890" * 4),
    ("pip install --index-url https://bob:pipPassw0rd2@pypi.example.com/simple x", "pipPassw0rd2"),
    ("docker://alice:imgPassw0rd1@registry.example.com/team/train:1", "imgPassw0rd1"),
    ('settings {"api_key": "jsonApiKey0123456789"}', "jsonApiKey0123456789"),
    ("{'auth_token': 'abcDEF0123456789xyz'}", "abcDEF0123456789xyz"),
    # the review of issue 32: a value starting with `--` outside a flag's space, ALL_CAPS under a secret name,
    # DB_PASS, HTTP authorization, `wandb login`, `-p` of a login command, a passphrase of several words
    ('DB_PASSWORD: "--hunter2hunterZ"', "--hunter2hunterZ"),
    ("DB_PASSWORD=--hunter2hunter", "--hunter2hunter"),
    ("./train.sh --db-password=--cmdPassw0rdY --x 1", "--cmdPassw0rdY"),
    ("./train.sh --db-password --cmdPassw0rdX --x 1", "--cmdPassw0rdX"),
    ('./train.sh --password "--hunter2hunter"', "--hunter2hunter"),
    ("CLIENT_SECRET: HUNTER_TWO_2024", "HUNTER_TWO_2024"),
    ("HF_TOKEN=ABCD_EFGH_IJKL_MNOP_1234", "ABCD_EFGH_IJKL_MNOP_1234"),
    ("DB_PASS=hunter2hunter99 psql", "hunter2hunter99"),
    ('curl -H "Authorization: Bearer abcdefghijklmnop1234567890" https://x', "abcdefghijklmnop1234567890"),
    ("Authorization: Basic dXNlcjpwYXNzd29yZA==", "dXNlcjpwYXNzd29yZA=="),
    (f"wandb login {W_KEY}", W_KEY),
    (f"wandb login --relogin {W_KEY} && python train.py", W_KEY),
    ("docker login -u me -p hunter2hunter registry.example.com", "hunter2hunter"),
    ("sshpass -p 's3cr3t pw' ssh node1", "s3cr3t pw"),
    ("mysql -u root -phunter2db mydb", "hunter2db"),
    ("env PASSWORD=correct horse battery staple", "horse battery staple"),
    ("x" * 4500 + " password=hunterTail77", "hunterTail77"),  # the tail of a long line, past its last window
    # the second review of issue 32: `wandb login` with options or a quoted key, `wandb.login(key=…)`, docker's
    # global options before `login`, more login tools, quoted and proxy HTTP credentials, curl's user:password,
    # one lower-case word under a token/secret name
    (f"wandb login --host https://api.wandb.ai {W_KEY}", W_KEY),
    (f'wandb login "{W_KEY}"', W_KEY),
    (f"wandb login --relogin '{W_KEY}'", W_KEY),
    (f'wandb.login(key="{W_KEY}")', W_KEY),
    (f"wandb.login(anonymous='never', key={W_KEY})", W_KEY),
    ("docker --config /x login -u me -p hunter2hunter nvcr.io", "hunter2hunter"),
    ("docker -H tcp://h:2375 login -u me -p hunter2hunter nvcr.io", "hunter2hunter"),
    ("singularity registry login -u me -p hunter2hunter docker://nvcr.io", "hunter2hunter"),
    ("mysqladmin -uroot -phunter2hunter status", "hunter2hunter"),
    ("Authorization: Bearer \"abcdefghijklmnop1234\"", "abcdefghijklmnop1234"),
    ("Proxy-Authorization: Basic dXNlcjpodW50ZXIyaHVudGVy", "dXNlcjpodW50ZXIyaHVudGVy"),
    ("curl -u admin:hunter2hunter https://x/ckpt.tar", "hunter2hunter"),
    ("curl --user 'admin:hunter2hunter' https://x", "hunter2hunter"),
    ("CLIENT_SECRET: supersecretlowercase", "supersecretlowercase"),
    ("HF_TOKEN=abcdefghijklmnopqrstuvwxyz", "abcdefghijklmnopqrstuvwxyz"),
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
    "steps_key: trainer.params.train_iters",
    "./train.sh --token --next-flag 1 --password -v",
    "nvcr.io/nvidia/nemo:26.06@sha256:" + SHA + SHA[:24],
    "git clone https://user:${GIT_PASSWORD}@example.com/r.git",
    "git+ssh://git@github.com/org/repo.git",
    "the tokenizer's max_tokens: 4096; tokens_per_expert=64",
    "token: HF_TOKEN api_key_env: WANDB_API_KEY secret: CLIENT_SECRET",  # a NAME passed by name
    "in Markdown: (`token: HF_TOKEN` passes a name), (`--password --verbose`) gives none",
    "./train.sh --password --next-flag --token --tokenizer-type x --key --moe-router-topk 2",
    "mkdir -p out/x && python train.py -p 8080",
    "docker login registry.example.com; mkdir -p ckpt/run1",
    "wandb login $WANDB_API_KEY; wandb login --relogin",
    "Authorization: Bearer $TOKEN; bearer authentication",
    "env.pass: [DB_PASS, HF_TOKEN] --bypass-check compass=northwest",
    "--moe-token-dispatcher-type alltoall --tokenizer-type HuggingFaceTokenizer --use-checkpoint-args",
    # key paths and words under a key name, special tokens, prose, a user without a password, options without a key
    "steps_key: model.key_size sort_key: iteration tokenizer_key: tokenizer.vocab metric_key: throughputpergpu",
    "eos_token: endoftextmarker pad_token: paddingtokens token: wandb_api_key",
    "curl -u admin https://x; curl -u $USER:$PASS https://x",
    "wandb login --relogin --host https://api.wandb.ai; wandb.login(key=os.environ['WANDB_API_KEY'])",
    "secret: short hf_token: hf_token",
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
    result = mbx("card", "validate", *map(str, files), env={"MBX_MAX_ERRORS": "0"})  # every problem shown
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    for file, (_, value) in zip(files, SECRETS, strict=True):
        assert f"{file}: items.pretrain.H200.command: contains " in result.stderr, (file, result.stderr)
        assert value not in result.stderr + result.stdout
    assert "contains a credential (WANDB_API_KEY=<redacted>)" in result.stderr
    assert "contains a credential (--wandb-api-key=<redacted>)" in result.stderr
    assert "contains a credential (password=<redacted>)" in result.stderr


def test_card_validate_cli_passes_every_non_secret(mbx, tmp_path: Path) -> None:
    # no absolute paths nor user@host here: those are refused for their own reasons (a card is published)
    texts = [t for t in NOT_SECRETS if not any(p in t for p in ("/home", "/run/", "/lustre", "@"))]
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


@pytest.mark.parametrize(
    ("key", "value"),
    [("DB_PASSWORD", "-hunter2hunter"), ("env.SWEEP_PASSWORD", "-sweepPass1"), ("ADMIN_PASSWORD", "HUNTER_TWO_2024"),
     ("WANDB_API_KEY", "1234567890" * 4), ("db-password", "-cmdPassw0rdX")],
)  # fmt: skip
def test_a_value_under_a_credential_key_is_a_secret_whatever_its_form(key: str, value: str) -> None:
    assert secrets.scan_text(value, key=key) and secrets.mask(value, secrets.scan_text(value, key=key)) == secrets.MASK


def test_an_unquoted_numeric_key_in_a_document_is_masked() -> None:
    document = {"env": {"WANDB_API_KEY": int("1234567890" * 4), "EOD_TOKEN": 0}}
    assert [f.where for f in secrets.scan_tree(document)] == ["env.WANDB_API_KEY"]
    assert secrets.redact_tree(document) == {"env": {"WANDB_API_KEY": secrets.MASK, "EOD_TOKEN": 0}}


@pytest.mark.parametrize("length", [4097, 4500, 5000, 6000, 6144, 9000, 10000])
def test_the_tail_of_a_long_line_is_scanned(length: int) -> None:
    """A line longer than a window is scanned window by window; the last window reaches the line's end."""
    token = "hf_tailAbcdefghijklmnopqrstuvwxyz0123"
    line = "x" * (length - len(" HF_TOKEN=" + token)) + " HF_TOKEN=" + token
    assert token not in secrets.mask(line)
    assert [f.where for f in secrets.scan_tree({"description": line})] == ["description"]


def test_a_key_that_is_a_secret_is_not_shown_in_its_key_path() -> None:
    document = {"env": {"values": {HF: "x"}}, "trainer": {"params": {"password=hunterKey9": 1}}}
    shown = "\n".join(secrets.problems(document, "keep it out"))
    assert HF not in shown and "hunterKey9" not in shown
    assert "env.values.<redacted>: contains" in shown
    assert "trainer.params.password=<redacted>: contains" in shown


def test_an_argv_item_is_read_by_the_flag_or_the_command_before_it() -> None:
    """In an argv list the flag before an item says what it is: `--password --verbose` gives no value, an item
    that only starts with dashes is one (`--db-password --cmdPassw0rdX`); `-p` is a password only in a login
    command, up to the command's end; `wandb login KEY`."""
    argv = ["python", "t.py", "--password", "--verbose", "--hf-token", "--tokenizer-type", "x",
            "--db-password", "--cmdPassw0rdX", "&&", "docker", "login", "-u", "me", "-p", "hunter2hunter", "reg",
            "&&", "mkdir", "-p", "ckpt/run1", "&&", "wandb", "login", W_KEY]  # fmt: skip
    found = secrets.scan_tree({"command": argv})
    assert [(f.where, f.name) for f in found] == [
        ("command[8]", "--db-password"), ("command[15]", "-p"), ("command[24]", "wandb login")]  # fmt: skip
    masked = secrets.redact_tree({"command": argv})["command"]
    assert [i for i, (a, b) in enumerate(zip(argv, masked, strict=True)) if a != b] == [8, 15, 24]


def test_nested_assignments_are_scanned_in_linear_time() -> None:
    """A line of `k=key=key=…` made the scan read each value to the end of the line again (quadratic: 12 ms a
    4,000-character line, 12 s for the review's 3.8 MB campaign); each value is now found by a bisection."""
    lines = [f"k{i}=" + "key=" * 1000 for i in range(150)] + [f"a{i}_key=" * 500 for i in range(50)]
    start = time.process_time()
    assert secrets.scan_many([("", "", line) for line in lines])
    assert time.process_time() - start < 0.6  # 0.13 s on a loaded 2-core VM; quadratic: 1.9 s


def test_compare_masks_a_config_value_before_cutting_it() -> None:
    """compare's config diff cuts values to MAX_VALUE characters: a token cut there no longer reads as one, so the
    configuration is masked first (env, params, argv by the flag before it, the command template)."""
    command = ["python", "train.py", "--opt", "x" * 10, "--hf-token", HF, "--x", "1"]
    before = len('["python", "train.py", "--opt", "' + "x" * 10 + '", "--hf-token", "')
    assert MAX_VALUE - 30 < before < MAX_VALUE - 12  # the token crosses the cut, too short left to match
    cell = CellRow(campaign="c", cell_id="c1-r0", point_id="c1", repeat=0, ordinal=0, label="db_password=--hunterAx1",
                   params={"params.db_password": "--hunterAx1"}, recipe={"argv": ["--db-password", "--hunterAx1"]},
                   resources={}, env={"DB_PASSWORD": "--hunter2hunterZ", "NOTE": "PASSWORD=correct horse"},
                   trainer_kind="command")  # fmt: skip
    config = cell_config({"trainer": {"kind": "command", "command": command}}, None, cell)
    shown = "\n".join(f"{key}: {value}" for key, value in config.items())
    for raw in (HF[:12], "hunterAx1", "hunter2hunterZ", "horse"):
        assert raw not in shown, (raw, shown)
    assert config["env.DB_PASSWORD"].startswith("<redacted #")
    # a difference only in a secret still shows, as two different masks; the same secret is the same mask
    other = dataclasses.replace(cell, env={**cell.env, "DB_PASSWORD": "--hunter3hunterY"})
    spec = {"trainer": {"kind": "command", "command": command}}
    changed = config_diff(config, cell_config(spec, None, other))
    assert [item["key"] for item in changed] == ["env.DB_PASSWORD"] and "hunter3" not in str(changed)
    assert cell_config(spec, None, cell)["env.DB_PASSWORD"] == config["env.DB_PASSWORD"]


def test_every_installed_plugin_has_a_gate() -> None:
    """The gates in reports/secrets.py were derived from detect-secrets 1.5's patterns; a plugin without one (another
    release changed its patterns) runs on every line: correct, but re-derive its gate from the new patterns."""
    assert secrets._plugin_detectors()
    assert [d for d in secrets._plugin_detectors() if d.gate is None] == []


PLUGIN_SAMPLES = [  # one or more texts each detect-secrets plugin (and each project rule) flags
    "AKIAIOSFODNN7EXAMPLE", 'aws_secret_key = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"',
    " AKCp5budTFpbypBqQbGJPz3pGCi28pPivfWczqjfYb9drAmd9LbRZbj6UpKFxJXA8ksWGc9fM ", " AP6xxxxxxxxxxx ",
    "AccountKey=" + "a1B2" * 22, 'cloudant_password="' + "abcdefghijklmnopqrstuvwx" + '"',
    "https://admin:" + "0123456789abcdef" * 4 + "@acct.cloudant.com", "MTk4NjIyNDgzNDcxOTI1MjQ4.Cl2FMQ.ZnCjm1XVW7vRze4b7Cq4se7kKWs",
    "ghp_" + "a1" * 18, "glpat-" + "a1" * 10, 'ibm_cloud_iam_key = "' + "a1B2" * 11 + '"',
    'secret_access_key = "' + "0123456789abcdef" * 3 + '"', "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.c2lnbmF0dXJl",
    "0123456789abcdef" * 2 + "-us12", "//registry.npmjs.org/:_authToken=npm_abc123",
    "sk-" + "a1" * 10 + "T3BlbkFJ" + "b2" * 10, "-----BEGIN RSA PRIVATE KEY-----", "pypi-AgEIcHlwaS5vcmc" + "a1" * 35,
    "SG." + "a" * 22 + "." + "b" * 43, "xoxb-123-abc", "https://hooks.slack.com/services/T0A/B0B/xyz",
    'softlayer_api_key = "' + "a1" * 32 + '"', "sq0csp-" + "a" * 43, "sk_live_" + "a1" * 12, "123456789:" + "A" * 35,
    "AC" + "a1" * 16, "SK" + "b2" * 16, 'password = "abcdef"', "'abcdef' == password", 'secret_key "abcdef";',
    '"' + "Zm9vYmFyYmF6cXV4MTIzNDU2Nzg5MEFCQ0RFRg==" + '"', "nvapi-" + "a1" * 12, "hf_" + "a1" * 16,
]  # fmt: skip
FRAGMENTS = [frag for text, _ in SECRETS for frag in (text, text[: len(text) // 2], text[len(text) // 2 :])] + [
    *PLUGIN_SAMPLES, "key", "KEY", "token", "password", "pwd", "secret", "auth", "contraseña", "=", ": ", ":=", " ",
    "--", "-", '"', "'", "`", ";", "==", "://", "@", "\n", "AKIA", "AKC", "APB", "eyJ", "xoxb-1-", "sk_live_", "-us1",
    "PRIVATE KEY", "SG.", "ghp_", "glpat-", "hf_", "0123456789abcdef" * 3, "ABCDEFGHIJKLMNOPQRSTUVWXYZ",
    "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6", "12345678:", "MNO", "=" * 3,
    # the review of issue 32's forms, and a filler that makes a text longer than a window (its tail scanned too)
    "Authorization: ", "Bearer ", "wandb login ", "--relogin ", "docker login ", "sshpass ", "mysql ", " -p ", "-p",
    "DB_PASS=", "PASSWORD=", " horse", " battery", "HUNTER_TWO_2024", "--hunter2hunter", "--db-password", "; ",
    "&& ", "x" * 2100,
]  # fmt: skip


def _unmarked_findings(text: str) -> list[tuple[str, str]]:
    """(detector, line) for every line where a detector finds something that its gate did not mark."""
    lines = secrets._Lines(piece for _, piece in secrets._pieces(text))
    found = []
    for detector in (*secrets._RULES, *secrets._plugin_detectors()):
        marked = lines.marked(detector.gate, detector.also)
        found += [(detector.find.__qualname__, line) for i, line in enumerate(lines.lines)
                  if i not in marked and list(detector.find(line))]  # fmt: skip
    return found


def test_every_sample_is_found_through_its_gate() -> None:
    for sample in PLUGIN_SAMPLES:
        assert secrets.scan_text(sample), sample
        assert _unmarked_findings(sample) == [], sample


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(FRAGMENTS), min_size=1, max_size=12), st.sampled_from([str, str.upper, str.lower]))
def test_gates_lose_no_finding(parts: list[str], case) -> None:
    """No detector finds anything in a line its gate leaves out: the gated scan (gate probes over all lines at once,
    detectors only where marked) loses nothing that running every detector on every line finds."""
    assert _unmarked_findings(case("".join(parts))) == []


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.sampled_from(FRAGMENTS), min_size=1, max_size=6).map("".join), min_size=17, max_size=40))
def test_a_text_alone_and_among_many_gives_the_same_findings(texts: list[str]) -> None:
    """A page's single value is scanned on its own (each gate tested on it), a document's values together (each
    gate searched once over them all): the two ways find the same."""
    together = secrets.scan_many([("", "", text) for text in texts])
    secrets._line_hits.cache_clear()
    assert [secrets.scan_text(text) for text in texts] == together


def test_argv_forms_of_the_second_review() -> None:
    """In an argv: `wandb login`'s key after its options (the finding names the key, not `--relogin`), `-pPASS`
    joined in a login command, docker's global options before `login`, curl's `-u user:password`."""
    cases = [
        (["wandb", "login", "--relogin", W_KEY], 3),
        (["wandb", "login", "--host", "https://api.wandb.ai", W_KEY], 4),
        (["mysql", "-uroot", "-phunter2hunter", "-e", "select 1"], 2),
        (["sshpass", "-phunter2hunter", "ssh", "h"], 1),
        (["docker", "--config", "/x", "login", "-u", "me", "-p", "hunter2hunter", "nvcr.io"], 7),
        (["curl", "-u", "admin:hunter2hunter", "https://x"], 2),
    ]
    for argv, index in cases:
        assert [f.where for f in secrets.scan_tree({"command": argv})] == [f"command[{index}]"], argv
        masked = secrets.redact_tree({"command": argv})["command"]
        assert [i for i, (a, b) in enumerate(zip(argv, masked, strict=True)) if a != b] == [index], masked
    for argv in (["wandb", "login", "--relogin"], ["curl", "-u", "admin", "https://x"], ["mkdir", "-pv", "out"],
                 ["docker", "run", "img", "login", "-p", "8080"], ["mysql", "-u", "root", "-p"]):  # fmt: skip
        assert secrets.scan_tree({"command": argv}) == [], argv


def test_a_lower_case_word_is_a_key_only_under_a_credential_name() -> None:
    """`HF_TOKEN: abcdefghijklmnopqrstuvwxyz` is a key; `steps_key: iteration` or `…: model.key_size` a key path."""
    document = {"env": {"HF_TOKEN": "abcdefghijklmnopqrstuvwxyz", "CLIENT_SECRET": "supersecretlowercase",
                        "EOS_TOKEN": "endoftextmarker"},
                "steps_key": "model.key_size", "sort_key": "iterationnumber", "tokenizer_key": "tokenizer.vocab"}  # fmt: skip
    assert [f.where for f in secrets.scan_tree(document)] == ["env.HF_TOKEN", "env.CLIENT_SECRET"]


def test_a_value_a_scan_window_cuts_is_masked_to_its_end() -> None:
    """A line longer than a window is scanned in windows of 4,096 characters; a value that starts in one and ends
    past it was masked only to the window's end (the rest raw): it is read on to its end in the whole line."""
    token = "BQh2" + "x7Kp" * 500
    for before in (1000, 2000, 3000, 3500, 6000):
        for line in ("y" * before + " API_TOKEN=" + token + " end", "y" * before + f' "api_token": "{token} x" end'):
            masked = secrets.mask(line)
            assert token[-12:] not in masked and token[1000:1012] not in masked, (before, masked[-200:])
            assert masked.endswith(" end") and secrets.MASK in masked
    body = "MIIEvQIBADANBgkqhkiG9w0BAQEFAASC" + "Ab3+" * 400
    account = '{"type": "service_account", "private_key": "-----BEGIN PRIVATE KEY-----\\n' + body + '\\n-----END PRIVATE KEY-----\\n"}'
    masked = secrets.mask("z" * 2500 + " GCP_SA_JSON=" + account)
    assert body[:40] not in masked and body[-40:] not in masked


@pytest.mark.parametrize("joined", ["\n", "\\n"])
def test_a_private_key_is_masked_from_begin_to_end(joined: str) -> None:
    """A PEM private key in a log tail (lines) or a JSON string (`\\n`): only its BEGIN line was masked before."""
    body = ["MIIEowIBAAKCAQEA0Z3VS5JJcds3xfnPEMBODYLINE1ygWyF8PbnGy0AHB7MhgHcTz", "aNUbPCcJxd3lbdHpKLZj0dV8gRaQF6zW"]
    text = joined.join(["loaded key:", "-----BEGIN RSA PRIVATE KEY-----", *body, "-----END RSA PRIVATE KEY-----",
                        "next line"])  # fmt: skip
    masked = secrets.mask(text)
    assert not [line for line in body if line in masked], masked
    assert masked.startswith("loaded key:") and masked.endswith("next line")
    assert secrets.redact_tree({"log_tail": text})["log_tail"] == masked


# Lines made to make a pattern backtrack: runs of what each rule and plugin reads, with and without what would end
# a match (issue 32's second review: `wandb login` + ` --host=x` × 22 took 2 s, exponential in the count).
HOSTILE_PIECES = [
    " --host=x", " --host", "key ", " ", "\t", "1", "-p", "a=", "a_key=", "://a:", "Authorization: ", "bearer ",
    "-----BEGIN ", "docker --x ", "docker -x y ", "curl -u ", "wandb.login(", "wandb login ", "password=", " a", '"',
    "'a", "secret", "secret: ", "api_key", '"a" == ', "{{", "sk-", "eyJ", "AKIA", "/", ".aaaaaa.", "T3BlbkFJ", "pass",
]  # fmt: skip
HOSTILE_LINES = [line for piece in HOSTILE_PIECES
                 for body in [(piece * (4096 // len(piece)))[:4000]]
                 for line in (body, body + "!", "key" + body, "password: " + body, body + ' = "x"')]  # fmt: skip


def _cpu(call: Callable[[], object]) -> float:
    """The least CPU time of three calls (a collector's pause or a busy neighbour is no backtracking); a pattern
    that backtracks is slow every time."""
    best = float("inf")
    for _ in range(3):
        start = time.process_time()
        call()
        best = min(best, time.process_time() - start)
        if best <= 0.05:
            break
    return best


def test_no_pattern_backtracks_on_a_hostile_line() -> None:
    """Every pattern of the scanner (each of its regexes, each detector with detect-secrets' plugins, each value
    check) on 4 KB lines built to make it backtrack: linear time, under 50 ms a line on a loaded 2-core VM (~1-6 ms
    idle; the exponential, cubic and quadratic ones took 0.05-230 s)."""
    patterns = {name: p for name, p in vars(secrets).items() if isinstance(p, re.Pattern)}
    patterns |= {f"token {pattern.pattern}": pattern for pattern, _ in secrets._TOKENS}
    patterns |= {f"gate of {name}": (g.pattern if isinstance(g, secrets._Low) else g)
                 for name, (_, gate) in secrets._PLUGIN_GATES.items() for g in gate if not isinstance(g, str)}  # fmt: skip
    slow = []
    for line in HOSTILE_LINES:
        for name, pattern in patterns.items():
            anchored = name in ("_MORE_WORDS", "_SHELL_WORD", "_BARE_KEY")
            if _cpu(lambda p=pattern, text=line, a=anchored: p.match(text) if a else list(p.finditer(text))) > 0.05:
                slow += [(name, line[:30])]
        for detector in (*secrets._RULES, *secrets._plugin_detectors()):
            start = time.process_time()
            list(detector.find(line))
            slow += [(detector.find.__qualname__, line[:30])] if time.process_time() - start > 0.05 else []
        start = time.process_time()
        secrets.secret_value("token", line), secrets.secret_value("--token", line), secrets.scan_text(line)
        slow += [("secret_value", line[:30])] if time.process_time() - start > 0.1 else []
    assert slow == []


def test_a_hostile_campaign_of_many_lines_scans_in_linear_time() -> None:
    """The review's `wandb login` + ` --host=x` × n (0.5 s at n = 20, doubling with each 2) at n = 400 in 1,000
    distinct lines, as in a 4 MB campaign."""
    lines = [f"{i} wandb login" + " --host=x" * 400 for i in range(1000)]
    start = time.process_time()
    secrets.scan_many([("", "", line) for line in lines])
    assert time.process_time() - start < 1.5  # ~0.1 s


def test_runs_of_jwt_heads_scan_in_linear_time_and_a_jwt_is_still_found() -> None:
    """detect-secrets' JWT pattern read on from every `eyJ` of a run (~6 ms a 4 KB line of `eyJeyJ…`: 6 s for a
    4 MB campaign of them); read once per run now. A real JWT is still found, inside a line of such runs too."""
    jwt = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.c2lnbmF0dXJl"
    lines = [f"{i} " + "eyJ" * 1360 + " eyJa.b" for i in range(1000)]
    start = time.process_time()
    secrets.scan_many([("", "", line) for line in lines])
    assert time.process_time() - start < 1.0  # ~0.05 s; 4-6 s before
    assert "eyJhbGciOiJIUzI1NiJ9" not in secrets.mask(f"{'eyJ' * 100} token {jwt} {'eyJ' * 100}.x")
