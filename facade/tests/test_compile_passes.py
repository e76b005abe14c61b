"""compile.passes through initialize() and engine.compile(), on one set of 4 ranks: ["autosp",
"long_context_checkpointing"] at sp 2 x dp 2 (ZeRO-2 over sequence x data) trains as one rank on the whole
global batch (float64: the losses and the weights after two steps), with the pass recomputing activations;
["autotp"] at tp 2 x dp 2 trains as eager AutoTP (the collectives in the graph instead of the layers). What
either cannot run is refused by key, and an uncompiled AutoSP forward is refused rather than trained
unsharded."""

import pytest
import torch
from test_sequence_parallel import SEQ, SGD, hf_model, reference_run, sample

import dstrain
from dscomm.testing import run_ranks
from dsseq import prepare_autosp_inputs


@pytest.fixture(autouse=True, scope="module")
def _modeling_code_loaded_before_forking():
    hf_model(num_hidden_layers=1)
    _warm_compiler()


def config(stage=2, sp=2):
    return {"train_micro_batch_size_per_gpu": 1, "gradient_clipping": 0.0, "steps_per_print": 10_000,
            "zero_optimization": {"stage": stage}, "optimizer": SGD, "sequence_parallel_size": sp,
            "compile": {"deepcompile": True, "passes": ["autosp", "long_context_checkpointing"]}}


def tp_config(stage=2, passes=("autotp",)):
    return {"train_micro_batch_size_per_gpu": 1, "gradient_clipping": 0.0, "steps_per_print": 10_000,
            "zero_optimization": {"stage": stage}, "optimizer": SGD,
            # the autotp pass splits by the model's own Hugging Face plan (its lm_head colwise_gather_output entry left
            # out: the pass gathers no output), eager AutoTP by the llama preset: the same cut
            "tensor_parallel": {"autotp_size": 2, **({} if "autotp" in passes else {"preset_model": "llama"})},
            "compile": {"deepcompile": bool(passes), "passes": list(passes)}}


def autotp_against_eager(rank, refused):
    """Each rank's losses and weights after two steps: (eager AutoTP, the autotp pass)."""
    runs = []
    for passes in ((), ("autotp",)):
        model = hf_model()
        engine, *_ = dstrain.initialize(model=model, config=tp_config(passes=passes))
        if passes:
            engine.compile(backend="aot_eager")
        losses = []
        for step in range(2):
            ids = sample(10 + 2 * step + rank // 2)["input_ids"]  # tensor ranks are consecutive
            loss = engine(input_ids=ids, labels=ids).loss
            engine.backward(loss)
            engine.step()
            losses.append(loss.item())
        runs.append((losses, {name: p.detach().clone() for name, p in model.named_parameters()}))
        engine.destroy()
    other, *_ = dstrain.initialize(model=hf_model(), config=tp_config(stage=3))
    try:
        other.compile(backend="aot_eager")
    except dstrain.UnsupportedFeatureError as exc:
        refused["autotp stage 3"] = str(exc)
    eager, compiled = runs
    return max([abs(a - b) for a, b in zip(eager[0], compiled[0])]
               + [(eager[1][n] - compiled[1][n]).abs().max().item() for n in eager[1]])


def autosp_sp2_dp2(rank, world):
    torch.set_num_threads(1)
    refused = {}
    model = hf_model()
    engine, *_ = dstrain.initialize(model=model, config=config())
    replica = rank // 2  # the sequence ranks of a replica are consecutive
    try:
        engine(**dict(zip(("input_ids", "labels", "position_ids"), prepare_autosp_inputs(*[sample(0)["input_ids"]] * 2))))
    except dstrain.DstrainError as exc:
        refused["uncompiled forward"] = str(exc)
    engine.compile(backend="aot_eager")
    losses = []
    for step in range(2):
        ids = sample(2 * step + replica)["input_ids"]
        ids, labels, position_ids, _ = prepare_autosp_inputs(ids, ids.clone())
        loss = engine(input_ids=ids, labels=labels, position_ids=position_ids).loss
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    params = {name: p.detach().clone() for name, p in model.named_parameters()}
    plans = engine.deepcompile_runtime.backend.partitioner.plans  # AutoSP's graphs, through the pass
    recomputed = [(plan.attention, len(plan.recomputed)) for plan in plans]
    engine.destroy()
    assert model.forward.__self__ is model
    for name, cfg in (("stage 3", config(stage=3)), ("sp 1", config(sp=1))):
        other, *_ = dstrain.initialize(model=hf_model(), config=cfg)
        try:
            other.compile(backend="aot_eager")
        except dstrain.UnsupportedFeatureError as exc:
            refused[name] = str(exc)
    autotp_gap = autotp_against_eager(rank, refused)
    return losses, params, engine.dp_world_size, refused, autotp_gap, recomputed


def test_autosp_sp2_by_dp2_trains_as_one_rank_and_autotp_as_eager_autotp_and_refuse_by_key(monkeypatch):
    import dscompile.passes.long_context

    # each rank's slice is 8 tokens: long_context_checkpointing recomputes from there (4096 in a real run)
    monkeypatch.setattr(dscompile.passes.long_context, "MIN_SEQ_LEN", SEQ // 2)
    results = run_ranks(autosp_sp2_dp2, 4, timeout=600)
    ref_losses, ref_params = reference_run([[sample(0)["input_ids"], sample(1)["input_ids"]],
                                            [sample(2)["input_ids"], sample(3)["input_ids"]]])
    for rank, (losses, params, dp, refused, autotp_gap, recomputed) in enumerate(results):
        assert dp == 2
        assert recomputed and recomputed[0][0] == 2 and recomputed[0][1] > 10, recomputed  # both layers' attention
        # gradients cross the wire in seq_parallel_communication_data_type (fp32), as DeepSpeed's: the second
        # step starts from weights rounded there
        assert abs(losses[0] - ref_losses[0][rank // 2]) < 1e-12
        assert abs(losses[1] - ref_losses[1][rank // 2]) < 1e-6
        assert max((params[n] - ref_params[n]).abs().max().item() for n in params) < 1e-6
        assert "engine.compile()" in refused["uncompiled forward"]
        assert "zero_optimization.stage" in refused["stage 3"]
        assert "sequence_parallel_size" in refused["sp 1"] and "autosp" in refused["sp 1"]
        assert autotp_gap < 1e-10, autotp_gap
        assert "zero_optimization.stage" in refused["autotp stage 3"] and "autotp" in refused["autotp stage 3"]


def _warm_compiler():
    """torch.compile once here before forking ranks: each rank's first compile would otherwise spend most of its
    time loading and priming dynamo and AOT autograd. No process group exists here; the ranks inherit warm caches."""
    model = torch.nn.Sequential(torch.nn.Embedding(8, 4), torch.nn.LayerNorm(4), torch.nn.Linear(4, 4))
    torch.compile(model, backend="aot_eager")(torch.randint(0, 8, (2, 3))).sum().backward()
    torch._dynamo.reset()
