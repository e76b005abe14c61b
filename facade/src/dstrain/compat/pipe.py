"""`dstrain.pipe`, as `deepspeed.pipe`: the pipeline model API (dspipe's), for `import dstrain as deepspeed`.

    from dstrain.pipe import PipelineModule, LayerSpec
    net = PipelineModule(layers=[LayerSpec(nn.Linear, 1024, 1024), nn.ReLU(), ...], num_stages=2, loss_fn=loss)
    engine, *_ = dstrain.initialize(model=net, config="ds_config.json")   # a PipelineEngine
    loss = engine.train_batch(data_iter)
"""

from dscomm import PipeDataParallelTopology, PipeModelDataParallelTopology, ProcessTopology

from ..wiring.optional_libs import require

try:  # dspipe is an optional library: name its install, not a stack
    from dspipe import DualPipeVModule, LayerSpec, PipelineModule, TiedLayerSpec
except ModuleNotFoundError:
    require("dspipe", "dstrain.pipe (pipeline parallelism)")
    raise

from ..engine.pipeline_engine import PipelineEngine

__all__ = ["DualPipeVModule", "LayerSpec", "PipeDataParallelTopology", "PipeModelDataParallelTopology",
           "PipelineEngine", "PipelineModule", "ProcessTopology", "TiedLayerSpec"]
