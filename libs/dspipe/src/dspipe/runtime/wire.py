"""What travels between stages besides the tensors: a small header of shapes and dtypes, and the tags
that make every message its own.

A header is one int64 tensor of HEADER_SLOTS entries: [format, count, is a tuple, then per tensor:
dtype code, ndim, *shape]. The receiver allocates buffers of exactly those shapes and dtypes (DeepSpeed's buffer
pool reused buffers whatever their dtype).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..errors import PipelineError

HEADER_FORMAT = 1
HEADER_SLOTS = 128
MAX_NDIM = 16

DTYPES: tuple[torch.dtype, ...] = (
    torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.int16, torch.int8,
    torch.uint8, torch.bool, torch.complex64, torch.complex128,
)
_CODE = {dtype: code for code, dtype in enumerate(DTYPES)}

Spec = tuple[tuple[int, ...], torch.dtype]

# Tag layout: direction (2 bits) | sending stage (8) | micro-batch mod 4096 (12) | tensor slot (5).
_DIRECTIONS = {"F": 0, "B": 1, "H": 2}  # activations, gradients, headers
MAX_STAGES = 256
MAX_TENSORS = 31  # slot 31 is the header's


def tag(direction: str, stage: int, micro_batch: int, slot: int) -> int:
    """The tag of one message: unique among the messages one pair of ranks has in flight."""
    if not 0 <= stage < MAX_STAGES:
        raise PipelineError(f"a pipeline of at most {MAX_STAGES} stages can be tagged; stage {stage} is beyond")
    return ((_DIRECTIONS[direction] * MAX_STAGES + stage) * 4096 + micro_batch % 4096) * 32 + slot


def encode_header(specs: Sequence[Spec], is_tuple: bool) -> torch.Tensor:
    values = [HEADER_FORMAT, len(specs), int(is_tuple)]
    for shape, dtype in specs:
        if dtype not in _CODE:
            raise PipelineError(f"cannot send a tensor of dtype {dtype} between stages; supported: "
                                f"{', '.join(str(d) for d in DTYPES)}")
        if len(shape) > MAX_NDIM:
            raise PipelineError(f"cannot send a {len(shape)}-dimensional tensor between stages (at most {MAX_NDIM})")
        values += [_CODE[dtype], len(shape), *shape]
    if len(specs) > MAX_TENSORS or len(values) > HEADER_SLOTS:
        raise PipelineError(f"a stage's output of {len(specs)} tensors with these shapes does not fit the "
                            f"{HEADER_SLOTS}-entry header (at most {MAX_TENSORS} tensors); return fewer tensors")
    header = torch.zeros(HEADER_SLOTS, dtype=torch.int64)
    header[: len(values)] = torch.tensor(values, dtype=torch.int64)
    return header


def decode_header(header: torch.Tensor, where: str) -> tuple[list[Spec], bool]:
    """(the specs a header carries, whether they form a tuple); a malformed one is a PipelineError naming
    `where` it came from."""
    values = header.tolist()
    if values[0] != HEADER_FORMAT or not 0 < values[1] <= MAX_TENSORS or values[2] not in (0, 1):
        raise PipelineError(f"{where}: the activation header is malformed ({values[:4]}...); the ranks do not run "
                            f"the same schedule, or a message arrived out of order")
    specs, at = [], 3
    for _ in range(values[1]):
        code, ndim = values[at], values[at + 1]
        if not 0 <= code < len(DTYPES) or not 0 <= ndim <= MAX_NDIM or at + 2 + ndim > HEADER_SLOTS:
            raise PipelineError(f"{where}: the activation header is malformed at entry {at}")
        shape = tuple(values[at + 2: at + 2 + ndim])
        if any(d < 0 for d in shape):
            raise PipelineError(f"{where}: the activation header has a negative dimension {shape}")
        specs.append((shape, DTYPES[code]))
        at += 2 + ndim
    return specs, bool(values[2])


def specs_of(tensors: Sequence[torch.Tensor]) -> list[Spec]:
    return [(tuple(t.shape), t.dtype) for t in tensors]


def flatten(value: object, where: str) -> tuple[list[torch.Tensor], bool]:
    """(the tensors of a stage's output, whether it was a tuple): what can travel is a tensor or a
    tuple/list of tensors, as in DeepSpeed."""
    if torch.is_tensor(value):
        return [value], False
    if isinstance(value, (tuple, list)) and value and all(torch.is_tensor(v) for v in value):
        return list(value), True
    kinds = type(value).__name__ if not isinstance(value, (tuple, list)) else \
        f"{type(value).__name__} of {', '.join(sorted({type(v).__name__ for v in value})) or 'nothing'}"
    raise PipelineError(f"{where}: a stage passes the next one a tensor or a tuple of tensors, got {kinds}")


def unflatten(tensors: list[torch.Tensor], is_tuple: bool) -> object:
    return tuple(tensors) if is_tuple else tensors[0]
