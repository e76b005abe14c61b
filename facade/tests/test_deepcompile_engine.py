"""engine.compile() with compile.deepcompile (dscompile): the engine trains as it does eagerly, fp16 loss
scaling, clipping, gradient accumulation, the monitors and the comms log included; checkpoints move
between compiled and eager runs both ways; what DeepCompile cannot do is refused naming the key."""

import csv
import warnings

import pytest
import torch
from engine_models import ADAMW, TokenDataset, config, make_model

import dscomm
import dstrain
from dscomm.testing import run_ranks
from dstrain.errors import DstrainError, UnsupportedFeatureError


@pytest.fixture(scope="module", autouse=True)
def _warm_compiler():
    """torch.compile once here before forking ranks: each rank's first compile would otherwise spend most of its
    time loading and priming dynamo and AOT autograd. No process group exists here; the ranks inherit warm caches."""
    model = torch.nn.Sequential(torch.nn.Embedding(8, 4), torch.nn.LayerNorm(4), torch.nn.Linear(4, 4))
    torch.compile(model, backend="aot_eager")(torch.randint(0, 8, (2, 3))).sum().backward()
    torch._dynamo.reset()


def _engine(stage, compiled, **extra):
    torch._dynamo.reset()
    torch.manual_seed(0)
    cfg = config(micro=4, gas=2, stage=stage, optimizer=ADAMW, compile={"deepcompile": compiled}, **extra)
    engine, _, loader, _ = dstrain.initialize(model=make_model(), training_data=TokenDataset(size=64), config=cfg)
    if compiled:
        engine.compile(backend="aot_eager")
    return engine, loader


def _train(engine, loader, steps):
    batches = iter(dstrain.RepeatingLoader(loader))  # a loader resumes where a checkpoint left it
    losses = []
    for _ in range(steps * engine.gradient_accumulation_steps()):
        loss = engine(next(batches))
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    return losses


def _fp16_run(rank, world, directory):
    runs = {}
    for compiled in (False, True):
        extra = {"fp16": {"enabled": True, "initial_scale_power": 18, "loss_scale_window": 2},
                 "gradient_clipping": 0.5, "comms_logger": {"enabled": True},
                 "csv_monitor": {"enabled": True, "output_path": f"{directory}/{compiled}", "job_name": "job"}}
        dscomm.reset_comms_log()
        engine, batches = _engine(3, compiled, **extra)
        losses = _train(engine, batches, 3)
        runs[compiled] = {"losses": losses, "scale": engine.loss_scale, "skipped": engine.skipped_steps,
                          "norm": engine.get_global_grad_norm(), "compiled": engine.is_compiled,
                          "stats": dict(engine.deepcompile_runtime.stats) if compiled else {},
                          "comms": sorted(dscomm.get_comms_log())}
        engine.destroy()
    return runs


def test_compiled_zero3_engine_trains_as_the_eager_one(tmp_path):
    for runs in run_ranks(_fp16_run, 2, str(tmp_path), timeout=300):
        eager, compiled = runs[False], runs[True]
        assert compiled["compiled"] and not eager["compiled"]
        torch.testing.assert_close(compiled["losses"], eager["losses"], rtol=1e-5, atol=0)
        assert (compiled["scale"], compiled["skipped"]) == (eager["scale"], eager["skipped"])
        assert eager["skipped"] > 0  # the fp16 scale started too high: overflow steps were skipped alike
        assert compiled["norm"] == pytest.approx(eager["norm"], rel=1e-5)  # clipped by the same norm
        assert compiled["stats"]["gathers"] > 0 and compiled["stats"]["reduces"] > 0
        assert "zero3_gather" in compiled["comms"]  # the graph's gathers are logged as eager ZeRO's are
    rows = list(csv.reader(next((tmp_path / "True").rglob("Train_Samples_train_loss.csv")).read_text().splitlines()))
    assert len(rows) == 1 + 3  # the monitor wrote a loss per optimizer step


def _save_then_resume(rank, world, directory, save_compiled, stage):
    engine, batches = _engine(stage, save_compiled)
    _train(engine, batches, 2)
    engine.save_checkpoint(directory, client_state={"step": 2})
    after = _train(engine, batches, 2)
    engine.destroy()
    resumed, batches = _engine(stage, not save_compiled)
    _path, client = resumed.load_checkpoint(directory)
    return client, after, _train(resumed, batches, 2), resumed.global_steps


@pytest.mark.parametrize(("save_compiled", "stage"), [(True, 3), (False, 2)])
def test_checkpoints_move_between_compiled_and_eager_runs(tmp_path, save_compiled, stage):
    for client, after, resumed, steps in run_ranks(_save_then_resume, 2, str(tmp_path), save_compiled, stage,
                                                   timeout=300):
        assert client == {"step": 2} and steps == 4
        torch.testing.assert_close(resumed, after, rtol=1e-5, atol=0)


def _refusals(rank, world):
    seen = {}
    cases = {
        "compile.passes": dict(stage=3, compile={"deepcompile": True, "passes": ["autosp"]}),
        "compile.passes at stage 0": dict(stage=0, compile={"deepcompile": True, "passes": ["autosp"]}),
        "zero_optimization.zero_quantized_weights": dict(stage=3, compile={"deepcompile": True}),
        "schedule": dict(stage=3, compile={"deepcompile": True}),
        "schedule without deepcompile": dict(stage=3),
    }
    for name, case in cases.items():
        cfg = config(stage=case.pop("stage"), optimizer=ADAMW, **case)
        if name.startswith("zero_optimization"):
            cfg["zero_optimization"]["zero_quantized_weights"] = True
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                engine, *_ = dstrain.initialize(model=make_model(), config=cfg)  # the gate refuses autosp / autotp
            engine.compile(backend="aot_eager", schedule=[(0, ["zero3_compile", "warp_speed"])]
                           if name.startswith("schedule") else None)
            seen[name] = "accepted"
        except (UnsupportedFeatureError, DstrainError, ValueError) as exc:
            seen[name] = f"{type(exc).__name__}: {exc}"
    torch._dynamo.reset()
    engine, _ = _engine(0, True)  # stage 0: plainly compiled, as the reference falls back to torch.compile
    seen["stage 0"] = (engine.is_compiled, engine.deepcompile_runtime)
    return seen


def test_what_deepcompile_cannot_do_is_refused_naming_the_key():
    seen = run_ranks(_refusals, 1, timeout=300)[0]
    for name in ("compile.passes", "compile.passes at stage 0"):  # AutoSP needs sequence_parallel_size, stages 0-2
        assert seen[name].startswith("UnsupportedFeatureError") and "compile.passes" in seen[name], seen[name]
        assert "autosp" in seen[name]
    assert "zero_optimization.zero_quantized_weights" in seen["zero_optimization.zero_quantized_weights"]
    assert "unknown pass 'warp_speed'" in seen["schedule"]
    assert "deepcompile" in seen["schedule without deepcompile"]
    assert seen["stage 0"] == (True, None)
