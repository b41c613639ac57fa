#!/usr/bin/env bash
# The sixth session's H200 runs (issue 15: gradient-accumulation fusion), in device calls made back to back
# (the machine keeps /root between calls only while it stays warm). Run from a clean snapshot of the checkout
# with TE brought by te_bringup.py install (/root/te-site) and the trainer's deps in /root/mbx-site; .mbxwhl/
# (pydantic, plotly, submitit wheels) beside.
#   bash benchmarks/h200_session6.sh e   # GPU test of the TE grouped wgrad, the wgrad microbenchmark, MoE proxy fused
#   bash benchmarks/h200_session6.sh f   # MoE proxy unfused (same lease), dense proxy FP8 fused and unfused
#   bash benchmarks/h200_session6.sh g   # peers in the same lease: HF compiled, megatron-core + TE (CUTLASS)
set -u
PHASE=${1:?phase e, f or g}
OUT=${OUT:-/tmp/s6}
mkdir -p "$OUT"
[ -d /root/mbx-extra ] || python3 -m pip install -q --no-index --no-deps --no-compile --target /root/mbx-extra \
  ../.mbxwhl/*.whl
export PYTHONPATH=/root/mbx-extra:/root/mbx-site:/root/te-site:$PWD PYTHONUNBUFFERED=1
step() { local limit=$1; shift; echo "=== $* (limit ${limit}s) $(date +%T)"; timeout "$limit" "$@"; echo "=== rc $? $(date +%T)"; }
MOE=(--only moe --set training.steps=12 --set optimizer.moments=bf16 --set cross_entropy=te)
DENSE=(--only dense --set training.steps=12 --set compile=true --set optimizer.main_grads=bf16 --set cross_entropy=te)
FUSE=optimizer.grad_accumulation_fusion=true

case $PHASE in
e)
  step 90 python3 -m pytest -q -p no:cacheprovider tests/test_trainer_grad_accum.py -k "te_grouped or linear or grouped_mm"
  step 90 python3 benchmarks/wgrad_accum.py >"$OUT/wgrad_accum.jsonl"
  cat "$OUT/wgrad_accum.jsonl"
  step 300 python3 benchmarks/trainer_proxies.py --out /root/moe-fused "${MOE[@]}" --set $FUSE \
    --set model.moe.expert_wgrad=te --repeats 3
  cp /root/moe-fused/results.json "$OUT/moe_fused.json" 2>/dev/null
  ;;
f)
  step 200 python3 benchmarks/trainer_proxies.py --out /root/moe-plain "${MOE[@]}" --variant lmhead:$FUSE
  cp /root/moe-plain/results.json "$OUT/moe_plain.json" 2>/dev/null
  step 330 python3 benchmarks/trainer_proxies.py --out /root/dense-fp8 "${DENSE[@]}" --set precision=fp8 \
    --set $FUSE --repeats 3 --variant unfused:optimizer.grad_accumulation_fusion=false
  cp /root/dense-fp8/results.json "$OUT/dense_fp8.json" 2>/dev/null
  ;;
g)
  step 200 python3 benchmarks/peers.py --out /root/peers --steps 12 --peer hf-compiled --peer mcore-te-cutlass
  cp /root/peers/*.json "$OUT/" 2>/dev/null
  step 150 python3 benchmarks/trainer_proxies.py --out /root/dense-bf16 "${DENSE[@]}" --set $FUSE
  cp /root/dense-bf16/results.json "$OUT/dense_bf16_fused.json" 2>/dev/null
  ;;
esac
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c "import torch; print('torch', torch.__version__)"
