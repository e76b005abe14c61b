"""The search without processes: the tuners' order on synthetic cost functions (model-based finds the
optimum in fewer trials than random, early stopping stops), the ranking, the whole search over stages
with synthetic experiments (the memory estimate, the probe, failures skipped, max_train_batch_size),
and what it writes (summary table, CSV, progress line)."""

import csv
import io
import json
import math
import statistics

import pytest

from dstrain.autotuning import explore, features, ranked, stage_points
from dstrain.autotuning.cost_model import QuadraticModel
from dstrain.autotuning.experiments import classify
from dstrain.autotuning.outputs import progress_line, summary_csv, summary_text
from dstrain.autotuning.ranking import better, check_metric, score
from dstrain.autotuning.request import read_request
from dstrain.autotuning.search import Outcome, Progress, Search
from dstrain.autotuning.tuners import ModelBased

MICRO = [1, 2, 3, 4, 6, 8, 12, 16]
KNOBS = {"overlap_comm": (True, False), "reduce_bucket_size": (5 * 10**6, 5 * 10**7, 5 * 10**8)}
POINTS = stage_points(2, [(m, 1, m) for m in MICRO], KNOBS)

SYNTHETIC = {  # samples/s over a 48-point stage-2 space, each with its optimum inside the grid
    "separable": lambda p: 100 - 6 * (math.log2(p.micro_batch) - 2.6) ** 2
    - 9 * (math.log10(p.knob("reduce_bucket_size")) - 7.2) ** 2 + (4 if p.knob("overlap_comm") else 0),
    "interaction": lambda p: 100 - 6 * (math.log2(p.micro_batch) - 2.6) ** 2
    - 9 * (math.log10(p.knob("reduce_bucket_size")) - 6 - 0.5 * math.log2(p.micro_batch)) ** 2
    + (4 if p.knob("overlap_comm") else 0),
    "saturating": lambda p: 200 * p.micro_batch / (p.micro_batch + 3) - (40 if p.micro_batch > 12 else 0)
    - 5 * abs(math.log10(p.knob("reduce_bucket_size")) - 7.7) + (3 if not p.knob("overlap_comm") else 0),
}


def trials_to_optimum(tuner, values, seed, metric="throughput"):
    rows = features(POINTS)
    pick = min if metric == "latency" else max
    optimum = pick(range(len(values)), key=values.__getitem__)
    run = explore(len(POINTS), lambda i: values[i], tuner=tuner, metric=metric, num_trials=len(POINTS),
                  early_stopping=None, rows=rows, seed=seed)
    assert sorted(t.index for t in run.trials) == list(range(len(POINTS)))  # every point once, none twice
    assert run.best.index == optimum
    return [t.index for t in run.trials].index(optimum) + 1


# ---------------------------------------------------------------------------- tuners
def test_gridsearch_goes_in_grid_order_and_random_shuffles_reproducibly():
    values = [SYNTHETIC["separable"](p) for p in POINTS]
    grid = explore(len(POINTS), lambda i: values[i], tuner="gridsearch", metric="throughput", num_trials=100,
                   early_stopping=None)
    assert [t.index for t in grid.trials] == list(range(len(POINTS)))
    orders = [[t.index for t in explore(len(POINTS), lambda i: values[i], tuner="random", metric="throughput",
                                        num_trials=100, early_stopping=None, seed=seed).trials] for seed in (1, 1, 2)]
    assert orders[0] == orders[1] != orders[2] and orders[0] != list(range(len(POINTS)))


@pytest.mark.parametrize("name", sorted(SYNTHETIC))
def test_model_based_finds_the_optimum_in_fewer_trials_than_random(name):
    values = [SYNTHETIC[name](p) for p in POINTS]
    seeds = range(20)
    model = statistics.mean(trials_to_optimum("model_based", values, s) for s in seeds)
    random_ = statistics.mean(trials_to_optimum("random", values, s) for s in seeds)
    assert model < 0.6 * random_, (model, random_)  # measured: about 9 against about 24 of 48


