"""Typer command functions, one module per command family; `pipeline/cli.py` registers them."""
