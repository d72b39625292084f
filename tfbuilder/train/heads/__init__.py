"""Sequence heads' training side: the losses (``objective``), accuracy, macro-F1, MSE and Pearson's r
(``metrics``), and loading a head's weights from another model (``transfer``).

The head's recipe section is :mod:`tfbuilder.spec.head` (schema only, no tensors); its pooling and
output layer are :mod:`tfbuilder.model.heads`.
"""
