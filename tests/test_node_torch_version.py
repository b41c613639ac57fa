"""node.json's torch version is torch.__version__ (torch/version.py), as the bundled trainer's env.json records it.

Seen on the H100 image (2026-12-06): the distribution's metadata said 2.11.0 where torch.__version__ said
2.11.0+cu130, so a compare of a Bridge campaign (node.json only) against a bundled one (env.json) listed a false
"fingerprint differs: torch: 2.11.0 → 2.11.0+cu130". A torch package laid out like that one is built here.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROBE = ("import json; from launchers.node.fingerprint import node_fingerprint; "
         "print(json.dumps(node_fingerprint({}, {}, gpus=[])))")  # fmt: skip


def test_torch_version_is_what_torch_says_not_the_metadata(tmp_path: Path) -> None:
    site = tmp_path / "site"
    (site / "torch").mkdir(parents=True)
    (site / "torch" / "__init__.py").write_text("raise ImportError('the probe must not import torch')\n")
    (site / "torch" / "version.py").write_text("__version__ = '2.11.0+cu130'\ncuda: Optional[str] = '13.0'\n")
    info = site / "torch-2.11.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: torch\nVersion: 2.11.0\n")
    env = {"PYTHONPATH": f"{site}:{ROOT}", "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True)
    found = json.loads(out.stdout)
    assert (found["torch"], found["cuda"]) == ("2.11.0+cu130", "13.0")