def test_model_based_minimises_latency():
    latency = [1000.0 / (200.0 + SYNTHETIC["interaction"](p)) for p in POINTS]  # ms: positive, lowest best
    seeds = range(10)
    model = statistics.mean(trials_to_optimum("model_based", latency, s, "latency") for s in seeds)
    assert model < 0.6 * statistics.mean(trials_to_optimum("random", latency, s, "latency") for s in seeds)


def test_early_stopping_stops_that_many_trials_after_the_best():
    falling = [100.0 - i for i in range(20)]  # the first point is the best
    run = explore(20, lambda i: falling[i], tuner="gridsearch", metric="throughput", num_trials=50, early_stopping=3)
    assert len(run.trials) == 4 and run.stopped_early and run.best.index == 0
    rising_then_flat = [float(min(i, 5)) for i in range(20)]  # best at 5, no better after it
    run = explore(20, lambda i: rising_then_flat[i], tuner="gridsearch", metric="throughput", num_trials=50,
                  early_stopping=4)
    assert len(run.trials) == 10 and run.best_position == 6
    failing = explore(20, lambda i: None, tuner="random", metric="throughput", num_trials=50, early_stopping=5)
    assert len(failing.trials) == 5 and failing.best is None  # no success: counted from the start
    capped = explore(20, lambda i: float(i), tuner="gridsearch", metric="throughput", num_trials=7, early_stopping=5)
    assert len(capped.trials) == 7 and not capped.stopped_early


def test_model_based_starts_spread_out():
    rows = [[0.0, 0.0], [0.1, 0.0], [1.0, 1.0], [0.5, 0.5]]
    tuner = ModelBased(rows, "throughput")
    assert tuner.next(set(), []) == 0
    from dstrain.autotuning.tuners import Trial

    assert tuner.next({0}, [Trial(0, 1.0)]) == 2  # the farthest from the first


def test_the_cost_model_fits_a_quadratic():
    rows = [[x / 4, y / 4] for x in range(5) for y in range(5)]
    target = [3 + 2 * a - 5 * b * b + 1.5 * a * b for a, b in rows]
    model = QuadraticModel(ridge=1e-9)
    model.fit(rows, target)
    assert max(abs(p - t) for p, t in zip(model.predict(rows), target)) < 1e-5


# ---------------------------------------------------------------------------- ranking
def test_the_metrics_direction():
    assert check_metric("FLOPS") == "flops"
    assert better("latency", 10.0, 20.0) and not better("latency", 20.0, 10.0)
    assert better("throughput", 20.0, 10.0) and better("flops", 1e9, None) and not better("flops", None, 1.0)
    assert score("latency", 4.0) == 0.25 and score("throughput", None) == 0.0
    items = [("b", 5.0), ("a", 5.0), ("c", None), ("d", 1.0)]
    assert [n for n, _ in ranked(items, "latency", lambda x: x[1], lambda x: x[0])] == ["d", "a", "b"]
    assert [n for n, _ in ranked(items, "throughput", lambda x: x[1], lambda x: x[0])] == ["a", "b", "d"]
    with pytest.raises(ValueError, match=r"autotuning\.metric"):
        check_metric("speed")


