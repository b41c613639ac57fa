#!/usr/bin/env bash
# Issue 33 on one GPU machine (H100 80 GB or H200), one step per device call, calls back to back (the machine and
# everything under /root go back ~30 s after a call). Before `install`, each part of `benchmarks/bridge_bringup.py
# prepare` is copied to /root/bridge-parts by its own call (`prepare` prints those calls; 7 parts of 55 MiB on
# 2026-12-06, each call ~4 s once the machine is up; the last one runs `go`). The first install leaves the built TE
# extension in $OUT/te_torch_ext.tgz: `prepare --prebuilt-ext FILE` carries it to the next lease (−2 min).
#
#   bash benchmarks/bridge_session.sh go        # install, then start the sweep in the background and wait ≤ 420 s
#   bash benchmarks/bridge_session.sh install   # join, install what the image lacks, build TE's extension, import
#   bash benchmarks/bridge_session.sh smoke     # one Bridge run of 3 iterations on 2 layers (start-up time, errors)
#   bash benchmarks/bridge_session.sh sweep     # start the 1-GPU Bridge campaign in the background, wait ≤ 540 s
#   bash benchmarks/bridge_session.sh wait      # wait for it (≤ 540 s more), then pack the workspace into $OUT
#   bash benchmarks/bridge_session.sh compare   # compare --run: TE vs native cross entropy on the real trainer
#   bash benchmarks/bridge_session.sh bundled   # the bundled trainer on the same shapes, then pack into $OUT
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=/root/bridge-site:$PWD HF_HOME=/root/hf HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/out}
WS=/root/ws
MBX=(python3 -m orchestrator)
mkdir -p "$OUT" "$WS"

CAMPAIGN=bridge-qwen3-30b-a3b-1gpu
START=/root/sweep.start  # touched when a sweep starts: older run records (an earlier `go`) are not this sweep's

first_failed() {  # true when this sweep's attempts ended, none completed and one failed for good (not retryable)
  local records; records=$(find "$WS" -name status.json -newer "$START" 2>/dev/null)
  [ -n "$records" ] && ! grep -q '"completed"' $records \
    && grep -l '"state": "failed"' $records | xargs -r grep -q '"retryable": false'
}

wait_for() {  # wait_for PIDFILE SECONDS: progress every 30 s until the background mbx ends, fails first or time is up
  local pid; pid=$(cat "$1"); local end=$((SECONDS + $2)) tick=0
  while kill -0 "$pid" 2>/dev/null && [ $SECONDS -lt $end ]; do
    sleep 10; tick=$((tick + 1))
    if [ "${STOP_ON_FIRST_FAILURE:-1}" = 1 ] && first_failed; then
      echo "FIRST ATTEMPT FAILED, none completed: cancelling the campaign"
      "${MBX[@]}" campaign cancel "$CAMPAIGN" -w "$WS"; sleep 5; kill -- -"$pid" 2>/dev/null
      find "$WS" -name status.json -newer "$START" -exec cat {} \; ; find "$WS" -path '*logs*' -name '*.log' -newer "$START" -exec tail -30 {} \;
      break
    fi
    [ $((tick % 3)) = 0 ] && { echo "--- $(date +%T)"; tail -c 600 "$WS/mbx.log" | tr '\r' '\n' | tail -4; }
  done
  kill -0 "$pid" 2>/dev/null && echo "STILL RUNNING" || { echo "DONE"; tail -40 "$WS/mbx.log"; }
}

pack() {  # the workspace without checkpoints, and the logs, into $OUT (≤ 16 MiB a file)
  tar -C /root -czf "$OUT/ws.tgz" --exclude='*.nsys-rep' --exclude='checkpoint' ws
  ls -la "$OUT"
}

case "${1:-}" in
  install)
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
    python3 -m pip list --format=freeze > "$OUT/image-pip-list.txt" 2>/dev/null
    time python3 benchmarks/bridge_bringup.py install --parts /root/bridge-parts --manifest-dir .whl/bridge \
      --target /root/bridge-site --hf-home /root/hf 2>&1 | tee "$OUT/install.log" | tail -60
    ;;
  smoke)
    time timeout 400 python3 -m trainer.bridge_entry --recipe qwen3_30b_a3b_pretrain_16gpu_h100_bf16_config \
      --dataset mock train.train_iters=3 train.global_batch_size=8 train.micro_batch_size=1 logger.log_interval=1 \
      checkpoint.save=null tokenizer.tokenizer_type=NullTokenizer tokenizer.vocab_size=151936 model.num_layers=2 \
      model.expert_model_parallel_size=1 model.moe_token_dispatcher_type=alltoall model.moe_flex_dispatcher_backend=null \
      model.cuda_graph_impl=none "model.cuda_graph_scope=[]" comm_overlap.tp_comm_overlap=false \
      comm_overlap.overlap_moe_expert_parallel_comm=false dataset.num_workers=2 \
      logger.save_config_filepath="$OUT/smoke-config.yaml" > "$OUT/smoke.log" 2>&1
    echo "exit $?"; grep -E "iteration|Step Time|memory|Error|error" "$OUT/smoke.log" | tail -25; tail -30 "$OUT/smoke.log"
    ;;
  go)
    bash "$0" install || exit 1
    touch "$START"; setsid nohup "${MBX[@]}" campaign run campaigns/bridge_qwen3_30b_a3b_1gpu.yaml -w "$WS" > "$WS/mbx.log" 2>&1 &
    echo $! > /root/mbx.pid
    wait_for /root/mbx.pid "${GO_WAIT_S:-400}"; pack
    ;;
  after)  # compare --run (TE vs native cross entropy), then the bundled trainer; pack the workspace
    bash "$0" compare; bash "$0" bundled
    ;;
  sweep)
    touch "$START"; setsid nohup "${MBX[@]}" campaign run campaigns/bridge_qwen3_30b_a3b_1gpu.yaml -w "$WS" > "$WS/mbx.log" 2>&1 &
    echo $! > /root/mbx.pid
    wait_for /root/mbx.pid 540
    ;;
  wait)
    wait_for /root/mbx.pid 540; pack
    ;;
  compare)
    "${MBX[@]}" compare --run campaigns/bridge_ce_te_1gpu.yaml campaigns/bridge_ce_native_1gpu.yaml -w "$WS" \
      --markdown 2>&1 | tee "$OUT/compare.md" | tail -60
    ;;
  bundled)
    "${MBX[@]}" campaign run campaigns/bundled_qwen3_shapes_1gpu.yaml -w "$WS" 2>&1 | tail -30; pack
    ;;
  *) echo "usage: $0 install|smoke|sweep|wait|compare|bundled" >&2; exit 2 ;;
esac
