"""``python -m dql_pass`` runs the CLI."""

import sys

from dql_pass.cli import main

sys.exit(main())
