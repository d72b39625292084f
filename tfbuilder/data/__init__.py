"""Data: tokenizers, text and synthetic sources, token-budget batching, the Lightning DataModule.

Importing this package is cheap; Lightning is imported only by :mod:`tfbuilder.data.datamodule`.

Layer: data sits above model and spec; it may import model, spec and the bottom modules, never runs,
inference, train, use, interop or the CLI.
"""
