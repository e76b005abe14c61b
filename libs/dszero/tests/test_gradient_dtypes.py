"""data_types.grad_accum_dtype and communication_data_type at every stage: gradients go over the wire in the
communication dtype and accumulate over micro-steps in the accumulation dtype, never the reverse."""

import torch

import dscomm
import dszero
from dscomm.testing import run_ranks
from dsconfig import ZeroConfig

# bf16 holds 8 significant bits: 1 + 2**-9 rounds back to 1, while 2**-9 alone is exact. One micro-step
# of gradient 1 and 16 of gradient 2**-9 sum to 1.03125 in fp32 and stay 1.0 in bf16.
MICRO_GRADS = [1.0] + [2.0**-9] * 16
FP32_SUM, BF16_SUM = 1.0 + 16 * 2.0**-9, 1.0


class Scaled(torch.nn.Module):
    """loss = sum(w * c): the gradient of every weight is c, exactly, in the model's dtype."""

    def __init__(self, dtype):
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(8, dtype=dtype))

    def forward(self, c):
        return (self.w * c).sum()


def accumulated_gradient(rank, world, stage, model_dtype, grad_accum_dtype=None, communication_dtype=None):
    """The gradient step() would apply after the micro-steps, and the bytes per element that went over the wire."""
    dscomm.configure(enabled=True, prof_all=True)
    dscomm.reset_comms_log()
    model = Scaled(model_dtype)
    precision = {torch.float32: "fp32", torch.bfloat16: "bf16"}[model_dtype]
    zero = dszero.ZeroOptimizer(model, torch.optim.SGD(model.parameters(), lr=1.0),
                                ZeroConfig(stage=stage, stage3_param_persistence_threshold=0),
                                precision=precision, grad_accum_dtype=grad_accum_dtype,
                                communication_dtype=communication_dtype)
    for c in MICRO_GRADS:
        zero.backward(model(torch.tensor(c, dtype=model_dtype)))
    grad = dszero.safe_get_full_grad(model.w)
    zero.step()  # stages 0 and 1 reduce here
    wire = {name: sorted(sizes) for name, sizes in dscomm.get_comms_log().items()}
    return grad.tolist(), wire


def test_communication_dtype_is_the_wire_and_accumulation_keeps_its_own_dtype():
    """fp32 model, communication_data_type bf16: each micro-step's gradient travels as bf16 (2 bytes an
    element) and the shard accumulates in fp32 (stages 2 and 3 reduce during backward)."""
    def both(rank, world):
        return {stage: accumulated_gradient(rank, world, stage, torch.float32, communication_dtype=torch.bfloat16)
                for stage in (2, 3)}

    for by_stage in run_ranks(both, 2, timeout=90):
        for stage, (grad, wire) in by_stage.items():
            assert grad == [FP32_SUM] * 8, stage  # accumulated in fp32 (bf16 accumulation gives 1.0)
            name = "zero_reduce_bucket" if stage == 2 else "zero3_reduce_scatter"
            # 8 weights in two 4-element shards: each rank's piece (as logged) is 4 elements of 2 bytes.
            assert wire[name] == [2 * 4], (stage, wire)


def test_grad_accum_dtype_fp32_accumulates_a_bf16_model_in_fp32_at_every_stage():
    def all_stages(rank, world):
        honoured = {stage: accumulated_gradient(rank, world, stage, torch.bfloat16, grad_accum_dtype=torch.float32)
                    for stage in (0, 1, 2, 3)}
        plain = accumulated_gradient(rank, world, 1, torch.bfloat16)
        return honoured, plain

    for honoured, plain in run_ranks(all_stages, 2, timeout=120):
        assert plain[0] == [BF16_SUM] * 8  # without the key a bf16 model accumulates in bf16
        for stage, (grad, wire) in honoured.items():
            assert grad == [FP32_SUM] * 8, stage
            if stage in (0, 1):  # reduced once at the step, from the fp32 buffer: 4 bytes an element
                name = "zero_allreduce_grads" if stage == 0 else "zero_reduce_scatter_grads"
                assert wire[name] == [4 * (8 if stage == 0 else 4)], wire


def test_stages_0_and_1_reduce_the_fp32_accumulation_in_the_communication_dtype():
    def run(rank, world):
        return accumulated_gradient(rank, world, 1, torch.bfloat16, grad_accum_dtype=torch.float32,
                                    communication_dtype=torch.bfloat16)

    grad, wire = run_ranks(run, 2)[0]
    assert wire["zero_reduce_scatter_grads"] == [2 * 4]
    # The fp32 sum 1.03125 is rounded once, for the wire (to bf16's nearest, 1.03125 = 1 + 2**-5: exact).
    assert grad == [FP32_SUM] * 8
