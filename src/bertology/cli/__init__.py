"""The ``bertology`` command: one subcommand per verb, each a thin call into the library.

The top of the one-way flow: it may import every package; nothing in the library imports it.

:mod:`~bertology.cli.app` holds the typer application and the entry point, :mod:`~bertology.cli.options`
the option types the commands share, :mod:`~bertology.cli.progress` the progress bars; each command group
is a module of its own, registered on the application when this package is imported. Only light modules
are imported at the top of each (choices and defaults from :mod:`bertology.options`); each command
imports what it runs, so ``bertology --help`` and usage errors answer without loading torch.
"""

from bertology.cli.app import app, main

# The command groups register their commands when imported, and --help lists them in this order.
from bertology.cli import views  # isort: skip
from bertology.cli import corpus  # isort: skip
from bertology.cli import probes  # isort: skip
from bertology.cli import serve  # isort: skip
from bertology.cli import training  # isort: skip
from bertology.cli import interventions  # isort: skip
from bertology.cli import attribution  # isort: skip
from bertology.cli import patching  # isort: skip
from bertology.cli import circuit  # isort: skip
from bertology.cli import cache  # isort: skip

__all__ = [
    "app",
    "attribution",
    "cache",
    "circuit",
    "corpus",
    "interventions",
    "main",
    "patching",
    "probes",
    "serve",
    "training",
    "views",
]
