"""dstrain.initialize(model=PipelineModule(...)) gives a PipelineEngine that trains as plain data
parallelism does: ZeRO-1 and ZeRO-2 beside the pipeline (one ZeroOptimizer per stage over its data
group, the norm decided over every rank) equal the plain engine on the unpipelined model, in float64
(a float64 model trains in dszero's "fp64"), with tied embeddings and gradient clipping."""

import pytest
import torch
from torch import nn

import dscomm
import dstrain
from dscomm.testing import run_ranks
from dstrain.pipe import DualPipeVModule, LayerSpec, PipelineModule, TiedLayerSpec

VOCAB, WIDTH, MICRO, GAS, STEPS = 13, 8, 2, 4, 3
ADAMW = {"type": "AdamW", "params": {"lr": 0.02, "weight_decay": 0.01}}


def project(embedding, hidden):
    return hidden @ embedding.weight.t()


def token_loss(logits, labels):
    return nn.functional.cross_entropy(logits.reshape(-1, VOCAB), labels.reshape(-1))


def layers(tied: bool) -> list:
    specs = [TiedLayerSpec("embed", nn.Embedding, VOCAB, WIDTH) if tied else LayerSpec(nn.Embedding, VOCAB, WIDTH)]
    for _ in range(3):
        specs += [LayerSpec(nn.Linear, WIDTH, WIDTH), nn.Tanh()]
    specs.append(TiedLayerSpec("embed", nn.Embedding, VOCAB, WIDTH, forward_fn=project) if tied
                 else LayerSpec(nn.Linear, WIDTH, VOCAB, bias=False))
    return specs


def batch(step, replica, micro):
    gen = torch.Generator().manual_seed(1000 * step + 100 * replica + micro)
    return torch.randint(0, VOCAB, (MICRO, 5), generator=gen), torch.randint(0, VOCAB, (MICRO, 5), generator=gen)


class Unpiped(nn.Module):
    """The same layers, built with the same per-layer seeds, as one plain module whose forward is the loss."""

    def __init__(self, specs, base_seed=1234):
        super().__init__()
        self.layers, self.tied, self.funcs = nn.ModuleDict(), nn.ModuleDict(), []
        for index, spec in enumerate(specs):
            torch.manual_seed(base_seed + index)
            if isinstance(spec, TiedLayerSpec):
                if spec.key not in self.tied:
                    self.tied[spec.key] = spec.build()
                module = self.tied[spec.key]
                self.funcs.append(module if spec.forward_fn is None else (lambda x, m=module, f=spec.forward_fn: f(m, x)))
            elif isinstance(spec, LayerSpec):
                self.layers[str(index)] = spec.build()
                self.funcs.append(self.layers[str(index)])
            else:
                self.funcs.append(spec)

    def forward(self, pair):
        x, labels = pair
        for func in self.funcs:
            x = func(x)
        return token_loss(x, labels)


def pipe_name(name: str) -> str:
    """The plain module's parameter name of a PipelineModule parameter ("3.weight" -> "layers.3.weight")."""
    return name.replace("tied_modules.", "tied.") if name.startswith("tied_modules.") else f"layers.{name}"


CASES = [  # (ZeRO stage, schedule, tied embedding, gradient clipping)
    (1, "1f1b", False, 0.0),
    (2, "zb_h1", True, 0.5),
    (2, "dualpipev", True, 0.5),
]


def config(stage, clip, **pipeline):
    return {"train_micro_batch_size_per_gpu": MICRO, "gradient_accumulation_steps": GAS, "steps_per_print": 10_000,
            "gradient_clipping": clip, "optimizer": ADAMW,
            "zero_optimization": {"stage": stage, "reduce_bucket_size": 64}, "pipeline": pipeline}


def pipelined(rank, world, cases):
    results = []
    for stage, schedule, tied, clip in cases:
        kind = DualPipeVModule if schedule == "dualpipev" else PipelineModule
        module = kind(layers(tied), num_stages=2, loss_fn=token_loss, seed_layers=True,
                      partition_method="uniform").double()
        cfg = config(stage, clip, **({} if schedule == "dualpipev" else {"schedule": schedule}))
        engine, *_ = dstrain.initialize(model=module, config=cfg)
        assert isinstance(engine, dstrain.PipelineEngine) and engine.schedule == schedule
        replica = engine.groups.rank_in("data")
        losses = [engine.train_batch(iter([batch(step, replica, m) for m in range(GAS)])).item()
                  for step in range(STEPS)]
        results.append((losses, {pipe_name(n): p.detach().clone() for n, p in module.named_parameters()},
                        engine.get_global_grad_norm()))
    return results


