"""An ingested campaign (past logs, nothing mbx can rerun) is refused by freeze and card export with one line, exit 2
(it was an internal error: KeyError "no such trainer kind 'ingested'")."""

from __future__ import annotations

from pathlib import Path

from conftest import ROOT

LM_LOG = ROOT / "tests" / "data" / "megatron" / "logs" / "megatron_lm__attn_bench_sink_te_1gpu_correctness__stdout.log"


def test_freeze_and_card_export_refuse_an_ingested_campaign(mbx, tmp_path: Path) -> None:
    workspace = str(tmp_path / "ws")
    ingested = mbx("ingest", "past", str(LM_LOG), "--workspace", workspace)
    assert ingested.returncode == 0, ingested.stdout + ingested.stderr
    for args in (("freeze", "past"), ("card", "export", "past", "-p", "p000")):
        result = mbx(*args, "--workspace", workspace)
        text = result.stdout + result.stderr
        assert result.returncode == 2, text
        assert "Traceback" not in text and "internal error" not in text and "MBX_DEBUG" not in text, text
        (line,) = [x for x in result.stderr.splitlines() if x.strip()]
        assert "ingested from logs (mbx ingest)" in line and "mbx compare" in line, line
