"""Weights & Biases; honours WANDB_MODE=offline and every other WANDB_* variable by leaving them to wandb."""

import os
from collections.abc import Sequence

from .._extras import require
from .base import Event


class WandbMonitor:
    """One W&B run in `project`, `group`, under `team` (W&B's entity)."""

    name = "wandb"

    def __init__(self, config, *, run_name: str | None = None, dir: str | None = None) -> None:
        # the config's fields under DeepSpeed's monitor attribute names
        self.enabled, self.group, self.team, self.project = config.enabled, config.group, config.team, config.project
        self.run = None
        if not self.enabled:
            return  # as DeepSpeed's: a disabled monitor opens no run (and needs no wandb, no API key)
        wandb = require("wandb", "wandb", "The W&B monitor")
        # wandb reads WANDB_DIR / WANDB_MODE once per process; passing them makes each monitor
        # follow the environment as it is when the monitor is built.
        # create_new: a run the user opened themselves stays theirs and is not finished by close().
        self.run = wandb.init(
            project=config.project, group=config.group, entity=config.team, name=run_name,
            dir=dir or os.environ.get("WANDB_DIR"), mode=os.environ.get("WANDB_MODE"), reinit="create_new",
        )

    def write_events(self, events: Sequence[Event]) -> None:
        if self.run is None:
            return
        # One log call per step: W&B commits a history row when the step moves on, and rejects
        # a step lower than one it has already committed.
        row: dict[str, float] = {}
        row_step = None
        for name, value, step in events:
            if step != row_step and row:
                self.run.log(row, step=row_step)
                row = {}
            row_step = step
            row[name] = value
        if row:
            self.run.log(row, step=row_step)

    def flush(self) -> None:
        pass  # wandb streams to its own service process; nothing is held here

    def close(self) -> None:
        if self.run is not None:
            self.run.finish()
