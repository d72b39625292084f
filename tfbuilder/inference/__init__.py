"""Decoding, below training (training's validation BLEU translates lines): searches and sampling
(:mod:`~tfbuilder.inference.decoding`), ensembles (:mod:`~tfbuilder.inference.ensemble`).

May import runs, data, model, spec and the bottom modules; never train, use, interop or the CLI.
"""
