"""Run directories and checkpoints: reading, writing and loading checkpoints
(:mod:`~tfbuilder.runs.checkpoints`), archives, averaging, rewinding a run, the vocabulary files.

May import data, model, spec and the bottom modules; never inference, train, use, interop or the CLI.
"""
