"""The errors dsmonitor raises: one base class, subclassing the matching builtin."""


class MonitorError(RuntimeError):
    """Base class of every dsmonitor error."""


class MonitorConfigError(MonitorError, ValueError):
    """A monitor, timer or profiler argument is invalid; the message names it and what is valid."""


class MissingExtraError(MonitorError, ImportError):
    """A backend's package is not installed; the message names the extra that installs it."""
