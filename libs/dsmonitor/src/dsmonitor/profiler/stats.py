"""The numbers the profiler keeps per module, and how they print."""

import attrs


@attrs.define
class ModuleStats:
    """One module's forward pass, summed over its calls while profiling; includes its children."""

    name: str  # qualified name; "" for the model itself
    type_name: str
    depth: int  # 0 for the model, 1 for its children, ...
    params: int
    flops: int = 0
    macs: int = 0
    duration: float = 0.0  # seconds
    calls: int = 0


def _scaled(num: float, precision: int) -> str:
    for factor, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "K")):
        if abs(num) >= factor:
            return f"{num / factor:.{precision}f} {prefix}"
    return f"{num:.{precision}f} " if isinstance(num, float) and not num.is_integer() else f"{int(num)} "


def number_to_string(num: float, precision: int = 2) -> str:
    """12_340_000 -> '12.34 M'."""
    return _scaled(num, precision).rstrip()


def flops_to_string(flops: float, precision: int = 2) -> str:
    return _scaled(flops, precision) + "FLOPS"


def macs_to_string(macs: float, precision: int = 2) -> str:
    return _scaled(macs, precision) + "MACs"


def params_to_string(params: float, precision: int = 2) -> str:
    return number_to_string(params, precision)


def duration_to_string(seconds: float, precision: int = 2) -> str:
    if seconds >= 1:
        return f"{seconds:.{precision}f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.{precision}f} ms"
    return f"{seconds * 1e6:.{precision}f} us"