# ---------------------------------------------------------------------------- the whole search
class Machine:
    """Synthetic experiments: a model of `params` parameters whose activations take `activation` bytes a
    sample, on devices of `memory` bytes; throughput from `speed(point)`; `crash(point)` fails a run."""

    def __init__(self, *, params=1_000_000, activation=1_000_000, memory=100_000_000, speed=None, crash=None,
                 report_activation=True):
        from dstrain.autotuning.memory import model_state_bytes

        self.states = model_state_bytes
        self.params, self.activation, self.memory = params, activation, memory
        self.speed = speed or (lambda p: 10.0 * p.micro_batch / (p.micro_batch + 4) * (1 - 0.05 * p.stage))
        self.crash = crash or (lambda p: False)
        self.report_activation = report_activation
        self.runs = []

    def __call__(self, point):
        self.runs.append(point)
        if self.crash(point):
            return Outcome("crash", reason="RuntimeError: boom", seconds=1.0)
        need = self.states(point.stage, self.params, 10_000, 2) + self.activation * point.micro_batch
        if need > self.memory:
            return Outcome("oom", reason="torch.OutOfMemoryError: CUDA out of memory", seconds=1.0)
        value = self.speed(point)
        return Outcome("ok", {"throughput": value, "latency": 1000.0 * point.train_batch / value,
                              "num_params": self.params, "largest_layer_params": 10_000,
                              "device_memory_bytes": self.memory,
                              "activation_memory_bytes": self.activation * point.micro_batch * self.report_activation,
                              "train_micro_batch_size_per_gpu": point.micro_batch}, seconds=1.0)


def search(raw, machine, world=2, **kwargs):
    return Search(read_request(raw, world_size=world), machine, **kwargs).run()


def test_the_estimate_keeps_impossible_points_from_being_launched():
    machine = Machine()
    result = search({"zero_optimization": {"stage": 0}}, machine)
    fit = (90_000_000 - 16_000_000) // 1_000_000  # 90% of the device, less stage 0's model states
    assert max(p.micro_batch for p in machine.runs) == fit
    assert all(r.outcome.ok for r in result.records)  # nothing ran out of memory: it was never tried
    assert any("not launched" in note for note in result.notes)
    assert result.best.point.micro_batch == fit


def test_the_memory_probe_bisects_to_the_largest_micro_batch_that_runs():
    machine = Machine(report_activation=False, memory=53_000_000)  # no estimate: only experiments can tell
    result = search({"zero_optimization": {"stage": 0}, "autotuning": {"max_train_batch_size": 100}}, machine, world=1)
    largest = (53_000_000 - 16_000_000) // 1_000_000  # 37
    assert max(r.point.micro_batch for r in result.records if r.outcome.ok) == largest
    assert {r.outcome.status for r in result.records} == {"ok", "oom"}
    ran = {r.point.micro_batch for r in result.records if r.outcome.ok}
    assert {18, 28, largest} <= ran and len(result.explorations["z0"].trials) == 3  # tuned from half the largest
    assert any(f"largest micro-batch that runs is {largest}" in note for note in result.notes)
    assert len(machine.runs) <= 12  # the first run, the top, a bisection of 1..100 and the tuning points


def test_failed_experiments_are_recorded_and_skipped():
    machine = Machine(crash=lambda p: p.micro_batch == 4 and p.stage == 1)
    result = search({"zero_optimization": {"stage": [0, 1]}, "train_micro_batch_size_per_gpu": [2, 4, 8]}, machine)
    crashed = [r for r in result.records if r.outcome.status == "crash"]
    assert [r.point.name for r in crashed] == ["z1_gas1_tmbspg4"]
    assert len(result.records) == 6 and result.best.outcome.ok and result.best.point.name == "z0_gas1_tmbspg8"
    text = summary_text(result)
    assert "z1_gas1_tmbspg4: crash: RuntimeError: boom" in text


def test_every_experiment_respects_max_train_batch_size():
    machine = Machine(memory=10**12)
    result = search({"autotuning": {"max_train_batch_size": 48, "fast": False}}, machine, world=2)
    assert machine.runs
    for point in machine.runs:
        assert point.train_batch == point.micro_batch * point.gas * 2 <= 48
    assert max(p.micro_batch for p in machine.runs) == 24
    assert result.best is not None


