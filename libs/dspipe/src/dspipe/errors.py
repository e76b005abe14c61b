"""dspipe's errors."""


class PipelineError(RuntimeError):
    """A pipeline cannot do what was asked; the message says what, where (rank, stage, action) and what is valid."""


class ScheduleError(PipelineError, ValueError):
    """A schedule that is malformed or cannot run: a broken dependency, an unmatched send, a bad argument."""


class DeadlockError(ScheduleError):
    """A schedule that cannot finish: every rank still running waits for something that never comes."""
