"""Sequence heads: one prediction per text (classification, regression) from an encoder or decoder.

``section`` is the recipe's ``model.head`` (schema only, no tensors); ``module`` the pooling and the
output layer; ``metrics`` accuracy, macro-F1, MSE and Pearson's r; ``objective`` the losses.
"""
