"""`DataSampler`: DeepSpeed's DeepSpeedDataSampler behaviour, resumable exactly.

Each global batch (micro batch x data-parallel ranks x accumulation steps) is drawn at once: the
curriculum schedules step, a schedule change opens a new cluster of the samples it admits, the batch
takes from each cluster in proportion to its size (a cluster used up is reshuffled), and the batch
is shuffled. Every rank draws the same global batch from the same generator, so no collective is
needed, and yields its own slice of each micro step's samples (disjoint slices whose union is the
batch).

The generator is the sampler's own (never numpy's global one, which DeepSpeed saves in its place, so a
resume there replays the stream from the seed). A cluster's order is a shuffle of its members made
from a recorded generator state, and its members follow from the index files and the two difficulties
that opened it: `state_dict()` holds those few numbers, not the members, and `load_state_dict()`
rebuilds every cluster as it was, so a resumed run draws exactly the batches an uninterrupted one would.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import numpy as np

from .clusters import NO_LOWER_BOUND, MetricIndex, cluster_members
from .curriculum_scheduler import CurriculumScheduler
from .errors import DataEfficiencyError
from .logs import logger
from .sampling_config import BASE, SamplingSpec, sampling_spec

STATE_VERSION = 1


def _generator_state(rng: np.random.Generator) -> dict:
    state = rng.bit_generator.state  # PCG64's 128-bit integers kept as hex text: any storage holds them
    return {"state": format(state["state"]["state"], "x"), "inc": format(state["state"]["inc"], "x"),
            "has_uint32": int(state["has_uint32"]), "uinteger": int(state["uinteger"])}


def _generator_from(saved: dict) -> np.random.Generator:
    try:
        state = {"bit_generator": "PCG64", "state": {"state": int(saved["state"], 16), "inc": int(saved["inc"], 16)},
                 "has_uint32": int(saved["has_uint32"]), "uinteger": int(saved["uinteger"])}
        rng = np.random.Generator(np.random.PCG64())
        rng.bit_generator.state = state
    except (KeyError, TypeError, ValueError) as exc:
        raise DataEfficiencyError(f"data sampler state: the generator state is malformed ({exc})") from None
    return rng


class _Cluster:
    __slots__ = ("current", "members", "order", "position", "previous", "shuffle_state")

    def __init__(self, members: np.ndarray, previous: dict, current: dict, rng: np.random.Generator):
        self.members, self.previous, self.current = members, previous, current
        self.position = 0
        self.shuffle(rng)

    def shuffle(self, rng: np.random.Generator) -> None:
        self.shuffle_state = _generator_state(rng)
        self.order = self.members.copy()
        rng.shuffle(self.order)

    def take(self, count: int, rng: np.random.Generator) -> list[int]:
        taken = self.order[self.position:self.position + count].tolist()
        self.position += count
        if len(taken) < count:  # used up: a fresh order, continued from its start
            self.shuffle(rng)
            remaining = count - len(taken)
            taken += self.order[:remaining].tolist()
            self.position = remaining
        return taken

    def state(self) -> dict:
        return {"previous": dict(self.previous), "current": dict(self.current), "shuffle": self.shuffle_state,
                "position": self.position, "size": int(self.members.size)}


class DataSampler:
    """Yields, per micro step, this data-parallel rank's sample indices of the current global batch.

    `data_efficiency_config`: the dsconfig DataEfficiencyConfig (or DeepSpeed's dict of the section);
    `one_epoch_total_samples`: the dataset's length. The run ends after num_epochs times that many
    samples. `data_parallel_group` and `global_rank` are accepted for DeepSpeed's signature; the
    sampler needs no collective.
    """

    def __init__(self, data_efficiency_config: Any, one_epoch_total_samples: int, micro_batch_size: int,
                 data_parallel_rank: int, data_parallel_size: int, data_parallel_group: Any = None,
                 gradient_accumulation_steps: int = 1, global_rank: int = 0, drop_last: bool = True):
        spec = data_efficiency_config if isinstance(data_efficiency_config, SamplingSpec) \
            else sampling_spec(data_efficiency_config)
        for name, value in (("one_epoch_total_samples", one_epoch_total_samples), ("micro_batch_size", micro_batch_size),
                            ("data_parallel_size", data_parallel_size),
                            ("gradient_accumulation_steps", gradient_accumulation_steps)):
            if not isinstance(value, int) or value < 1:
                raise DataEfficiencyError(f"DataSampler({name}={value!r}): must be a positive integer")
        if not 0 <= data_parallel_rank < data_parallel_size:
            raise DataEfficiencyError(f"DataSampler(data_parallel_rank={data_parallel_rank}): must be in "
                                      f"0..{data_parallel_size - 1}")
        self.spec = spec
        self.one_epoch_total_samples = one_epoch_total_samples
        self.total_samples = one_epoch_total_samples * spec.num_epochs
        self.micro_batch_size = micro_batch_size
        self.data_parallel_rank = data_parallel_rank
        self.data_parallel_size = data_parallel_size
        self.data_parallel_group = data_parallel_group
        self.global_rank = global_rank
        self.drop_last = drop_last
        self.micro_batch_times_data_parallel_size = micro_batch_size * data_parallel_size
        self.global_batch_size = self.micro_batch_times_data_parallel_size * gradient_accumulation_steps
        self.np_rng = np.random.Generator(np.random.PCG64(spec.seed))
        self.curriculum_schedulers = {m.name: CurriculumScheduler(m.scheduler_config, where=f"{BASE}.{m.name}")
                                      for m in spec.metrics}
        self.indexes = {m.name: MetricIndex(m, one_epoch_total_samples) for m in spec.metrics if m.clusters}
        self.batch: list[int] = []
        self.consumed_samples = 0
        self.curriculum_step = 0
        self.current_difficulties: dict[str, int] = {}
        self.clusters: list[_Cluster] = []

    def __len__(self) -> int:
        """Micro steps of the whole run (DeepSpeed's returns samples, which a DataLoader misreads as batches)."""
        return -(-self.total_samples // self.micro_batch_times_data_parallel_size)

    def set_custom_curriculum_learning_schedule(self, schedule_func_dict: dict) -> None:
        """{metric name: fn(step) -> difficulty} for the metrics with schedule_type "custom"."""
        unknown = sorted(set(schedule_func_dict) - set(self.curriculum_schedulers))
        if unknown:
            raise DataEfficiencyError(f"set_custom_curriculum_learning_schedule: no curriculum metric named "
                                      f"{', '.join(map(repr, unknown))}; the config's metrics: "
                                      f"{', '.join(self.curriculum_schedulers) or 'none'}")
        for metric, function in schedule_func_dict.items():
            self.curriculum_schedulers[metric].set_custom_get_difficulty(function)

    def get_start_end_idx(self, batch_len: int | None = None) -> tuple[int, int]:
        """This rank's slice of a micro step's `batch_len` samples."""
        batch_len = batch_len or self.micro_batch_times_data_parallel_size
        return (round(self.data_parallel_rank * batch_len / self.data_parallel_size),
                round((self.data_parallel_rank + 1) * batch_len / self.data_parallel_size))

    # ------------------------------------------------------------------ drawing
    def get_next_global_batch(self) -> None:
        self.curriculum_step += 1
        previous, changed = {}, not self.clusters
        for metric in self.spec.metrics:
            difficulty = self.curriculum_schedulers[metric.name].update_difficulty(self.curriculum_step)
            known = self.current_difficulties.get(metric.name)
            if known is None:
                previous[metric.name] = NO_LOWER_BOUND if metric.difficulty_type == "value" else 0
            else:
                previous[metric.name] = known
            changed = changed or difficulty != known
            self.current_difficulties[metric.name] = difficulty
        if changed:
            self._open_cluster(previous, dict(self.current_difficulties))
        if not self.clusters:
            raise DataEfficiencyError(f"{BASE}: no sample is within the difficulties {self.current_difficulties} at "
                                      f"curriculum step {self.curriculum_step}; raise min_difficulty or check the "
                                      f"index files")
        sizes = np.array([cluster.members.size for cluster in self.clusters], dtype=np.float64)
        picks = self.np_rng.choice(len(self.clusters), self.global_batch_size, replace=True, p=sizes / sizes.sum())
        counts = np.bincount(picks, minlength=len(self.clusters))
        batch: list[int] = []
        for cluster, count in zip(self.clusters, counts):
            if count:
                batch += cluster.take(int(count), self.np_rng)
        self.np_rng.shuffle(batch)
        self.batch = batch

    def _open_cluster(self, previous: dict, current: dict, rng: np.random.Generator | None = None) -> bool:
        members = cluster_members(self.indexes, self.spec.metrics, self.one_epoch_total_samples, previous, current,
                                  [c.members for c in self.clusters])
        report = rng is None and self.global_rank == 0  # not when rebuilding from a checkpoint; one rank speaks
        if members is None or members.size == 0:
            if report and any(previous[m.name] != current[m.name] for m in self.spec.metrics if m.clusters):
                logger.info(f"curriculum: difficulties {current} admit no sample beyond those of {previous}")
            return False
        self.clusters.append(_Cluster(members, previous, current, rng or self.np_rng))
        if report:
            logger.info(f"curriculum: new cluster of {members.size} samples for difficulties {current} at step "
                        f"{self.curriculum_step}")
        return True

    def __iter__(self) -> Iterator[list[int]]:
        step = self.micro_batch_times_data_parallel_size
        while self.consumed_samples < self.total_samples:
            if not self.batch:
                self.get_next_global_batch()
            current, self.batch = self.batch[:step], self.batch[step:]
            if len(current) < step and self.drop_last:
                continue
            start, end = self.get_start_end_idx(len(current))
            self.consumed_samples += len(current)  # before the yield: state_dict() then includes this batch
            yield current[start:end]

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict:
        """Plain data (ints, strings, lists, dicts): everything needed to continue exactly."""
        return {"version": STATE_VERSION, "batch": list(self.batch), "consumed_samples": self.consumed_samples,
                "curriculum_step": self.curriculum_step, "current_difficulties": dict(self.current_difficulties),
                "np_rng_state": _generator_state(self.np_rng), "clusters": [c.state() for c in self.clusters],
                "schedulers": {name: s.get_state() for name, s in self.curriculum_schedulers.items()},
                "fingerprint": self._fingerprint()}

    def _fingerprint(self) -> dict:
        return {"one_epoch_total_samples": self.one_epoch_total_samples, "global_batch_size": self.global_batch_size,
                "metrics": sorted(self.curriculum_schedulers), "seed": self.spec.seed}

    def load_state_dict(self, state: dict) -> None:
        """Continue from `state_dict()`'s state: the clusters are rebuilt from the index files and must
        come out as large as they were saved. A state of another shape fails with DataEfficiencyError."""
        try:
            self._load(copy.deepcopy(state))
        except (KeyError, TypeError, AttributeError, IndexError) as exc:
            raise DataEfficiencyError(f"data sampler state is malformed ({type(exc).__name__}: {exc}); it is not a "
                                      f"DataSampler.state_dict() of this version") from None

    def _load(self, state: dict) -> None:
        if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
            raise DataEfficiencyError(f"data sampler state: version {state.get('version') if isinstance(state, dict) else state!r} "
                                      f"is not {STATE_VERSION}")
        if state.get("fingerprint") != self._fingerprint():
            raise DataEfficiencyError(f"data sampler state was saved for {state.get('fingerprint')} but this sampler "
                                      f"is {self._fingerprint()}; resume with the same dataset, global batch size, "
                                      f"metrics and seed")
        batch = state["batch"]
        if not isinstance(batch, list) or not all(isinstance(i, int) and 0 <= i < self.one_epoch_total_samples
                                                  for i in batch):
            raise DataEfficiencyError("data sampler state: 'batch' must list sample indices within the dataset")
        for key in ("consumed_samples", "curriculum_step"):
            if not isinstance(state[key], int) or state[key] < 0:
                raise DataEfficiencyError(f"data sampler state: {key} must be a non-negative integer")
        for name, scheduler_state in state["schedulers"].items():
            if name not in self.curriculum_schedulers:
                raise DataEfficiencyError(f"data sampler state: unknown curriculum metric {name!r}")
            self.curriculum_schedulers[name].set_state(scheduler_state)
        self.clusters = []
        for saved in state["clusters"]:
            if not self._open_cluster(saved["previous"], saved["current"], rng=_generator_from(saved["shuffle"])) \
                    or self.clusters[-1].members.size != saved["size"]:
                raise DataEfficiencyError(f"data sampler state: the cluster for difficulties {saved['current']} had "
                                          f"{saved['size']} samples when saved but the index files now give a "
                                          f"different one; resume with the index files the run started with")
            if not 0 <= saved["position"] <= saved["size"]:
                raise DataEfficiencyError(f"data sampler state: cluster position {saved['position']} is outside "
                                          f"0..{saved['size']}")
            self.clusters[-1].position = saved["position"]
        self.batch = batch
        self.consumed_samples = state["consumed_samples"]
        self.curriculum_step = state["curriculum_step"]
        self.current_difficulties = dict(state["current_difficulties"])
        self.np_rng = _generator_from(state["np_rng_state"])


DeepSpeedDataSampler = DataSampler  # DeepSpeed's name
