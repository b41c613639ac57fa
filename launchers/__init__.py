"""Where points run: one Launcher interface, backends found by name (local, submitit, nemo-run, dry-run)."""