def test_higher_stages_stop_when_they_cannot_help_unless_listed():
    machine = Machine(memory=10**12)
    result = search({"autotuning": {"max_train_batch_size": 16}}, machine)
    assert sorted({r.point.stage for r in result.records}) == [0, 1]  # z1: no faster, no larger micro-batch
    assert any("were not tuned" in note for note in result.notes)
    listed = search({"autotuning": {"max_train_batch_size": 16}, "zero_optimization": {"stage": [0, 1, 2, 3]}},
                    Machine(memory=10**12))
    assert sorted({r.point.stage for r in listed.records}) == [0, 1, 2, 3]


def test_points_the_config_check_refuses_are_never_launched():
    machine = Machine(memory=10**12)
    result = search({"zero_optimization": {"stage": 2, "reduce_bucket_size": [0, 500_000_000]},
                     "train_micro_batch_size_per_gpu": [2], "autotuning": {"fast": False}}, machine)
    assert all(p.knob("reduce_bucket_size") != 0 for p in machine.runs)
    assert any("reduce_bucket_size" in note and "not launched" in note for note in result.notes)
    assert len(result.records) == 2  # overlap on and off at the one valid bucket


def test_the_tuner_and_its_limits_apply_within_each_stage():
    machine = Machine(memory=10**12)
    result = search({"zero_optimization": {"stage": 2}, "train_micro_batch_size_per_gpu": [1, 2, 4, 8],
                     "autotuning": {"fast": False, "tuner_type": "gridsearch", "tuner_num_trials": 5}}, machine)
    assert len(result.records) == 5 and len(result.explorations["z2"].trials) == 5


# ---------------------------------------------------------------------------- outputs
def test_summary_table_csv_and_progress_line():
    machine = Machine(crash=lambda p: p.micro_batch == 2)
    lines = []
    result = search({"zero_optimization": {"stage": [0, 1]}, "train_micro_batch_size_per_gpu": [2, 4]}, machine,
                    progress=lambda p: lines.append(progress_line(p, "throughput")))
    text = summary_text(result)
    assert "| tuning_space | num_experiments | best_metric_val | best_exp_name   |" in text
    assert "| global       |               4 |" in text and "Total number of experiments: 4" in text
    rows = list(csv.DictReader(io.StringIO(summary_csv(result))))
    assert [r["name"] for r in rows] == [r.point.name for r in result.records]
    assert {r["status"] for r in rows} == {"ok", "crash"}
    ok = next(r for r in rows if r["status"] == "ok")
    assert float(ok["throughput_samples_per_s"]) > 0 and int(ok["train_batch_size"]) == int(ok["micro_batch"]) * 2
    assert len(lines) == 4 and lines[0].startswith("[1/~4] z0_gas1_tmbspg2 (probe): crash (RuntimeError: boom)")
    assert "left" in lines[1] and "last planned" in lines[-1]


def test_progress_line_counts_down_the_time_left():
    machine = Machine()
    record = search({"zero_optimization": {"stage": 0}, "train_micro_batch_size_per_gpu": [2]}, machine).records[0]
    line = progress_line(Progress(record, 3, 5, 62.0, 20.0, record), "throughput")
    assert line.startswith("[3/~8] z0_gas1_tmbspg2") and "0:01:02 elapsed, ~0:01:40 left" in line


def test_failed_runs_are_told_apart():
    assert classify(1, "torch.OutOfMemoryError: CUDA out of memory. Tried", None, "throughput", 5)[0] == "oom"
    assert classify(1, "RuntimeError: DefaultCPUAllocator: can't allocate memory", None, "throughput", 5)[0] == "oom"
    assert classify(1, "exitcode  : -9 (pid: 7)", None, "throughput", 5)[0] == "oom"
    assert classify(1, "ValueError: bad\ntorch.distributed.elastic.ChildFailedError:", None, "throughput", 5) == \
        ("crash", "ValueError: bad")
    assert classify(None, "", None, "throughput", 5, timed_out=30)[0] == "timeout"
    status, reason = classify(0, "", None, "throughput", 5)
    assert status == "no-metrics" and "step 5" in reason
    assert classify(0, "", {"flops": None, "flops_error": "x"}, "flops", 5) == ("no-metrics", "flops: x")
    assert classify(0, "", {"throughput": 3.0}, "throughput", 5) == ("ok", "")


