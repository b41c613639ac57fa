#!/usr/bin/env bash
# The issue-15 GPU session in one call (after te_bringup.py install): what BENCHMARKS.md's issue-15 section
# quotes. Run from the checkout root on the H200 with TE in /root/te-site and the trainer's deps in
# /root/mbx-site. Each step has its own time limit so the call ends inside the device tool's 10 minutes.
set -u
OUT=${OUT:-/tmp/issue15}
mkdir -p "$OUT"
TE=/root/te-site
export PYTHONPATH=/root/mbx-site
step() { local limit=$1; shift; echo "=== $* (limit ${limit}s)"; timeout "$limit" "$@"; echo "=== rc $?"; }
# 1. which cuDNN each kind of import leaves torch with, and the proxy's kernels after it
step 75 python3 benchmarks/te_import_ab.py kernels --te-site $TE --out "$OUT" --rounds 1 --arms none,te-import,te-guarded
# 2. FP8 (TE current scaling) dense proxy, through the guarded import
PYTHONPATH=$TE:/root/mbx-site step 85 python3 benchmarks/trainer_proxies.py --out /root/fp8d --only dense \
  --set precision=fp8 --set training.steps=12
cp /root/fp8d/results.json "$OUT/fp8_dense.json" 2>/dev/null
# 3. peers on the MoE proxy's shapes
PYTHONPATH=$TE:/root/mbx-site step 115 python3 benchmarks/peers.py --out /root/peers --steps 12 --peer mcore-te
cp /root/peers/peers.json "$OUT/peers_mcore.json" 2>/dev/null
PYTHONPATH=/root/mbx-site step 110 python3 benchmarks/peers.py --out /root/peers2 --steps 12 --peer hf-compiled
cp /root/peers2/peers.json "$OUT/peers_hf.json" 2>/dev/null
# 4. FP8 MoE proxy
PYTHONPATH=$TE:/root/mbx-site step 70 python3 benchmarks/trainer_proxies.py --out /root/fp8m --only moe \
  --set precision=fp8 --set training.steps=12
cp /root/fp8m/results.json "$OUT/fp8_moe.json" 2>/dev/null
grep -h "Error\|error" /root/fp8d/*/stdout.log /root/fp8m/*/stdout.log 2>/dev/null | tail -4
tail -3 /root/peers/mcore-te.log /root/peers2/hf-compiled.log 2>/dev/null | cut -c1-300
