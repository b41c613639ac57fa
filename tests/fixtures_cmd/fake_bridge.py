"""A stand-in for Megatron-Bridge's run_recipe.py / trainer.bridge_entry: replays a log recorded from a real Bridge
run (tests/data/bridge-0.6.2/h100_sweep/), honouring the overrides a campaign passes.

    python fake_bridge.py --replay LOG [--replay-when KEY=VALUE LOG ...] [--config YAML] --recipe NAME
                          [--dataset mock] [-mb N ...] [key=value ...]

- `--replay-when KEY=VALUE LOG` replays LOG instead when the overrides set KEY to VALUE (as written), so each
  point of a sweep replays the log its real run left;
- `train.train_iters=N` stops the replay after iteration N (as Bridge would): the lines that follow iteration N
  (its memory report) are printed, the next iteration's `Step Time` line is not;
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
STEP_TIME = "Step Time :"  # Bridge prints it just before each iteration line


def replay(log: Path, last: int, sleep_s: float) -> None:
    """Print `log` up to what Bridge prints after iteration `last`."""
    finished = False
    with log.open(encoding="utf-8", errors="replace") as lines:
        for line in lines:
            found = ITERATION.search(line)
            if finished and (found or STEP_TIME in line):
                return
            sys.stdout.write(line)
            sys.stdout.flush()
            if found:
                finished = int(found.group(1)) >= last
                time.sleep(sleep_s)


def main() -> int:
    parser = argparse.ArgumentParser(prog="fake_bridge.py")
    parser.add_argument("--replay", required=True, type=Path)
    parser.add_argument("--replay-when", nargs=2, action="append", default=[], metavar=("KEY=VALUE", "LOG"))
    parser.add_argument("--config", type=Path, default=None)
    parser.add_argument("--sleep-s", type=float, default=0.01)
    args, rest = parser.parse_known_args()
    fields = dict(field_overrides(rest))
    if args.config and fields.get("logger.save_config_filepath"):
        target = Path(fields["logger.save_config_filepath"])
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(args.config, target)
    log = args.replay
    for condition, other in args.replay_when:
        key, _, value = condition.partition("=")
        if fields.get(key) == value:
            log = Path(other)
    replay(log, int(fields.get("train.train_iters") or 1 << 30), args.sleep_s)
    return 0


if __name__ == "__main__":
    sys.exit(main())
