"""`python -m orchestrator` runs the mbx CLI."""

from orchestrator.cli.app import main

main()
