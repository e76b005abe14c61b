"""`dspipe show` / `dspipe list`: text timelines, PNGs, measured traces."""

import struct
import subprocess
import sys
import zlib

import dspipe.schedules as sch
from dspipe.cli import main
from dspipe.schedules import TraceEvent


def _run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_show_prints_one_row_per_rank_with_idle_dots_and_the_bubble(capsys):
    code, out, _ = _run(capsys, "show", "--schedule", "zb_h1", "--stages", "4", "--micro-batches", "8")
    assert code == 0
    rows = [line for line in out.splitlines() if line.startswith("rank ")]
    assert len(rows) == 4
    assert rows[0].split("|")[1].split()[:8] == ["F0", "F1", "F2", "F3", ".", ".", ".", "I0"]
    assert rows[3].split("|")[1].split()[:5] == [".", ".", ".", "F0", "I0"]
    assert "bubble 0.1250" in out and "makespan 27" in out
    assert "validated" in out


def test_show_interleaved_labels_stages_and_prints_programs(capsys):
    code, out, _ = _run(capsys, "show", "--schedule", "interleaved_1f1b", "--stages", "2", "--micro-batches", "4",
                        "--chunks", "2", "--actions", "--costs", "F=1,B=2,comm=0.5")
    assert code == 0
    assert "2 stages per rank" in out and "0F0" in out and "3F0" in out
    program = next(line for line in out.splitlines() if line.startswith("rank 0: "))
    assert program.split()[2:5] == ["0LOAD0", "0F0", "0SEND_F0"] and program.endswith("STEP")


def test_long_timelines_wrap(capsys):
    code, out, _ = _run(capsys, "show", "--schedule", "1f1b", "--stages", "2", "--micro-batches", "32", "--width", "60")
    assert code == 0
    assert "(from t = " in out
    assert max(len(line) for line in out.splitlines() if line.startswith("rank ")) <= 60


def _png_pixels(path):
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    chunks, at = {}, 8
    while at < len(data):
        (length,) = struct.unpack(">I", data[at:at + 4])
        tag, body = data[at + 4:at + 8], data[at + 8:at + 8 + length]
        assert struct.unpack(">I", data[at + 8 + length:at + 12 + length])[0] == zlib.crc32(tag + body)
        chunks[tag] = chunks.get(tag, b"") + body
        at += 12 + length
    width, height, depth, colour = struct.unpack(">IIBB", chunks[b"IHDR"][:10])
    assert (depth, colour) == (8, 2)
    raw = zlib.decompress(chunks[b"IDAT"])
    stride = 1 + 3 * width
    assert len(raw) == stride * height
    return width, height, lambda x, y: tuple(raw[y * stride + 1 + 3 * x:y * stride + 4 + 3 * x])


def test_png_draws_each_action_in_its_kinds_colour(capsys, tmp_path):
    out_png = tmp_path / "zb.png"
    code, out, _ = _run(capsys, "show", "--schedule", "zb_h1", "--stages", "2", "--micro-batches", "2", "--png",
                        str(out_png))
    assert code == 0 and f"wrote {out_png}" in out
    width, height, pixel = _png_pixels(out_png)
    assert (width, height) == (1200, 2 * 24 + 4)
    # makespan 7 over 1200 - 28 pixels: rank 0 runs 0F0 in [0, 1), is idle in [2, 3), runs 0I0 in [3, 4)
    scale = (1200 - 28) / 7
    row0 = 2 + 12
    assert pixel(int(24 + 0.5 * scale), row0 + 8) == (66, 133, 244)  # F blue (below the digits)
    assert pixel(int(24 + 2.5 * scale), row0) == (255, 255, 255)  # idle
    assert pixel(int(24 + 3.5 * scale), row0 + 8) == (142, 206, 160)  # I light green


def test_from_trace_draws_the_measured_run_and_compares_with_the_simulation(capsys, tmp_path):
    events = [e for e in sch.simulate(sch.one_f_one_b(2, 4), {"F": 0.01, "B": 0.02}).events]
    slow = [TraceEvent(e.rank, e.action, e.start + 100.0, e.end + 100.0 + (0.005 if e.rank == 1 else 0)) for e in events]
    sch.write_trace(tmp_path / "r0.json", [e for e in slow if e.rank == 0])
    sch.write_trace(tmp_path / "r1.json", [e for e in slow if e.rank == 1])
    code, out, _ = _run(capsys, "show", "--from-trace", str(tmp_path / "r0.json"), str(tmp_path / "r1.json"),
                        "--schedule", "1f1b", "--stages", "2", "--micro-batches", "4", "--png", str(tmp_path / "m.png"))
    assert code == 0
    assert out.startswith("measured (")
    assert sum(line.startswith("rank ") for line in out.splitlines()) == 2
    assert "simulated 1f1b with the measured op times" in out
    _png_pixels(tmp_path / "m.png")


def test_errors_exit_2_with_a_message(capsys, tmp_path):
    code, _, err = _run(capsys, "show", "--schedule", "dualpipev", "--stages", "4", "--micro-batches", "4")
    assert code == 2 and "dspipe: error: dualpipev needs micro_batches >= 2 * stages = 8" in err
    code, _, err = _run(capsys, "show", "--schedule", "nope", "--stages", "2", "--micro-batches", "2")
    assert code == 2 and "valid: gpipe, 1f1b" in err
    code, _, err = _run(capsys, "show", "--schedule", "1f1b", "--stages", "2", "--micro-batches", "2", "--costs", "F")
    assert code == 2 and "expected KEY=NUMBER" in err
    (tmp_path / "bad.json").write_text("[{}]")
    code, _, err = _run(capsys, "show", "--from-trace", str(tmp_path / "bad.json"))
    assert code == 2 and "missing rank, action, start, end" in err


def test_list_and_the_module_entry_point(capsys):
    code, out, _ = _run(capsys, "list")
    assert code == 0 and [line.split()[0] for line in out.splitlines()] == list(sch.SCHEDULES)
    done = subprocess.run([sys.executable, "-m", "dspipe.cli", "show", "--schedule", "gpipe", "--stages", "2",
                           "--micro-batches", "2"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "bubble 0.5000" in done.stdout and "F0" in done.stdout