def test_a_fixed_train_batch_size_starts_from_a_micro_batch_that_divides_it():
    machine = Machine(memory=10**12)
    result = search({"train_batch_size": 24, "train_micro_batch_size_per_gpu": 5, "zero_optimization": {"stage": 1}},
                    machine, world=2)
    assert machine.runs[0].micro_batch == 6 and {p.train_batch for p in machine.runs} == {24}
    assert {p.micro_batch for p in machine.runs} <= {6, 12}
    assert result.best.point.micro_batch in (6, 12)


def test_bucket_sizes_the_model_cannot_fill_are_tried_once():
    machine = Machine(memory=10**12, params=1_000_000)  # every default bucket (5e7 and up) holds the whole model
    result = search({"zero_optimization": {"stage": 2}, "train_micro_batch_size_per_gpu": [2, 4],
                     "autotuning": {"fast": False, "tuner_type": "gridsearch"}}, machine)
    assert {p.knob("reduce_bucket_size") for p in machine.runs} == {50_000_000}
    assert len(result.records) == 4  # 2 micro-batches x overlap on/off


# ---------------------------------------------------------------------------- one experiment (real processes)
def runner_for(tmp_path, code, **kwargs):
    import sys

    from dstrain.autotuning.experiments import ExperimentRunner

    return ExperimentRunner({"optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}}, metric="throughput", end_step=3,
                            exps_dir=tmp_path / "exps", results_dir=tmp_path / "results",
                            command=lambda path, config: [sys.executable, "-c", code], description={"world_size": 1},
                            **kwargs)


def test_an_experiment_reads_the_metrics_its_run_writes(tmp_path):
    from dstrain.autotuning import Point

    writes = ("import json, os; json.dump({'throughput': 5.0, 'num_params': 7}, "
              "open(os.environ['DSTRAIN_AUTOTUNING_METRICS'], 'w'))")
    outcome = runner_for(tmp_path, writes)(Point(1, 2, 1, 2))
    assert outcome.status == "ok" and outcome.metrics["throughput"] == 5.0
    folder = tmp_path / "results" / "z1_gas1_tmbspg2"
    exp = json.loads((folder / "exp.json").read_text())
    assert exp["status"] == "ok" and exp["ds_config"]["zero_optimization"]["stage"] == 1
    assert json.loads((folder / "ds_config.json").read_text()) == exp["ds_config"]
    assert json.loads((tmp_path / "exps" / "z1_gas1_tmbspg2.json").read_text())["world_size"] == 1


def test_earlier_results_are_reused_only_for_the_same_config_and_command(tmp_path):
    from dstrain.autotuning import Point

    point = Point(0, 2, 1, 2)
    first = runner_for(tmp_path, "import sys; sys.exit(3)")(point)
    assert (first.status, first.reason, first.reused) == ("crash", "exit code 3", False)
    again = runner_for(tmp_path, "import sys; sys.exit(3)")(point)
    assert again.reused and again.status == "crash"
    changed = runner_for(tmp_path, "import sys; sys.exit(4)")(point)  # another command: measured anew
    assert not changed.reused and changed.reason == "exit code 4"
    forced = runner_for(tmp_path, "import sys; sys.exit(4)", overwrite=True)(point)
    assert not forced.reused


def test_an_experiment_past_its_timeout_is_stopped_and_recorded(tmp_path):
    import time

    from dstrain.autotuning import Point

    began = time.monotonic()
    outcome = runner_for(tmp_path, "import time; time.sleep(60)", timeout=1.0, grace=5.0)(Point(0, 1, 1, 1))
    assert outcome.status == "timeout" and time.monotonic() - began < 20
