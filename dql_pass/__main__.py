"""``python -m dql_pass`` runs the CLI."""

from dql_pass.cli import run

run()
