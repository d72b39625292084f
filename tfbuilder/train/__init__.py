"""Training through Lightning: the task and ``fit`` (:mod:`~tfbuilder.train.training`), its callbacks,
objectives, optimizers, schedules, loggers, progress, stopping rules, memory and disk checks, the
pre-flight, and the sequence heads' losses, metrics and weight transfer (:mod:`tfbuilder.train.heads`).

May import inference (validation BLEU translates lines), runs, data, model, spec and the bottom
modules; never use, interop or the CLI.
"""
