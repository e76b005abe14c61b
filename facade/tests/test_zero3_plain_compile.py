"""engine.compile() without DeepCompile at ZeRO-3: torch.compile runs stage 3's gathering hooks outside its graphs
(graph breaks at each module), and the compiled model trains as the eager one does, on 2 gloo ranks."""

import torch
from engine_models import ADAMW, TokenDataset, config, make_model

import dstrain
from dscomm.testing import run_ranks


def losses(rank, world, compiled, backend):
    torch.manual_seed(0)
    zero = {"stage": 3, "stage3_param_persistence_threshold": 0}
    engine, _, loader, _ = dstrain.initialize(model=make_model(), training_data=TokenDataset(size=32),
                                              config=config(optimizer=ADAMW, zero_optimization=zero))
    if compiled:
        engine.compile(backend=backend)
    out = []
    for batch in loader:
        loss = engine(batch)
        engine.backward(loss)
        engine.step()
        out.append(loss.item())
    return out


def test_a_compiled_stage3_engine_trains_as_the_eager_one():
    eager = run_ranks(losses, 2, False, "aot_eager", timeout=300)
    compiled = run_ranks(losses, 2, True, "aot_eager", timeout=300)
    for mine, reference in zip(compiled, eager):
        assert len(mine) == 4
        torch.testing.assert_close(mine, reference, rtol=1e-5, atol=1e-6)
