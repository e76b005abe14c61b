"""dstrain.OnDevice (DeepSpeed's `deepspeed.OnDevice`): a model built inside is on the device, in the dtype."""

import pytest
import torch

import dstrain
from dstrain.errors import DstrainError


@pytest.mark.parametrize("device, dtype", [("meta", torch.half), ("cpu", torch.bfloat16)])
def test_parameters_are_built_on_the_device_in_the_dtype(device, dtype):
    with dstrain.OnDevice(dtype=dtype, device=device):
        model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.LayerNorm(3))
        steps = torch.arange(3)  # an integer tensor keeps its dtype
    assert all(p.device == torch.device(device) and p.dtype == dtype for p in model.parameters())
    assert steps.dtype == torch.int64 and steps.device == torch.device(device)
    assert torch.get_default_dtype() == torch.float32 and torch.zeros(1).device == torch.device("cpu")


def test_restored_after_an_error_and_disabled_does_nothing():
    with pytest.raises(ValueError, match="inside"), dstrain.OnDevice(dtype=torch.half):
        raise ValueError("inside")
    assert torch.get_default_dtype() == torch.float32 and torch.zeros(1).device == torch.device("cpu")
    with dstrain.OnDevice(dtype=torch.half, enabled=False):
        assert torch.nn.Linear(2, 2).weight.dtype == torch.float32
    with pytest.raises(DstrainError, match="floating torch dtype"):
        dstrain.OnDevice(dtype=torch.int8)
