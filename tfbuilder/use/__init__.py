"""Uses of trained models above training: scoring a test split (:mod:`~tfbuilder.use.evaluation`),
predictions of sequence heads (:mod:`~tfbuilder.use.predict`), sweeps that call ``fit``
(:mod:`~tfbuilder.use.sweeps`), run reports and what they read back, attention maps.

May import train, inference, runs, data, model, spec and the bottom modules; never interop or the CLI.
"""
