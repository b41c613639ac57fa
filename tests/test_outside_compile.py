"""`trainer.eager.outside_compile`: importing the trainer no longer imports torch._dynamo, and a marked function is
still never traced by torch.compile (the same graphs as `@torch.compiler.disable` at import once installed)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from conftest import ROOT

from trainer.eager import outside_compile

LAYER = """
import torch
from trainer.eager import outside_compile
TRACED = []  # per call of a marked body: was dynamo tracing it?


@DECO
def triple(x):
    TRACED.append(torch.compiler.is_compiling())
    return x * 3


class Layer(torch.nn.Module):
    def forward(self, x):
        return self.shift(triple(x.sin())).cos() + 1

    @DECO
    def shift(self, x):
        TRACED.append(torch.compiler.is_compiling())
        return x - 2
"""

# One fresh process (torch._dynamo not imported yet), in order: the trainer's modules are imported; a layer whose
# function and method are marked runs eagerly; install() (what trainer.parallelize does before torch.compile); the
# layer compiled; a second marked copy, imported after install(), compiled (its markers are first called while
# traced); the reference, decorated with torch.compiler.disable at import (the old way), compiled.
PROBE = """
import json, sys, torch
import trainer.train, trainer.loop, trainer.moe, trainer.moe_pipeline, trainer.grad_accum, trainer.parallelize
from trainer.eager import install
out = {"dynamo_after_trainer_import": "torch._dynamo" in sys.modules}


def compiled(module):
    graphs = []

    def backend(gm, inputs):
        graphs.append(sorted(str(n.target) for n in gm.graph.nodes if n.op == "call_function"))
        return gm.forward

    layer = module.Layer()
    run = torch.compile(layer, backend=backend)
    same = all(torch.equal(run(torch.full((3,), float(i))), layer(torch.full((3,), float(i)))) for i in range(3))
    return {"graphs": graphs, "same": same, "traced": any(module.TRACED)}


def trainer_markers():
    return [trainer.grad_accum.grouped_mm, trainer.moe._grouped_mm_outside_compile,
            vars(trainer.moe.GroupedExperts)["_forward_recomputing"], vars(trainer.moe_pipeline.MoEPipeline)["_eager"]]


import probe_installed
expected = torch.ones(3).sin().mul(3).sub(2).cos().add(1)
out["eager_ok"] = torch.equal(probe_installed.Layer()(torch.ones(3)), expected)
out["dynamo_after_eager_call"] = "torch._dynamo" in sys.modules
marked = trainer_markers()
install()
disabled_code = torch.compiler.disable(lambda: None).__code__
out["trainer_replaced"] = [now is not m and now.__code__ is disabled_code and now.__wrapped__ is m.__wrapped__
                           for now, m in zip(trainer_markers(), marked)]
out["installed"] = compiled(probe_installed)
import probe_first_call
out["first_call"] = compiled(probe_first_call)
import probe_reference
out["reference"] = compiled(probe_reference)
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def probe(tmp_path_factory: pytest.TempPathFactory) -> dict:
    folder = tmp_path_factory.mktemp("outside_compile")
    for name, deco in [("installed", "outside_compile"), ("first_call", "outside_compile"),
                       ("reference", "torch.compiler.disable")]:
        (folder / f"probe_{name}.py").write_text(LAYER.replace("DECO", deco))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(folder), str(ROOT)])}
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, cwd=ROOT, env=env,
                          timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_importing_the_trainers_training_modules_does_not_import_dynamo(probe: dict) -> None:
    assert probe["dynamo_after_trainer_import"] is False
    assert probe["eager_ok"] and probe["dynamo_after_eager_call"] is False  # marked code runs as it is


def test_installed_markers_compile_exactly_like_disable_at_import(probe: dict) -> None:
    reference = probe["reference"]
    assert reference["graphs"] and reference["same"] and not reference["traced"]
    assert probe["installed"] == reference  # the same graphs, results and nothing traced


def test_a_marker_first_called_while_traced_is_still_not_traced(probe: dict) -> None:
    first = probe["first_call"]
    assert first["same"] and not first["traced"]
    ops = sorted(op for graph in first["graphs"] for op in graph)
    assert ops == sorted(op for graph in probe["reference"]["graphs"] for op in graph)  # a graph break more


def test_install_turns_the_trainers_markers_into_torch_compiler_disable(probe: dict) -> None:
    assert probe["trainer_replaced"] == [True] * 4


def test_a_nested_function_is_refused() -> None:
    def inner(x: torch.Tensor) -> torch.Tensor:
        return x

    with pytest.raises(TypeError, match="nested function"):
        outside_compile(inner)
