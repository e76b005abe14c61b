"""Read back what each backend wrote, with the backend's own formats and readers.

W&B's service process and Comet's archiver may still be writing when `close()` has returned (seen on
a loaded machine: a W&B run read back empty), so their readers wait, bounded, for the file to be
complete: W&B's `exit` record, a Comet archive that opens.
"""

import csv
import glob
import json
import os
import struct
import time
import zipfile

WAIT_S = 60.0  # a slow machine; a writer that never finishes fails the test after this


def tensorboard_scalars(log_dir: str) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(log_dir, size_guidance={"scalars": 0})  # 0: keep every point
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def _wandb_records(path: str):
    """The complete protobuf records of a .wandb file (W&B's LevelDB-style log: 32 KiB blocks of chunks)."""
    from wandb.proto import wandb_internal_pb2

    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 7:
        return  # not even the header written yet
    assert data[:4] == b":W&B", f"{path} is not a W&B transaction log"
    block, pos, chunks = 32768, 7, b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block tail too short for a header is padding
            pos += block - pos % block
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if (length == 0 and kind == 0) or pos + 7 + length > len(data):
            break  # the end, or a chunk still being written
        chunks += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # FULL or LAST chunk ends a record
            record = wandb_internal_pb2.Record()
            record.ParseFromString(chunks)
            chunks = b""
            yield record


def wandb_run(wandb_dir: str, wait_s: float = WAIT_S) -> dict:
    """The single offline run under wandb_dir, once W&B has written its exit: run settings and history rows."""
    pattern = os.path.join(wandb_dir, "wandb", "offline-run-*", "run-*.wandb")
    deadline = time.monotonic() + wait_s
    while True:
        paths = glob.glob(pattern)
        assert len(paths) <= 1, f"more than one W&B run under {wandb_dir}: {paths}"
        run = _wandb_read(paths[0]) if paths else None
        if run is not None and run.pop("exited"):
            return run
        if time.monotonic() > deadline:
            raise AssertionError(f"W&B did not finish writing a run under {wandb_dir} within {wait_s} s "
                                 f"(files {paths}; read so far {run})")
        time.sleep(0.1)


def _wandb_read(path: str) -> dict:
    run, history, exited = {}, [], False
    for record in _wandb_records(path):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run = {"project": record.run.project, "entity": record.run.entity, "group": record.run.run_group}
        elif kind == "history":
            row = {(item.key or "/".join(item.nested_key)): json.loads(item.value_json)
                   for item in record.history.item}
            history.append(row)
        elif kind == "exit":
            exited = True
    return {"run": run, "history": history, "exited": exited}


def comet_metrics(offline_dir: str, wait_s: float = WAIT_S) -> tuple[dict, list[tuple[str, float, int]]]:
    """The offline archive's experiment.json and its logged metrics, (name, value, step)."""
    deadline = time.monotonic() + wait_s
    while True:
        archives = glob.glob(os.path.join(offline_dir, "*.zip"))
        assert len(archives) <= 1, f"more than one Comet archive in {offline_dir}: {archives}"
        try:
            with zipfile.ZipFile(archives[0]) as zf:
                experiment = json.loads(zf.read("experiment.json"))
                messages = zf.read("messages.json").decode()
            break
        except (IndexError, OSError, KeyError, zipfile.BadZipFile, json.JSONDecodeError) as exc:
            if time.monotonic() > deadline:
                raise AssertionError(f"no complete Comet archive in {offline_dir} within {wait_s} s "
                                     f"(files {archives}: {exc!r})") from exc
            time.sleep(0.1)
    metrics = []
    for line in messages.splitlines():
        message = json.loads(line)
        if message.get("type") == "metric_msg":
            metric = message["payload"]["metric"]
            metrics.append((metric["metricName"], metric["metricValue"], metric["step"]))
    return experiment, metrics


def csv_rows(path: str) -> list[list[str]]:
    with open(path, newline="") as f:
        return list(csv.reader(f))
