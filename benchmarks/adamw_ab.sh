#!/usr/bin/env bash
# GPU A/B of the trainer's optimizer (issue 22, 2026-12-05): trainer/adamw.py's FusedAdamW against
# torch.optim.AdamW(fused=True), the optimizer it replaced, on the MoE proxy with fp32 main grads (the path that
# uses it; bf16 main grads take the precision-aware AdamW). One device call, from the checkout's root:
#   git show 14a6919~1:trainer/optim.py > ab_old_optim.py     # the torch.optim version, untracked (it travels)
#   bash benchmarks/adamw_ab.sh                                # with .whl/ (pydantic set, pytest 9.2) carried
# Runs tests/test_trainer_adamw.py (the CUDA case: bit for bit torch's kernel), then old/new/old/new proxy runs
# (2 layers, 14 steps, window the last 10) and prints each run's TFLOP/s line and its losses.
set -u
export PYTHONUNBUFFERED=1 OUT=${OUT:-/tmp/adamw_ab}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site || exit
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; python3 -c "import torch; print(torch.__version__)"
python3 -m pytest -q -p no:cacheprovider -ra tests/test_trainer_adamw.py 2>&1 | tee "$OUT/pytest.txt" | tail -4
rm -rf /tmp/old && mkdir /tmp/old && cp -r trainer reports benchmarks /tmp/old/ && cp ab_old_optim.py /tmp/old/trainer/optim.py
S=(--only moe --set optimizer.main_grads=fp32 --set model.num_layers=2 --set training.steps=14)
for r in 0 1; do
  (cd /tmp/old && timeout 200 python3 benchmarks/trainer_proxies.py --out "$OUT/old$r" "${S[@]}" | tail -1)
  timeout 200 python3 benchmarks/trainer_proxies.py --out "$OUT/new$r" "${S[@]}" | tail -1
done
for d in old0 new0 old1 new1; do
  python3 -c "import json, sys; rows = [json.loads(l) for l in open(sys.argv[1])]; \
print(sys.argv[2], [r['loss'] for r in rows if 'loss' in r])" "$OUT/$d/moe-base-r0/metrics.jsonl" "$d"
done
