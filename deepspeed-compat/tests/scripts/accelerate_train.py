"""An Accelerate training script with a DeepSpeedPlugin, run by `accelerate launch --use_deepspeed` (the test
starts it): a tiny Llama trained at ZeRO 2 and then 3 with gradient accumulation, then the same training
through dstrain's engine directly; the losses printed as JSON by the main process."""

import json
import os
import sys

import torch
from accelerate import Accelerator, DeepSpeedPlugin, PartialState
from accelerate.state import AcceleratorState

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from hf_runs import Tokens, mean_over_ranks, tiny_llama

import dstrain

# Accelerate picks a process-group backend only where it finds an accelerator (nccl on GPUs): name gloo here.
PartialState(backend="gloo")
report = {}
for stage in (2, 3):
    model = tiny_llama()
    plugin = DeepSpeedPlugin(zero_stage=stage, gradient_accumulation_steps=2, gradient_clipping=1.0,
                             zero3_save_16bit_model=True)
    accelerator = Accelerator(deepspeed_plugin=plugin)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    engine, optimizer, loader = accelerator.prepare(model, optimizer, torch.utils.data.DataLoader(Tokens(), batch_size=2))
    losses = []
    for batch in loader:
        with accelerator.accumulate(engine):
            loss = engine(**batch).loss
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
        losses.append(accelerator.gather(loss.detach()).mean().item())
    state = accelerator.get_state_dict(engine)  # whole on the main process, gathered at ZeRO-3
    report[stage] = {"losses": losses, "engine": f"{type(engine).__module__}.{type(engine).__name__}",
                     "state_keys": None if state is None else len(state)}
    accelerator.free_memory()
    AcceleratorState._reset_state()

# The same training as a DeepSpeed script writes it, on dstrain's engine directly: rank r takes batch r of each
# group of `world` (as Accelerate's prepared loader deals them), step() after every micro-batch.
model, world, rank = tiny_llama(), PartialState().num_processes, PartialState().process_index
engine, *_ = dstrain.initialize(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=1e-2),
                                config={"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2,
                                        "gradient_clipping": 1.0, "zero_optimization": {"stage": 3}})
data, direct = Tokens(), []
for step in range(len(data) // (2 * world)):
    first = (step * world + rank) * 2
    batch = {key: torch.stack([data[i][key] for i in range(first, first + 2)]) for key in ("input_ids", "labels")}
    loss = engine(**batch).loss
    engine.backward(loss)
    engine.step()
    direct.append(mean_over_ranks(loss.item()))
report["direct"] = direct
if PartialState().is_main_process:
    print("REPORT " + json.dumps(report))
