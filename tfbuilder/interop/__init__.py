"""Interchange with other ecosystems: Hugging Face model directories (:mod:`tfbuilder.interop.hf`)
and ONNX export (:mod:`tfbuilder.interop.onnx`).

May import use, train, inference, runs, data, model, spec and the bottom modules; only the CLI (and
the package's public API) import it.
"""
