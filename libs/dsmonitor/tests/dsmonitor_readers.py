"""Read back what each backend wrote, with the backend's own formats and readers."""

import csv
import glob
import json
import os
import struct
import zipfile


def tensorboard_scalars(log_dir: str) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(log_dir, size_guidance={"scalars": 0})  # 0: keep every point
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def _wandb_records(path: str):
    """The protobuf records of a .wandb file (W&B's LevelDB-style log: 32 KiB blocks of chunks)."""
    from wandb.proto import wandb_internal_pb2

    with open(path, "rb") as f:
        data = f.read()
    assert data[:4] == b":W&B", f"{path} is not a W&B transaction log"
    block, pos, chunks = 32768, 7, b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block tail too short for a header is padding
            pos += block - pos % block
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if length == 0 and kind == 0:
            break
        chunks += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # FULL or LAST chunk ends a record
            record = wandb_internal_pb2.Record()
            record.ParseFromString(chunks)
            chunks = b""
            yield record


def wandb_run(wandb_dir: str) -> dict:
    """The single offline run under wandb_dir: its run settings and history rows."""
    (path,) = glob.glob(os.path.join(wandb_dir, "wandb", "offline-run-*", "run-*.wandb"))
    run, history = {}, []
    for record in _wandb_records(path):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run = {"project": record.run.project, "entity": record.run.entity, "group": record.run.run_group}
        elif kind == "history":
            row = {(item.key or "/".join(item.nested_key)): json.loads(item.value_json)
                   for item in record.history.item}
            history.append(row)
    return {"run": run, "history": history}


def comet_metrics(offline_dir: str) -> tuple[dict, list[tuple[str, float, int]]]:
    """The offline archive's experiment.json and its logged metrics, (name, value, step)."""
    (archive,) = glob.glob(os.path.join(offline_dir, "*.zip"))
    with zipfile.ZipFile(archive) as zf:
        experiment = json.loads(zf.read("experiment.json"))
        metrics = []
        for line in zf.read("messages.json").decode().splitlines():
            message = json.loads(line)
            if message.get("type") == "metric_msg":
                metric = message["payload"]["metric"]
                metrics.append((metric["metricName"], metric["metricValue"], metric["step"]))
    return experiment, metrics


def csv_rows(path: str) -> list[list[str]]:
    with open(path, newline="") as f:
        return list(csv.reader(f))
