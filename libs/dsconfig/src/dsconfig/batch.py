"""Batch-size arithmetic: train_batch_size = micro batch * accumulation steps * data-parallel size.

A pure function of the given values and the data-parallel size (DeepSpeed users often mistake
the latter for the GPU count, so every message prints every factor).
"""

from __future__ import annotations

from collections.abc import Collection

from .errors import ConfigError, Problem
from .fields import AUTO

TB, MB, GAS = "train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps"


def resolve_batch_triple(known: dict[str, int], *, explicit_auto: Collection[str], data_parallel_size: int,
                         require: bool = False) -> dict[str, int | str]:
    """Complete the triple from the keys in `known`.

    Keys in `explicit_auto` were written as "auto": someone else will fill them in, so they get no
    default. An absent gradient_accumulation_steps defaults to 1 when that settles the triple.
    What stays undetermined is returned as "auto", or raises ConfigError when `require` is set.
    """
    dp = data_parallel_size
    if not isinstance(dp, int) or isinstance(dp, bool) or dp < 1:
        raise ConfigError(Problem("world_size", "the data-parallel size must be a positive integer", dp))
    tb, mb, gas = known.get(TB), known.get(MB), known.get(GAS)
    factors = f"data-parallel size {dp} (the world_size given to dsconfig.load)"

    if tb is not None and mb is not None and gas is not None:
        if tb != mb * gas * dp:
            raise ConfigError(Problem(
                TB, f"does not equal {MB} ({mb}) * {GAS} ({gas}) * {factors} = {mb * gas * dp}; "
                    f"change one of them, or give only two and the third is derived", tb))
    elif tb is not None and mb is not None:
        gas = _divide(tb, mb * dp, TB, f"{MB} ({mb}) * {factors}", GAS)
    elif tb is not None and gas is not None:
        mb = _divide(tb, gas * dp, TB, f"{GAS} ({gas}) * {factors}", MB)
    elif mb is not None and gas is not None:
        tb = mb * gas * dp
    elif (tb is not None or mb is not None) and GAS not in explicit_auto:
        gas = 1  # the reference's default, used only when it settles the triple
        if tb is not None:
            mb = _divide(tb, dp, TB, factors, MB)
        else:
            tb = mb * dp

    triple: dict[str, int | str] = {TB: tb, MB: mb, GAS: gas}
    missing = [key for key, value in triple.items() if value is None]
    if missing and require:
        given = ", ".join(f"{k}={v}" for k, v in known.items()) or "none"
        raise ConfigError([Problem(
            key, f"is not determined (given: {given}; {factors}); give train_batch_size or "
                 f"{MB}, and the others follow") for key in missing])
    return {key: AUTO if value is None else value for key, value in triple.items()}


def _divide(total: int, divisor: int, key: str, divisor_text: str, derived: str) -> int:
    if total % divisor:
        lower, upper = total // divisor * divisor, (total // divisor + 1) * divisor
        nearest = f"{lower} or {upper}" if lower else f"{upper}"
        raise ConfigError(Problem(
            key, f"is not divisible by {divisor_text}, which is {divisor}, so {derived} cannot be derived; "
                 f"the nearest valid {key} is {nearest}", total))
    return total // divisor
