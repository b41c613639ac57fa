"""The planted secrets of issue 32 (17, then 7 more its review found missed, then 10 its second review found): the forms the scanner missed (a value starting with `-`, an ALL_CAPS password,
an all-digit 40-character key, `user:pass@host`, JSON `"api_key": "…"`) in every field of a campaign that validate
skipped (tags, entity, cluster, launchers, container, pip args, description, params, argv, env, sweeps), and one a
trainer prints into its own log. Each value is unique, so a grep for it finds only that secret."""

from __future__ import annotations

import copy
from typing import Any

HEX_TAG = "fedcba9876543210fedcba9876543210fedcba98"  # 40 hex: a W&B API key's shape

# name -> (key path validate names, the raw value that must never reach a file mbx writes)
PLANTED: dict[str, tuple[str, str]] = {
    "dash_env": ("env.values.DB_PASSWORD", "-hunter2hunter"),
    "dash_argv": ("trainer.command[4]", "-cmdPassw0rdX"),
    "dash_sweep": ("sweep.axes.env.SWEEP_PASSWORD[0]", "-sweepPass1"),
    "caps_password": ("env.values.ADMIN_PASSWORD", "HUNTER_TWO_2024"),
    "digits_key": ("env.values.WANDB_API_KEY", "1234567890" * 4),
    "tag_key": ("wandb.tags[0]", HEX_TAG),
    "tag_password": ("wandb.tags[1]", "hunter3tag"),
    "entity": ("wandb.entity", "entTok3nValue77"),
    "cluster": ("cluster.sbatch_extra.comment", "clusterPw77x"),
    "srun_args": ("launchers.submitit.srun_args[0]", "hf_srunAbcdefghijklmnopqrstuvwxyz0123"),
    "image_url": ("container.image", "imgPassw0rd1"),
    "pip_url": ("software.pip_args[1]", "pipPassw0rd2"),
    "json_description": ("description", "jsonApiKey0123456789"),
    "param": ("trainer.params.hf_token", "paramTok3nValue99"),
    "aws_note": ("env.values.NOTE", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"),
    "cell": ("sweep.cells[0].env.CELL_TOKEN", "cellTok3nValue55xyz"),
    "log": ("", "hf_logAbcdefghijklmnopqrstuvwxyz012345"),  # printed by the trainer, in no campaign field
    # the review of issue 32: a value starting with `--`, an ALL_CAPS value under a secret name, `DB_PASS`, a
    # passphrase of several words, an HTTP bearer token, `wandb login KEY`, `-p` of a login command
    "dashdash_env": ("env.values.DB2_PASSWORD", "--hunter2hunterZ"),
    "caps_secret": ("env.values.CLIENT_SECRET", "HUNTER_THREE_2025"),
    "db_pass": ("env.values.DB_PASS", "dbPass7hunter"),
    "passphrase": ("env.values.NOTE2", "horse battery staple"),
    "bearer": ("env.values.CURL", "bearerAbcdefghijklmnop1234567890"),
    "wandb_login": ("env.values.SETUP", "0a1b2c3d4e5f0a1b2c3d4e5f0a1b2c3d4e5f0a1b"),
    "docker_p": ("env.values.LOGIN", "dockerPw0rdX9"),
    # the second review of issue 32: `wandb login` with options and a quoted key, `wandb.login(key=…)`, a lower-case
    # token, curl's `-u user:password`, Proxy-Authorization, docker's global options before `login`; argv forms
    # (`wandb login --relogin KEY`, `mysql -pPASS`); in the trainer's log a PEM key over several lines and a value
    # that a 4 KiB scan window cuts
    "wandb_quoted": ("env.values.SETUP2", "1a2b3c4d5e6f1a2b3c4d5e6f1a2b3c4d5e6f1a2b"),
    "wandb_call": ("env.values.PYSETUP", "2b3c4d5e6f7a2b3c4d5e6f7a2b3c4d5e6f7a2b3c"),
    "lower_token": ("env.values.HF2_TOKEN", "lowercasetokenvalue"),
    "curl_u": ("env.values.FETCH", "curlPassw0rd9"),
    "proxy_auth": ("env.values.PROXY", "proxyAbcdefghijklmnop123"),
    "docker_global": ("env.values.LOGIN2", "dockerCfgPw0rd7"),
    "argv_relogin": ("launchers.submitit.srun_args[4]", "3c4d5e6f7a8b3c4d5e6f7a8b3c4d5e6f7a8b3c4d"),
    "argv_joined_p": ("launchers.submitit.srun_args[7]", "joinedPw0rd5x"),
    "pem": ("", "MIIEowIBAAKCAQEAplantedPemBody0123456789abcdefXYZ"),
    "window": ("", "winTok" + "Ab3" * 500),
}
VALUES = [value for _, value in PLANTED.values()]
LOG_LINE = (
    f"warning: HF_TOKEN={PLANTED['log'][1]} was set in the environment\n"
    f"loaded key:\n-----BEGIN RSA PRIVATE KEY-----\n{PLANTED['pem'][1]}\n-----END RSA PRIVATE KEY-----\n"
    + "x" * 3000
    + f" API_TOKEN={PLANTED['window'][1]} done"
)  # the value crosses the window at 4096


def plant(campaign: dict[str, Any], which: list[str] | None = None) -> dict[str, Any]:
    """A copy of a command-trainer campaign with the planted values (all, or `which`) in their fields."""
    data = copy.deepcopy(campaign)
    value = {name: v for name, (_, v) in PLANTED.items()}
    chosen = set(PLANTED if which is None else which) - {"log"}
    env = data.setdefault("env", {}).setdefault("values", {})
    trainer = data["trainer"]
    if "dash_env" in chosen:
        env["DB_PASSWORD"] = value["dash_env"]
    if "caps_password" in chosen:
        env["ADMIN_PASSWORD"] = value["caps_password"]
    if "digits_key" in chosen:
        env["WANDB_API_KEY"] = value["digits_key"]
    if "aws_note" in chosen:
        env["NOTE"] = f"AWS_SECRET_ACCESS_KEY={value['aws_note']}"
    _plant_review(env, value, chosen)
    if "dash_argv" in chosen:
        trainer["command"] = [
            *trainer["command"][:3],
            "--db-password",
            value["dash_argv"],
            *trainer["command"][3:],
        ]
    if "param" in chosen:
        trainer.setdefault("params", {})["hf_token"] = value["param"]
    sweep = data.setdefault("sweep", {})
    if "dash_sweep" in chosen:
        sweep.setdefault("axes", {})["env.SWEEP_PASSWORD"] = [value["dash_sweep"]]
    if "cell" in chosen:
        sweep.setdefault("cells", []).append({"env.CELL_TOKEN": value["cell"]})
    wandb = data.setdefault("wandb", {})
    if "tag_key" in chosen or "tag_password" in chosen:
        wandb["tags"] = [f"WANDB_API_KEY={value['tag_key']}", f"password={value['tag_password']}"]
    if "entity" in chosen:
        wandb["entity"] = f"team-token={value['entity']}"
    if "cluster" in chosen:
        data.setdefault("cluster", {}).setdefault("sbatch_extra", {})["comment"] = (
            f"password={value['cluster']}"
        )
    if "srun_args" in chosen or "argv_relogin" in chosen or "argv_joined_p" in chosen:
        data.setdefault("launchers", {})["submitit"] = {"srun_args": [
            f"--export=ALL,HF_TOKEN={value['srun_args']}", "wandb", "login", "--relogin", value["argv_relogin"],
            "&&", "mysql", f"-p{value['argv_joined_p']}"]}  # fmt: skip
    if "image_url" in chosen:
        data.setdefault("container", {})["image"] = (
            f"docker://alice:{value['image_url']}@registry.example.com/t:1"
        )
    if "pip_url" in chosen:
        data.setdefault("software", {})["pip_args"] = ["--index-url",
                                                       f"https://bob:{value['pip_url']}@pypi.example.com/simple"]  # fmt: skip
    if "json_description" in chosen:
        data["description"] = f'settings {{"api_key": "{value["json_description"]}"}} for the run'
    return data


def _plant_review(env: dict[str, Any], value: dict[str, str], chosen: set[str]) -> None:
    """The values the review of issue 32 found missed, in env values (the trainer prints its environment)."""
    if "dashdash_env" in chosen:
        env["DB2_PASSWORD"] = value["dashdash_env"]
    if "caps_secret" in chosen:
        env["CLIENT_SECRET"] = value["caps_secret"]
    if "db_pass" in chosen:
        env["DB_PASS"] = value["db_pass"]
    if "passphrase" in chosen:
        env["NOTE2"] = f"PASSWORD=correct {value['passphrase']}"
    if "bearer" in chosen:
        env["CURL"] = f'curl -H "Authorization: Bearer {value["bearer"]}" https://example.com'
    if "wandb_login" in chosen:
        env["SETUP"] = f"wandb login {value['wandb_login']} && python train.py"
    if "docker_p" in chosen:
        env["LOGIN"] = f"docker login -u me -p {value['docker_p']} registry.example.com"
    _plant_second_review(env, value, chosen)


def _plant_second_review(env: dict[str, Any], value: dict[str, str], chosen: set[str]) -> None:
    """The values the second review of issue 32 found missed, in env values."""
    forms = {
        "wandb_quoted": ("SETUP2", 'wandb login --relogin --host https://api.wandb.ai "{}"'),
        "wandb_call": ("PYSETUP", "python -c 'import wandb; wandb.login(key=\"{}\")'"),
        "lower_token": ("HF2_TOKEN", "{}"),
        "curl_u": ("FETCH", "curl -u admin:{} https://example.com/ckpt.tar"),
        "proxy_auth": ("PROXY", "Proxy-Authorization: Basic {}"),
        "docker_global": ("LOGIN2", "docker --config /tmp/cfg login -u me -p {} nvcr.io"),
    }
    for name, (variable, form) in forms.items():
        if name in chosen:
            env[variable] = form.format(value[name])
