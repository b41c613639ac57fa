"""A stand-in for Megatron-Bridge's run_recipe.py / trainer.bridge_entry: replays a log recorded from a real Bridge
run (tests/data/bridge-0.6.2/), honouring the overrides a campaign passes.

    python fake_bridge.py --replay LOG [--config YAML] --recipe NAME [--dataset mock] [-mb N ...] [key=value ...]

- `train.train_iters=N` stops the replay after iteration N (as Bridge would);
- `logger.save_config_filepath=PATH` gets the recorded resolved config (--config), as Bridge writes it at setup;
- every other line of LOG is printed as recorded (flushed), a short sleep after each iteration line, so a
  follower sees the run progress.
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
import time
from pathlib import Path

try:  # mbx puts its checkout on the trainer's PYTHONPATH; run by hand, the checkout this file lies in
    from trainer.bridge_args import field_overrides
except ImportError:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from trainer.bridge_args import field_overrides

ITERATION = re.compile(r"\biteration\s+(\d+)/\s*\d+\s*\|")


def main() -> int:
    parser = argparse.ArgumentParser(prog="fake_bridge.py")
    parser.add_argument("--replay", required=True, type=Path)
    parser.add_argument("--config", type=Path, default=None)
    parser.add_argument("--sleep-s", type=float, default=0.01)
    args, rest = parser.parse_known_args()
    fields = dict(field_overrides(rest))
    if args.config and fields.get("logger.save_config_filepath"):
        target = Path(fields["logger.save_config_filepath"])
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(args.config, target)
    last = int(fields.get("train.train_iters") or 1 << 30)
    with args.replay.open(encoding="utf-8", errors="replace") as log:
        for line in log:
            found = ITERATION.search(line)
            if found and int(found.group(1)) > last:
                break
            sys.stdout.write(line)
            sys.stdout.flush()
            if found:
                time.sleep(args.sleep_s)
    return 0


if __name__ == "__main__":
    sys.exit(main())
