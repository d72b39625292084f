"""The command line (top layer): ``tfbuilder COMMAND`` (:mod:`tfbuilder.cli.commands`, with the verbs by
group in ``recipes``, ``training``, ``decoding``, ``scoring``, ``sweeps`` and ``interop``) and the
generated reference pages (:mod:`tfbuilder.cli.reference`).

May import every layer below (interop, use, train, inference, runs, data, model, spec, the bottom
modules); nothing in the package imports the CLI. The heavy layers are imported inside the commands
that need them (start-up time: ``tfbuilder --help`` imports no Lightning).
"""

from tfbuilder.cli.commands import main

__all__ = ["main"]
