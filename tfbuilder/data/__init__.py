"""Data: tokenizers, text and synthetic sources, token-budget batching, the Lightning DataModule.

Importing this package is cheap; Lightning is imported only by :mod:`tfbuilder.data.datamodule`.
"""
