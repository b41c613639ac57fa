"""Whole-or-nothing file writes have one implementation (trainer/atomic.py), used by the run dir, the JIT cache
record, the report site and user-named outputs: a full disk leaves the old file and no temporary one."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
from conftest import ROOT

from reports.site_format import atomic_copy, atomic_write
from trainer import atomic, rundir

RENAMES = {"replace", "rename"}
WRITES = {"write_text", "write_bytes", "fdopen", "mkstemp", "NamedTemporaryFile", "copy2", "copyfile"}


def _opens_for_writing(call: ast.Call) -> bool:
    func = call.func
    if not ((isinstance(func, ast.Name) and func.id == "open") or (isinstance(func, ast.Attribute) and func.attr == "open")):
        return False
    modes = [*call.args[:2], *(k.value for k in call.keywords if k.arg == "mode")]
    return any(isinstance(m, ast.Constant) and isinstance(m.value, str) and set(m.value) & set("wax") for m in modes)


def _writes(call: ast.Call) -> bool:
    func = call.func
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
    return name in WRITES or _opens_for_writing(call)


def _renames(call: ast.Call) -> bool:
    func = call.func
    return isinstance(func, ast.Attribute) and func.attr in RENAMES and isinstance(func.value, ast.Name) and (
        func.value.id == "os")  # fmt: skip


def test_only_trainer_atomic_writes_a_file_and_renames_it_into_place() -> None:
    """A function that writes a file and os.replace/os.rename's something is a copy of trainer.atomic."""
    found = []
    for package in ("orchestrator", "launchers", "reports", "trainer"):
        for path in sorted((ROOT / package).rglob("*.py")):
            for fn in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    calls = [c for c in ast.walk(fn) if isinstance(c, ast.Call)]
                    if any(map(_renames, calls)) and any(map(_writes, calls)):
                        found.append(f"{path.relative_to(ROOT)}:{fn.lineno} {fn.name}")
    assert [f for f in found if not f.startswith("trainer/atomic.py:")] == []


FULL_DISK = r"""
import json, resource, signal, sys
from pathlib import Path
from orchestrator.errors import UsageError
from orchestrator.run.outfile import write_out
from reports.site_format import atomic_copy, atomic_write
from trainer import jit_cache, rundir

folder = Path(sys.argv[1])
big = "x" * 200_000
(folder / "big.bin").write_text(big)
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # past the limit write() fails with EFBIG, as on a full disk
soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
resource.setrlimit(resource.RLIMIT_FSIZE, (50_000, hard))
writers = {
    "status.json": lambda p: rundir.write_json(p, {"reason": big}),
    "metrics.jsonl": lambda p: rundir.write_metrics(p.parent, [{"step": i, "loss": big[:1000]} for i in range(100)]),
    "page.html": lambda p: atomic_write(p, big),
    "copy.bin": lambda p: atomic_copy(folder / "big.bin", p),
    "out.json": lambda p: write_out(p, big),
    "logs/jit-cache-rank0.json": lambda p: jit_cache.write_record({"rank": 0, "blob": big}, p.parent.parent),
}
failed = {}
for name, write in writers.items():
    path = folder / name
    try:
        write(path)
        failed[name] = "no error"
    except UsageError as err:
        failed[name] = "UsageError: " + str(err)
    except OSError as err:
        failed[name] = f"OSError {err.errno}"
print(json.dumps(failed))
"""


def test_a_full_disk_leaves_the_old_file_and_no_temporary_file(tmp_path: Path) -> None:
    names = ["status.json", "metrics.jsonl", "page.html", "copy.bin", "out.json", "logs/jit-cache-rank0.json"]
    (tmp_path / "logs").mkdir()
    for name in names:
        (tmp_path / name).write_text("old\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", FULL_DISK, str(tmp_path)], capture_output=True, text=True,
                          env=env, timeout=120, check=True)  # fmt: skip
    failed = json.loads(done.stdout)
    assert all(failed[n].startswith(("OSError 27", "UsageError")) for n in names), failed  # 27: EFBIG
    assert "--out" in failed["out.json"] and "File too large" in failed["out.json"]
    assert {n: (tmp_path / n).read_text() for n in names} == dict.fromkeys(names, "old\n")
    left = sorted(p.name for p in tmp_path.rglob("*") if p.is_file())
    assert left == sorted(["big.bin", *(Path(n).name for n in names)])  # no temporary file anywhere


