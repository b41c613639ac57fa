#!/usr/bin/env bash
# The fifth session's H200 runs, in three device calls made back to back (the machine keeps /root between calls
# only while it stays warm). Run from a clean snapshot of the checkout with TE brought by te_bringup.py install
# (/root/te-site) and the trainer's deps in /root/mbx-site; .mbxwhl/ (pydantic, plotly, submitit wheels) beside.
#   bash benchmarks/h200_session5.sh a   # seed 004 case A interleaved A/B until conclusive; profiles (traces)
#   bash benchmarks/h200_session5.sh b   # seed 000 bf16 vs fp8 parity, seed 001 toggle matrix (bf16), GPU tests
#   bash benchmarks/h200_session5.sh c   # issue 15 levers: precision-aware optimizer, bf16 moments, TE CE, FP8
#   bash benchmarks/h200_session5.sh d   # no TE: the dispatch campaign with `profile:` (report site with where
#                                        # the time goes) and a seed 001 A/A subset (bf16, 2 repeats)
set -u
PHASE=${1:?phase a, b or c}
OUT=${OUT:-/tmp/s5}
mkdir -p "$OUT"
[ -d /root/mbx-extra ] || python3 -m pip install -q --no-index --no-deps --no-compile --target /root/mbx-extra \
  ../.mbxwhl/*.whl
export PYTHONPATH=/root/mbx-extra:/root/mbx-site:/root/te-site:$PWD PYTHONUNBUFFERED=1
WS=/root/ws
step() { local limit=$1; shift; echo "=== $* (limit ${limit}s) $(date +%T)"; timeout "$limit" "$@"; echo "=== rc $? $(date +%T)"; }
mbx() { local limit=$1; shift; step "$limit" python3 -m orchestrator "$@"; }
trim() { [ -f "$1" ] && python3 benchmarks/trim_trace.py "$1" "$2" --top 30 >>"$OUT/kernels_top.txt"; }

case $PHASE in
a)
  mbx 230 compare --run campaigns/seed004_case_a_fused_h200.yaml campaigns/seed004_case_a_native_h200.yaml \
    --workspace $WS --until-conclusive --budget 4 --markdown --html /root/html/seed004 >"$OUT/seed004_compare.md"
  tar czf "$OUT/seed004_html.tgz" -C /root html 2>/dev/null
  step 110 python3 benchmarks/trainer_proxies.py --out /root/prof --only moe --set training.steps=10 --profile 8:1
  trim /root/prof/moe-base-r0/profile-trace.json "$OUT/moe_proxy_step8.trace.json.gz"
  step 90 python3 benchmarks/trainer_proxies.py --out /root/slice --only moe --set model.num_layers=2 \
    --set training.global_batch_size=2 --set training.steps=10 --profile 8:1 \
    --variant chunk-sms:model.moe.dispatch_chunk_tokens=2048,model.moe.dispatcher_sms=16
  trim /root/slice/moe-base-r0/profile-trace.json "$OUT/slice_base.trace.json.gz"
  trim /root/slice/moe-chunk-sms-r0/profile-trace.json "$OUT/slice_chunk_sms.trace.json.gz"
  cp /root/prof/results.json "$OUT/moe_profiled.json" 2>/dev/null
  ;;
b)
  sed 's/precision: \[bf16, fp8\]/precision: [bf16]/' campaigns/seed001_toggle_matrix_h200.yaml >/root/seed001_bf16.yaml
  mbx 250 campaign run campaigns/seed000_precision_parity_h200.yaml --workspace $WS --parallel 3 --no-wandb
  mbx 30 report seed000-precision-parity-h200 --workspace $WS --markdown >"$OUT/seed000.md"
  mbx 150 campaign run /root/seed001_bf16.yaml --workspace $WS --parallel 3 --no-wandb
  mbx 30 report seed001-toggle-matrix-h200 --workspace $WS --markdown >"$OUT/seed001.md"
  step 80 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_trainer_parity.py tests/test_trainer_adamw_pa.py
  ;;
c)
  step 200 python3 benchmarks/trainer_proxies.py --out /root/moe --only moe --set training.steps=12 \
    --variant m16:optimizer.moments=bf16 --variant m16-tece:optimizer.moments=bf16,cross_entropy=te
  cp /root/moe/results.json "$OUT/moe_variants.json" 2>/dev/null
  step 200 python3 benchmarks/trainer_proxies.py --out /root/dense --only dense --set training.steps=12 \
    --set compile=true --set optimizer.main_grads=bf16 --variant tece:cross_entropy=te \
    --variant fp8-tece:precision=fp8,cross_entropy=te
  cp /root/dense/results.json "$OUT/dense_variants.json" 2>/dev/null
  ;;
d)
  WS=/root/ws-prof
  mbx 170 campaign run campaigns/moe_dispatch_h200.yaml --workspace $WS --no-wandb
  mbx 30 report moe-dispatch-h200 --workspace $WS --markdown >"$OUT/dispatch.md"
  tar czf "$OUT/dispatch_site.tgz" -C $WS/moe-dispatch-h200 report 2>/dev/null
  mkdir -p /root/traces
  for trace in $WS/moe-dispatch-h200/*/*/profile-trace.json; do
    cell=$(basename "$(dirname "$(dirname "$trace")")")
    python3 benchmarks/trim_trace.py "$trace" "/root/traces/dispatch_${cell}.trace.json.gz" --top 12 >>"$OUT/kernels_top.txt"
  done
  tar cf "$OUT/dispatch_traces.tar" -C /root traces
  step 30 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_energy.py
  sed -e 's/precision: \[bf16, fp8\]/precision: [bf16]/' -e 's/optimizer.master_weights: \[true, false\]/optimizer.master_weights: [true]/' \
    -e 's/optimizer.main_grads: \[fp32, bf16\]/optimizer.main_grads: [fp32]/' campaigns/seed001_toggle_matrix_h200.yaml >/root/seed001_aa.yaml
  mbx 75 campaign run /root/seed001_aa.yaml --workspace $WS --parallel 3 --no-wandb
  mbx 20 report seed001-toggle-matrix-h200 --workspace $WS --markdown >"$OUT/seed001_aa.md"
  ;;
esac
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c "import torch; print('torch', torch.__version__)"
