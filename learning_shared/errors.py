"""The trainer's exceptions. Callers catch ``TrainerInputError`` for anything they sent wrong."""


class TrainerInputError(ValueError):
    """Bad input to the trainer: samples, config, base model or parent adapter.

    The message names the offending sample index and field where there is one, so the
    Celery task can record it on the TrainingRun verbatim.
    """


class AdapterInvalidError(TrainerInputError):
    """An adapter directory that must not be loaded or served: missing files, truncated
    or unreadable safetensors, non-finite weights, a format vLLM refuses, or another base."""


class TrainingDivergedError(RuntimeError):
    """Training produced a non-finite loss or non-finite adapter weights; nothing was written."""


class AdapterWriteError(OSError):
    """The adapter could not be written (the disk is full: ``errno`` is ``ENOSPC``); the partial
    directory was removed and nothing is left at the output."""
