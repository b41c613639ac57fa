#!/usr/bin/env bash
# Where the time goes on one H200: the dispatch campaign (campaigns/moe_dispatch_h200.yaml profiles steps 3-4 of
# every cell), its report section, the per-cell table, trimmed traces for tests/data/traces/ (one tarball: the
# device tool brings back at most 8 files), and the NVML energy test. Set up as
# benchmarks/h200_session5.sh is (/root/mbx-site trainer deps, /root/te-site, ../.mbxwhl/ wheels, which now
# hold nvidia-ml-py for trainer/energy.py); one device call, ~6 min.
#   OUT=/tmp/prof bash benchmarks/profile_dispatch_h200.sh
set -u
OUT=${OUT:-/tmp/prof}
WS=${WS:-/root/ws-prof}
mkdir -p "$OUT"
python3 -c "import pynvml" 2>/dev/null || python3 -m pip install -q --no-index --no-deps --no-compile \
  --target /root/mbx-extra ../.mbxwhl/nvidia_ml_py-*.whl
export PYTHONPATH=/root/mbx-extra:/root/mbx-site:/root/te-site:$PWD PYTHONUNBUFFERED=1
step() { local limit=$1; shift; echo "=== $* (limit ${limit}s) $(date +%T)"; timeout "$limit" "$@"; echo "=== rc $? $(date +%T)"; }
step 420 python3 -m orchestrator campaign run campaigns/moe_dispatch_h200.yaml --workspace "$WS" --no-wandb
step 60 python3 -m orchestrator report moe-dispatch-h200 --workspace "$WS" --markdown >"$OUT/dispatch_profile.md"
step 60 python3 -c "
import sys, glob
from pathlib import Path
from reports.profile_view import profile_markdown
dirs = sorted(glob.glob('$WS/moe-dispatch-h200/*/*/profile-trace.json'))
print(profile_markdown([{'label': Path(d).parent.parent.name, 'run_dir': Path(d).parent} for d in dirs]))
" >"$OUT/dispatch_breakdown.md"
for trace in "$WS"/moe-dispatch-h200/*/*/profile-trace.json; do
  cell=$(basename "$(dirname "$(dirname "$trace")")")
  mkdir -p /root/traces
  python3 benchmarks/trim_trace.py "$trace" "/root/traces/dispatch_${cell}.trace.json.gz" --top 15 >>"$OUT/dispatch_kernels_top.txt"
done
tar cf "$OUT/dispatch_traces.tar" -C /root traces 2>/dev/null
tar czf "$OUT/dispatch_report.tgz" -C "$WS/moe-dispatch-h200" report 2>/dev/null
step 120 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_energy.py
cat "$OUT/dispatch_breakdown.md"
