#!/usr/bin/env bash
# The seventh session's runs on 2 H200s (issue 24: expert parallelism with the best single-GPU settings), one
# device call each, made back to back on an `nvidia-h200-x2` machine (it keeps /root between calls only while it
# stays warm). Run from the checkout's root with TE brought by te_bringup.py install (/root/te-site, with
# megatron-core and the pydantic set; /root/mbx-site) when possible; without TE the trainer falls back to native
# cross entropy and torch's expert weight gradient (printed), and phase d cannot run. The wheels mbx's CLI needs
# (submitit, plotly, narwhals) in $WHL (default ../.mbxwhl, as sessions 5 and 6), for phase c.
#   bash benchmarks/h200x2_session7.sh a    # correctness: the GPU wgrad test; EP=2 vs EP=1 on 2 GPUs, 6 steps   ~4 min
#   bash benchmarks/h200x2_session7.sh b    # EP scaling, best settings, EP 1 and 2, padded + dropless, profiled ~5 min
#   bash benchmarks/h200x2_session7.sh b2   # the same for chunked EP=2 (± 16 dispatcher SMs) and capacity 1.25  ~5 min
#   bash benchmarks/h200x2_session7.sh c    # campaigns/moe_ep_h200x2.yaml through `mbx campaign run` (pip --target) ~8 min
#   bash benchmarks/h200x2_session7.sh d    # megatron-core + TE EP=2 peers (plain, batch-level a2a overlap)       ~4 min
# Results land under $OUT (at most 8 files come back from a device call: summaries, logs, two trimmed traces).
set -u
PHASE=${1:?phase a, b, b2, c or d}
OUT=${OUT:-/tmp/s7}
WHL=${WHL:-../.mbxwhl}
mkdir -p "$OUT"
if [ ! -d /root/mbx-extra ] && ls "$WHL"/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /root/mbx-extra "$WHL"/*.whl
fi
export PYTHONPATH=/root/mbx-extra:/root/mbx-site:/root/te-site:$PWD PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1  # never NVLink multicast
step() { local limit=$1; shift; echo "=== $* (limit ${limit}s) $(date +%T)"; timeout "$limit" "$@"; echo "=== rc $? $(date +%T)"; }
trim() { [ -f "$1" ] && python3 benchmarks/trim_trace.py "$1" "$2" --top 25 >>"$OUT/kernels_top.txt"; }

# The best single-GPU settings over the committed proxy (which has compile and bf16 main grads already).
if python3 -c "import sys; from trainer.te_support import te_import_error; e = te_import_error(); print(e or 'ok'); sys.exit(bool(e))"; then
  TE=1
  BEST=(--set cross_entropy=te --set optimizer.moments=bf16 --set optimizer.grad_accumulation_fusion=true
        --set model.moe.expert_wgrad=te)
  echo "settings: TE cross entropy, bf16 moments, fusion with TE expert wgrad, compile (Transformer Engine found)"
else
  TE=0
  BEST=(--set optimizer.moments=bf16 --set optimizer.grad_accumulation_fusion=true)
  echo "settings: NATIVE cross entropy, bf16 moments, fusion of the output layer only, compile (no Transformer Engine)"
fi
PADDED=model.moe.capacity_factor=1.0,model.moe.pad_to_capacity=true
CAP125=model.moe.capacity_factor=1.25,model.moe.pad_to_capacity=true
CHUNK=model.moe.dispatch_chunk_tokens=2048

case $PHASE in
a)
  nvidia-smi topo -m
  [ $TE = 1 ] && step 90 python3 -m pytest -q -p no:cacheprovider tests/test_trainer_grad_accum.py -k te_grouped
  # EP = 2 against EP = 1 on the same 2 GPUs and global batch (DP 2 either way): per-step loss and grad norm
  step 420 python3 benchmarks/ep_scaling.py --out /root/s7a --gpus 2 --parity --set model.num_layers=2 \
    --set training.steps=6 "${BEST[@]}" --variant "dropless-chunk:$CHUNK" --variant "padded:$PADDED" \
    | tee "$OUT/parity.log"
  ;;
b)
  step 560 python3 benchmarks/ep_scaling.py --out /root/s7b --gpus 1,2 --set training.steps=14 "${BEST[@]}" \
    --profile 3:1 --variant "padded:$PADDED" --variant dropless: | tee "$OUT/scaling_b.log"
  trim /root/s7b/padded-ep1/profile-trace.json "$OUT/ep1_padded.trace.json.gz"
  trim /root/s7b/padded-ep2/profile-trace.json "$OUT/ep2_padded.trace.json.gz"
  ;;
b2)
  step 270 python3 benchmarks/ep_scaling.py --out /root/s7b2 --gpus 2 --set training.steps=14 "${BEST[@]}" \
    --profile 3:1 --variant "padded-chunk:$PADDED,$CHUNK" --variant "padded-chunk-sms16:$PADDED,$CHUNK,model.moe.dispatcher_sms=16" \
    --variant "dropless-chunk:$CHUNK" | tee "$OUT/scaling_b2.log"
  step 260 python3 benchmarks/ep_scaling.py --out /root/s7b3 --gpus 1,2 --set training.steps=14 "${BEST[@]}" \
    --profile 3:1 --variant "cap125:$CAP125" | tee "$OUT/scaling_b3.log"
  trim /root/s7b2/padded-chunk-ep2/profile-trace.json "$OUT/ep2_padded_chunk.trace.json.gz"
  trim /root/s7b2/dropless-chunk-ep2/profile-trace.json "$OUT/ep2_dropless_chunk.trace.json.gz"
  ;;
c)
  # As a user would: mbx installed with pip --target next to the carried wheels, its console script, no checkout
  # on PYTHONPATH.
  [ -x /root/mbx-cli/bin/mbx ] || python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile \
    --upgrade --target /root/mbx-cli .
  CAMPAIGN=campaigns/moe_ep_h200x2.yaml
  if [ $TE = 0 ]; then  # no TE: the same sweep with native cross entropy and torch's expert weight gradient
    sed -e '/cross_entropy: te/d' -e '/expert_wgrad: te/d' $CAMPAIGN >/root/moe_ep_h200x2_native.yaml
    CAMPAIGN=/root/moe_ep_h200x2_native.yaml
  fi
  export PYTHONPATH=/root/mbx-cli:/root/mbx-extra:/root/mbx-site:/root/te-site
  # A campaign cut short by the limit resumes where it stopped when this phase runs again.
  step 540 /root/mbx-cli/bin/mbx campaign run $CAMPAIGN --workspace /root/ws7 --no-wandb
  step 40 /root/mbx-cli/bin/mbx report moe-ep-h200x2 --workspace /root/ws7 --markdown >"$OUT/campaign_x2.md"
  tar czf "$OUT/campaign_x2_site.tgz" -C /root/ws7/moe-ep-h200x2 report 2>/dev/null
  cat "$OUT/campaign_x2.md"
  ;;
d)
  step 560 python3 benchmarks/peers.py --out /root/peers7 --steps 12 --peer mcore-te-ep2 \
    --peer mcore-te-ep2-a2a-overlap | tee "$OUT/peers.log"
  cp /root/peers7/peers.json "$OUT/peers.json" 2>/dev/null
  ;;
*)
  echo "unknown phase $PHASE (a, b, b2, c or d)"; exit 2
  ;;
esac
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c "import torch; print('torch', torch.__version__, 'nccl', torch.cuda.nccl.version())"
