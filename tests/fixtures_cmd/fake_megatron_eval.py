"""A stand-in for Megatron-LM's pretrain_gpt.py that evaluates: Megatron-LM log lines computed, not replayed.

    python fake_megatron_eval.py --train-iters N [--eval-interval K] [--spike-after-eval]

- one `iteration i/N | ... | lm loss: ... | grad norm: ... |` line per step (loss 10·e^(−0.05·i), grad norm
  1 + 0.01·i: the same numbers whether or not it evaluates), and after every K-th step a `validation loss at
  iteration i | lm loss value: ... |` block, as Megatron-LM prints them;
- --spike-after-eval plants Seed 001's bug (a gradient buffer not zeroed after evaluation): the step after each
  evaluation has its grad norm ×8 and its loss ×1.01, so train-eval-train differs from train-only;
- without --eval-interval it never evaluates (the train-only side of parity.eval_check, whose null leaves the
  flag out); other flags (the rendered Megatron params) are accepted and ignored.
"""

from __future__ import annotations

import argparse
import math
import sys


def iteration_line(step: int, total: int, loss: float, grad_norm: float) -> str:
    return (f" [2026-12-04 23:00:00] iteration {step:8d}/{total:8d} | consumed samples: {step * 8:12d} | "
            f"elapsed time per iteration (ms): 100.0 | throughput per GPU (TFLOP/s/GPU): 50.0 | "
            f"learning rate: 1.000000E-04 | global batch size:     8 | lm loss: {loss:.6E} | loss scale: 1.0 | "
            f"grad norm: {grad_norm:.3f} | number of skipped iterations:   0 | number of nan iterations:   0 |")


def validation_block(step: int, loss: float) -> str:
    rule = "-" * 100
    return (f" {rule}\n validation loss at iteration {step} | lm loss value: {loss:.6E} | "
            f"lm loss PPL: {math.exp(loss):.6E} | \n {rule}")


def main() -> int:
    parser = argparse.ArgumentParser(prog="fake_megatron_eval.py")
    parser.add_argument("--train-iters", type=int, required=True)
    parser.add_argument("--eval-interval", type=int, default=None)
    parser.add_argument("--spike-after-eval", action="store_true")
    args, _unknown = parser.parse_known_args()
    evaluated = False
    for step in range(1, args.train_iters + 1):
        loss, grad_norm = 10.0 * math.exp(-0.05 * step), 1.0 + 0.01 * step
        if evaluated and args.spike_after_eval:
            loss, grad_norm = loss * 1.01, grad_norm * 8
        print(iteration_line(step, args.train_iters, loss, grad_norm), flush=True)
        evaluated = bool(args.eval_interval) and step % args.eval_interval == 0
        if evaluated:
            print(validation_block(step, loss + 0.1), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
