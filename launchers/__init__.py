"""Where points run: one Launcher interface (base), backends found by name (registry: local, submitit, nemo-run,
nemo-run-local), one module each (launchers/backends/).

Imports nothing: launchers/node/ runs on the compute nodes with only the standard library.
"""
