"""The `mbx` command line: the Typer app (app.py), one module per noun, shared options and printed views."""
