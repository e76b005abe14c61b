"""A character corpus every machine has without a download: the Python standard library's own source."""

import sysconfig
from pathlib import Path

import torch


def stdlib_bytes(limit_bytes: int) -> bytes:
    """The first `limit_bytes` of the standard library's .py files, in a fixed (sorted) order."""
    root = Path(sysconfig.get_paths()["stdlib"])
    chunks, total = [], 0
    for path in sorted(root.rglob("*.py")):
        if "site-packages" in path.parts or "test" in path.parts or "tests" in path.parts:
            continue
        try:
            data = path.read_bytes()
        except OSError:
            continue
        chunks.append(data)
        total += len(data)
        if total >= limit_bytes:
            break
    if total < 10_000:
        raise RuntimeError(f"found only {total} bytes of Python source under {root}; is the standard library there?")
    return b"".join(chunks)[:limit_bytes]


class CharWindows(torch.utils.data.Dataset):
    """Windows of seq + 1 bytes (inputs and their next-byte targets), every `stride` bytes of `text`."""

    def __init__(self, text: bytes, seq: int, stride: int | None = None):
        self.data = torch.frombuffer(bytearray(text), dtype=torch.uint8)
        self.seq = seq
        self.stride = stride or seq
        self.count = (len(self.data) - seq - 1) // self.stride

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> torch.Tensor:
        start = index * self.stride
        return self.data[start:start + self.seq + 1].long()