def plain(rank, world, cases):
    results = []
    for stage, _schedule, tied, clip in cases:
        model = Unpiped(layers(tied)).double()
        engine, *_ = dstrain.initialize(model=model, config=config(stage, clip))
        losses = []
        for step in range(STEPS):
            total = 0.0
            for m in range(GAS):
                loss = engine(batch(step, rank, m))
                engine.backward(loss)
                engine.step()
                total += loss.item() / GAS
            value = torch.tensor([total], dtype=torch.float64)
            dscomm.all_reduce(value)
            losses.append(value.item() / world)
        results.append((losses, {n: p.detach().clone() for n, p in model.named_parameters()},
                        engine.get_global_grad_norm()))
    return results


def test_zero_1_and_2_beside_the_pipeline_equal_plain_data_parallelism():
    want = run_ranks(plain, 2, CASES, timeout=240)[0]
    got_by_rank = run_ranks(pipelined, 4, CASES, timeout=300)  # pipe 2 x data 2
    for rank, got in enumerate(got_by_rank):
        for case, (losses, params, norm), (want_losses, want_params, want_norm) in zip(CASES, got, want, strict=True):
            torch.testing.assert_close(losses, want_losses, rtol=1e-12, atol=0, msg=lambda m, c=case: f"{c}: {m}")
            assert norm == pytest.approx(want_norm, rel=1e-10), (case, rank)
            for name, value in params.items():
                torch.testing.assert_close(value, want_params[name], rtol=1e-10, atol=1e-12,
                                           msg=lambda m, c=case, n=name, r=rank: f"{c} rank {r} {n}: {m}")


# ---------------------------------------------------------------------------------------------- refusals
def refusals(rank, world, directory):
    messages = {}

    def attempt(name, build):
        try:
            build()
        except (dstrain.DstrainError, dstrain.ConfigError, ValueError, RuntimeError) as exc:
            messages[name] = str(exc)

    def engine(**cfg):
        module = PipelineModule(layers(False), num_stages=2, loss_fn=token_loss, partition_method="uniform")
        return dstrain.initialize(model=module, config={**config(1, 0.0), **cfg})[0]

    attempt("zero3", lambda: engine(zero_optimization={"stage": 3}))
    attempt("stages", lambda: engine(pipeline={"stages": 4}))
    attempt("partition", lambda: engine(pipeline={"partition": "parameters"}))
    attempt("schedule", lambda: engine(pipeline={"schedule": "dualpipev"}))
    attempt("seed", lambda: engine(pipeline={"seed_layers": True}))
    attempt("micro", lambda: dstrain.initialize(model=DualPipeVModule(layers(False), num_stages=2, loss_fn=token_loss,
                                                                      partition_method="uniform"),
                                                config={**config(1, 0.0), "gradient_accumulation_steps": 3}))
    ready = engine(pipeline={"stages": 2, "partition": "uniform"})
    for call in ("forward", "backward", "step"):
        attempt(call, lambda c=call: getattr(ready, c)(torch.zeros(1)))
    stage_info = (ready.is_first_stage(), ready.is_last_stage(), ready.get_pipeline_parallel_rank())
    with ready.tracing(directory):  # the measured timeline, in dspipe's trace format
        ready.train_batch(iter([batch(0, 0, m) for m in range(GAS)]))
    return messages, stage_info


def test_what_a_pipeline_cannot_do_is_refused_by_key_and_a_batch_can_be_traced(tmp_path):
    from dspipe.schedules import Kind, read_trace

    for rank, (messages, stage_info) in enumerate(run_ranks(refusals, 2, tmp_path, timeout=120)):
        assert stage_info == (rank == 0, rank == 1, rank)
        assert "zero_optimization.stage" in messages["zero3"] and "use stage 1 or 2" in messages["zero3"]
        assert "pipeline.stages" in messages["stages"] and "num_stages=2" in messages["stages"]
        assert "pipeline.partition" in messages["partition"] and "partition_method='uniform'" in messages["partition"]
        assert "pipeline.schedule" in messages["schedule"] and "build a DualPipeVModule" in messages["schedule"]
        assert "pipeline.seed_layers" in messages["seed"]
        assert "gradient_accumulation_steps" in messages["micro"] and "micro_batches >= 2 * stages" in messages["micro"]
        for call in ("forward", "backward", "step"):
            assert "Only train_batch() is accessible in pipeline mode." in messages[call]
    events = read_trace(*sorted(tmp_path.glob("pipe_trace_rank*.json")))
    forwards = sorted((e.rank, e.action.stage, e.action.micro_batch) for e in events if e.action.kind is Kind.F)
    assert forwards == [(r, r, m) for r in range(2) for m in range(GAS)]