def test_a_new_file_gets_the_mode_any_new_file_gets_not_0600(tmp_path: Path) -> None:
    """mkstemp's 0600 made report pages unreadable to the colleagues the site is for."""
    (tmp_path / "plain.html").write_text("x")
    atomic_write(tmp_path / "page.html", "<p>x</p>")
    rundir.write_json(tmp_path / "status.json", {"state": "completed"})
    expected = (tmp_path / "plain.html").stat().st_mode & 0o777
    assert (tmp_path / "page.html").stat().st_mode & 0o777 == expected
    assert (tmp_path / "status.json").stat().st_mode & 0o777 == expected


def test_a_copy_keeps_contents_mode_and_times_like_copy2(tmp_path: Path) -> None:
    source = tmp_path / "figure.js"
    source.write_bytes(b"\x00\xffdata")
    source.chmod(0o640)
    os.utime(source, (1_000_000, 2_000_000))
    (tmp_path / "target.js").write_text("old")
    atomic_copy(source, tmp_path / "target.js")
    got = (tmp_path / "target.js").stat()
    assert (tmp_path / "target.js").read_bytes() == b"\x00\xffdata"
    assert (got.st_mode & 0o777, got.st_mtime) == (0o640, 2_000_000)


def test_lone_surrogates_in_a_page_are_replaced_not_an_error(tmp_path: Path) -> None:
    atomic_write(tmp_path / "page.html", "name \udcff end")
    assert (tmp_path / "page.html").read_text() == "name ? end"


def test_an_exception_inside_the_block_keeps_the_old_file(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text("old\n")
    with pytest.raises(KeyboardInterrupt), atomic.replacing(path) as handle:
        handle.write("new, half")
        raise KeyboardInterrupt
    assert path.read_text() == "old\n" and os.listdir(tmp_path) == ["metrics.jsonl"]


def test_two_writers_of_one_file_at_once_each_have_their_own_temporary_file(tmp_path: Path) -> None:
    path = tmp_path / "status.json"
    with atomic.replacing(path) as first, atomic.replacing(path) as second:
        first.write("first")
        second.write("second")
    assert path.read_text() == "first"  # the block that ends last wins (the outer one)
    assert os.listdir(tmp_path) == ["status.json"]


def test_threads_writing_one_status_file_never_fail_or_mix(tmp_path: Path) -> None:
    """The old temporary name (.status.json.tmp-<pid>) was shared by every thread of a process."""
    path, errors = tmp_path / "status.json", []

    def write(n: int) -> None:
        try:
            for i in range(40):
                rundir.write_json(path, {"writer": n, "i": i, "pad": "x" * 5000})
        except OSError as err:
            errors.append(err)

    threads = [threading.Thread(target=write, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert json.loads(path.read_text())["i"] == 39
    assert os.listdir(tmp_path) == ["status.json"]


def test_a_long_file_name_still_fits_its_temporary_name(tmp_path: Path) -> None:
    path = tmp_path / ("n" * 250)
    atomic.write_text(path, "ok")
    assert path.read_text() == "ok" and os.listdir(tmp_path) == [path.name]


def test_trainer_atomic_is_standard_library_only() -> None:
    code = textwrap.dedent("""
        import sys
        before = set(sys.modules)
        import trainer.atomic
        print(sorted(m for m in set(sys.modules) - before if m.split(".")[0] in {"torch", "yaml", "pydantic"}))
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert done.stdout.strip() == "[]"
