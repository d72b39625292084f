"""The model: registered components (:mod:`tfbuilder.model.components`), blocks, the model and its
builder, dropout, multi-token prediction, the sequence heads' modules, the module tree.

May import spec and the bottom modules; never data, runs, inference, train, use, interop or the CLI,
and never Lightning.
"""
