"""The launcher backends: every module in this package is one backend and registers its class by name."""

# backend name -> its module here, so that a campaign's backends load alone (`mbx campaign validate` checks the
# settings of the ones it names); launchers/registry.py refuses a module that registers a name not listed here.
MODULES = {"local": "local", "nemo-run": "nemo_run", "nemo-run-local": "nemo_run_local", "submitit": "submitit_slurm"}
