"""Training through Lightning: :func:`~tfbuilder.train.fit.fit` (the steps of a fit, over one
:class:`~tfbuilder.train.request.FitRequest`), where it starts and the run directory it claims
(:mod:`~tfbuilder.train.lifecycle`), the LightningModule (:mod:`~tfbuilder.train.task`), the Trainer
(:mod:`~tfbuilder.train.trainer`), what it reports (:mod:`~tfbuilder.train.summary`); its callbacks,
objectives, optimizers, schedules, loggers, progress, stopping rules, memory and disk checks, the
pre-flight, and the sequence heads' losses, metrics and weight transfer (:mod:`tfbuilder.train.heads`).

Lightning is imported by fit.py, lifecycle.py, task.py, trainer.py, callbacks.py, metrics_log.py and
progress.py here (loggers.py: when a logger is built), by data/datamodule.py and by the CLI; the model
knows nothing of it.

May import inference (validation BLEU translates lines), runs, data, model, spec and the bottom
modules; never use, interop or the CLI.
"""
