"""`python -m orchestrator` runs the mbx CLI."""

from orchestrator.cli import main

main()
