"""The save path's pieces: runs written straight from tensor memory, runs staged through bounce
buffers, and the switch between them; the checksums in the file, recomputed here with zlib."""

from __future__ import annotations

import json
import zlib

import numpy as np
import pytest

import dsaio
import dsaio.checkpoint.stream as stream
import dsaio.checkpoint.writer as writer
from dsaio.checkpoint.checksum import crc32_at
from dsaio.engines import backends


def _at(nbytes: int, misalign: int, seed: int) -> np.ndarray:
    """Random bytes whose address is `misalign` past a 4096-byte boundary."""
    raw = np.empty(nbytes + 8192, np.uint8)
    skip = (-raw.ctypes.data) % 4096 + misalign
    out = raw[skip : skip + nbytes]
    out[:] = np.random.default_rng(seed).integers(0, 256, nbytes, dtype=np.uint8)
    return out


def _file_crcs(path) -> tuple[list[str], int]:
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    meta = json.loads(raw[8 : 8 + n])["__metadata__"]
    data, chunk = raw[8 + n :], int(meta["dsaio.chunk"])
    want = [f"{zlib.crc32(data[i : i + chunk]):08x}" for i in range(0, len(data), chunk)]
    return want, meta["dsaio.crc32"]


def test_direct_and_staged_runs(engine, tmp_path, monkeypatch):
    writes = []
    real_move = stream.move

    def spy(eng, f, addr, nbytes, *rest):
        writes.append((addr, nbytes))
        return real_move(eng, f, addr, nbytes, *rest)

    monkeypatch.setattr(stream, "move", spy)
    monkeypatch.setattr(writer, "CHUNK", 1 << 20)  # many checksum chunks, cut across tensors
    arrays = {
        "a_direct": _at(3 << 20, 0, 1),  # aligned in memory and in the file: no copy
        "b_tail": _at((2 << 20) + 100, 0, 2),  # aligned, then 100 bytes that must be staged
        "c_small": _at(7, 5, 3),
        "d_skip": _at(2 << 20, 107, 4),  # the file offset is 107 past a block; so is the memory
        "e_empty": np.empty(0, np.uint8),
        # First in the file (largest element); 64 bytes past a boundary, as torch allocates.
        "f64_unaligned": _at(8 * 512 * 196, 64, 5).view(np.float64),
    }
    arrays.update({f"g{i:03d}": _at(int(s), int(s) % 64, 10 + i)  # many small tensors
                   for i, s in enumerate(np.random.default_rng(0).integers(1, 5000, 300))})
    path = tmp_path / "c.safetensors"
    dsaio.save(arrays, path, engine=engine)
    back = dsaio.load(path, framework="np", engine=engine)
    for k, v in arrays.items():
        assert back[k].dtype == v.dtype and back[k].tobytes() == v.tobytes(), k  # NaNs: compare bytes
    want, got = _file_crcs(path)
    assert len(want) > 5 and "".join(want) == got
    assert (arrays["a_direct"].ctypes.data, 3 << 20) in writes  # written from the arrays themselves
    assert (arrays["b_tail"].ctypes.data, 2 << 20) in writes
    assert path.stat().st_size == 8 + int.from_bytes(path.read_bytes()[:8], "little") + sum(
        v.nbytes for v in arrays.values())


def test_staged_run_larger_than_the_bounce_buffers(tmp_path, monkeypatch):
    monkeypatch.setattr(stream, "SLICE", 64 << 10)  # every buffer is reused many times
    arrays = {"x": _at((3 << 20) + 3, 1, 0), "y": _at(5000, 0, 1)}
    dsaio.save(arrays, tmp_path / "c.safetensors")
    back = dsaio.load(tmp_path / "c.safetensors", framework="np")
    assert all(np.array_equal(back[k], v) for k, v in arrays.items())
    want, got = _file_crcs(tmp_path / "c.safetensors")
    assert "".join(want) == got


@pytest.mark.skipif(not backends()["aio"]["available"] and not backends()["threads"]["available"],
                    reason="the native core is not built")
def test_native_crc32_matches_zlib():
    data = _at((1 << 20) + 64, 0, 7)
    for n in [*range(0, 130), 4095, 4096, 65536 + 7, 1 << 20]:
        for off in (0, 1, 15, 63):
            for start in (0, 0xDEADBEEF):
                assert crc32_at(data.ctypes.data + off, n, start) == zlib.crc32(data[off : off + n], start), (n, off)
