"""CPU optimizer offload through the engine: the config's Adam/AdamW steps with dszero's fused CPUAdam (as
DeepSpeed selects DeepSpeedCPUAdam), and low-precision master weights keep fp32 optimizer states on the CPU
unless bf16_optimizer_states asks for bf16 ones."""

import pytest
import torch
from engine_models import ADAMW, TokenDataset, config, make_model

import dstrain
import dszero
from dscomm.testing import run_ranks

OFFLOAD = {"device": "cpu", "pin_memory": False}


def train(rank, world, stage=2, steps=4, optimizer=ADAMW, offload=True, client=False, **extra):
    model = make_model()
    zero = {"stage": stage, "stage3_param_persistence_threshold": 0}
    if offload:
        zero["offload_optimizer"] = OFFLOAD
    cfg = config(**extra)
    cfg["zero_optimization"] = zero
    if client:
        engine, *_ = dstrain.initialize(model=model, config=cfg,
                                        optimizer=torch.optim.AdamW(model.parameters(), lr=1e-2))
    else:
        engine, *_ = dstrain.initialize(model=model, config={**cfg, "optimizer": optimizer})
    data = TokenDataset().data
    losses = []
    for i in range(steps):
        loss = engine(data[(i % 2) * 4:(i % 2 + 1) * 4])
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    states = [v for s in engine.optimizer.optimizer.state.values() for k, v in s.items() if k.startswith("exp_avg")]
    masters = [g.master for g in engine.optimizer.groups]
    return {"optimizer": type(engine.basic_optimizer).__name__, "losses": losses,
            "states": sorted({(str(t.dtype), t.device.type) for t in states}),
            "masters": sorted({(str(t.dtype), t.device.type) for t in masters})}


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_config_adamw_under_cpu_offload_steps_with_cpu_adam(stage):
    offloaded, on_device = (run_ranks(train, 2, stage, offload=flag)[0] for flag in (True, False))
    assert offloaded["optimizer"] == "DeepSpeedCPUAdam" and on_device["optimizer"] == "AdamW"
    assert offloaded["states"] == [("torch.float32", "cpu")] and offloaded["masters"] == [("torch.float32", "cpu")]
    # The same update as torch's AdamW on the device (the kernel's arithmetic mirrors it).
    assert offloaded["losses"] == pytest.approx(on_device["losses"], rel=1e-4)
    assert offloaded["losses"][-1] < offloaded["losses"][0]


def test_adam_with_torch_adam_true_keeps_torch_under_offload():
    adam = {"type": "Adam", "params": {"lr": 1e-2, "torch_adam": True}}
    assert run_ranks(train, 1, optimizer=adam)[0]["optimizer"] == "AdamW"  # Adam's adam_w_mode default: AdamW
    adam = {"type": "Adam", "params": {"lr": 1e-2, "adam_w_mode": False}}
    assert run_ranks(train, 1, optimizer=adam)[0]["optimizer"] == "DeepSpeedCPUAdam"


@pytest.mark.parametrize(("precision", "states"), [
    ({"bf16": {"enabled": True, "bf16_master_weights_and_grads": True}}, "torch.float32"),
    ({"bf16": {"enabled": True, "bf16_master_weights_and_grads": True, "bf16_optimizer_states": True}},
     "torch.bfloat16"),
    ({"fp16": {"enabled": True, "fp16_master_weights_and_grads": True, "initial_scale_power": 8}}, "torch.float32"),
], ids=["bf16-fp32-states", "bf16-bf16-states", "fp16-fp32-states"])
def test_low_precision_masters_keep_the_states_the_reference_says_on_the_cpu(precision, states):
    result = run_ranks(train, 2, 2, steps=6, **precision)[0]
    master = "torch.bfloat16" if "bf16" in precision else "torch.float16"
    assert result["optimizer"] == "DeepSpeedCPUAdam"
    assert result["masters"] == [(master, "cpu")] and result["states"] == [(states, "cpu")]
    assert result["losses"][-1] < result["losses"][0]


def test_a_client_optimizer_that_cannot_keep_fp32_states_is_refused_by_key():
    def attempt(rank, world):
        try:
            train(rank, world, client=True, bf16={"enabled": True, "bf16_master_weights_and_grads": True})
        except dszero.ZeroConfigError as exc:
            return str(exc)
        return ""

    message = run_ranks(attempt, 1)[0]
    assert "bf16.bf16_master_weights_and_grads" in message and "CPUAdam" in message


def _nvme_offload_init(rank, world, tmp, zero_extra, aio):
    import dsconfig

    cfg = config()
    cfg["zero_optimization"] = {"stage": 3, **zero_extra}
    cfg["aio"] = aio
    try:
        dstrain.initialize(model=make_model(), config={**cfg, "optimizer": ADAMW})
    except dsconfig.ConfigError as exc:
        return exc.paths, str(exc)
    return None, "initialized"


@pytest.mark.parametrize(("zero_extra", "aio", "path"), [
    ({"offload_optimizer": {"device": "nvme", "nvme_path": "{tmp}", "buffer_count": 1e9, "pin_memory": True}}, {},
     "zero_optimization.offload_optimizer.buffer_count"),
    ({"offload_param": {"device": "nvme", "nvme_path": "{tmp}"}}, {"queue_depth": 1e9}, "aio.queue_depth"),
])
def test_nvme_offload_sizes_this_machine_cannot_give_are_refused_at_initialize(tmp_path, zero_extra, aio, path):
    # A billion pinned buffers used to be allocated until the host ran out; the queue failed at the first swap.
    zero_extra = {k: {**v, "nvme_path": str(tmp_path)} for k, v in zero_extra.items()}
    paths, message = run_ranks(_nvme_offload_init, 1, str(tmp_path), zero_extra, aio, timeout=120)[0]
    assert paths == [path], message
    assert "this machine has" in message or "at most" in message
