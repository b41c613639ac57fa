"""Code that runs on the compute nodes (standard library only; run by path with only the mbx checkout mounted).

Three entry points, each with its command line documented in its module:

- `launchers/node/rank.py` — the per-rank entry srun (or NeMo-Run) starts on every task:
  `PYTHON -u <mbx>/launchers/node/rank.py --tasks TABLE [--index N] [--port-base 20000]`;
- `launchers/node/pack.py` — the pack runner of a packed allocation (`launchers.<slurm backend>.pack: N`): one
  srun step per point, back to back: `PYTHON -u <mbx>/launchers/node/pack.py --pack PACK_FILE [--allocation N]`;
- `launchers/node/attempt.py` — the attempt wrapper around one command (rank 0 on Slurm; the whole attempt
  on the local backend): `PYTHON -m launchers.node.attempt --run-dir DIR --log FILE [--time-limit-s S] -- ARGV...`.

Helpers: `environ` (torch.distributed variables from Slurm's, the rank's environment) and `fingerprint`
(node.json). Every run-directory file is written through `trainer.rundir`. Nothing here imports a third-party
package, and this package's `__init__` imports nothing.
"""
