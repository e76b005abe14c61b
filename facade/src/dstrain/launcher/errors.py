"""The launcher's errors: what went wrong, where (file and line, host, option) and what is valid."""


class LaunchError(RuntimeError):
    """The job could not be started as asked."""


class HostfileError(LaunchError, ValueError):
    """A hostfile line is malformed; the message names the file and line."""


class FilterError(LaunchError, ValueError):
    """An `--include` / `--exclude` filter is malformed, names what the hosts lack, or is combined with a count."""
