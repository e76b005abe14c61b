"""Activation checkpointing gives bitwise the gradients of running the function plainly."""

import pytest
import torch

import dsconfig
from dscomm import ParallelDims, checkpointing


@pytest.fixture(autouse=True)
def _fresh_settings():
    checkpointing.configure()
    checkpointing.reset()
    yield
    checkpointing.configure()
    checkpointing.get_cuda_rng_tracker().reset()


class Block(torch.nn.Module):
    """Dropout on the plain generator and, inside the tracker's fork, on the model-parallel stream."""

    def __init__(self, width=8, mp_dropout=True):
        super().__init__()
        self.mp_dropout = mp_dropout
        self.fc1 = torch.nn.Linear(width, 2 * width)
        self.fc2 = torch.nn.Linear(2 * width, width)

    def forward(self, x):
        h = torch.nn.functional.dropout(torch.nn.functional.gelu(self.fc1(x)), p=0.3, training=True)
        if self.mp_dropout:
            with checkpointing.get_cuda_rng_tracker().fork():
                h = torch.nn.functional.dropout(h, p=0.2, training=True)
        return self.fc2(h) + x


def _grads(model, x, use_checkpoint, seed=0, autocast=False):
    checkpointing.model_parallel_cuda_manual_seed(seed)
    torch.manual_seed(seed)
    model.zero_grad(set_to_none=True)
    x = x.detach().clone().requires_grad_(x.requires_grad)
    h = x
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):  # forward only, as in training
        for block in model:
            h = checkpointing.checkpoint(block, h) if use_checkpoint else block(h)
    h.float().pow(2).sum().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    return grads + ([x.grad.clone()] if x.requires_grad else []), h.detach()


def _assert_bitwise(a, b):
    assert len(a) == len(b)
    for left, right in zip(a, b):
        assert torch.equal(left, right)


@pytest.mark.parametrize("input_requires_grad", [True, False])
@pytest.mark.parametrize("cpu_checkpointing", [False, True])
def test_gradients_equal_no_checkpointing(input_requires_grad, cpu_checkpointing):
    checkpointing.configure(checkpoint_in_cpu=cpu_checkpointing, synchronize=True)
    torch.manual_seed(1)
    model = torch.nn.Sequential(Block(), Block(), Block())
    x = torch.randn(4, 8, requires_grad=input_requires_grad)
    plain_grads, plain_out = _grads(model, x, use_checkpoint=False)
    ckpt_grads, ckpt_out = _grads(model, x, use_checkpoint=True)
    assert torch.equal(plain_out, ckpt_out)
    _assert_bitwise(plain_grads, ckpt_grads)
    # the recompute consumed no random numbers of its own: the next draw is the same either way
    checkpointing.model_parallel_cuda_manual_seed(0)
    torch.manual_seed(0)
    block = Block()
    checkpointing.checkpoint(block, torch.randn(2, 8, requires_grad=True)).sum().backward()
    after_ckpt = torch.rand(3)
    checkpointing.model_parallel_cuda_manual_seed(0)
    torch.manual_seed(0)
    block = Block()
    block(torch.randn(2, 8, requires_grad=True)).sum().backward()
    assert torch.equal(after_ckpt, torch.rand(3))


def test_configure_from_config_section_and_arguments():
    cfg = dsconfig.load({"activation_checkpointing": {"cpu_checkpointing": True, "profile": True,
                                                      "synchronize_checkpoint_boundary": True}})
    assert not checkpointing._settings.cpu_checkpointing
    checkpointing.configure(None, deepspeed_config=cfg, profile=False)
    assert checkpointing.is_configured()
    settings = checkpointing._settings
    assert settings.cpu_checkpointing and settings.synchronize and not settings.profile
    checkpointing.configure(deepspeed_config={"activation_checkpointing": {"partition_activations": True}})
    assert checkpointing._settings.partition_activations and not checkpointing._settings.cpu_checkpointing
    with pytest.raises(dsconfig.ConfigError, match="partition_activations"):
        checkpointing.configure(contiguous_checkpointing=True)
    with pytest.raises(dsconfig.ConfigError, match="number_checkpoints"):
        checkpointing.configure(partition_activations=True, contiguous_checkpointing=True)
    checkpointing.configure(partition_activations=True, contiguous_checkpointing=True, num_checkpoints=2)


def test_profile_times_forward_and_recompute():
    checkpointing.configure(profile=True)
    checkpointing.model_parallel_cuda_manual_seed(0)
    block = Block()
    out = checkpointing.checkpoint(block, torch.randn(2, 8, requires_grad=True))
    assert checkpointing.profile_timings()["forward"]["count"] == 1
    assert "recompute" not in checkpointing.profile_timings()
    out.sum().backward()
    timings = checkpointing.profile_timings()
    assert timings["recompute"]["count"] == 1 and timings["recompute"]["total_ms"] > 0
    checkpointing.reset()
    assert checkpointing.profile_timings() == {}


def test_rng_tracker_add_and_fork():
    tracker = checkpointing.get_cuda_rng_tracker()
    tracker.reset()
    tracker.add("stream", 123)
    with pytest.raises(ValueError, match="already tracked"):
        tracker.add("other", 123)
    before = torch.get_rng_state()
    with tracker.fork("stream"):
        first = torch.rand(2)
    assert torch.equal(torch.get_rng_state(), before)  # the outside generator is untouched
    torch.manual_seed(123)
    assert torch.equal(first, torch.rand(2))
    with pytest.raises(KeyError, match="not tracked"), tracker.fork("missing"):
        pass


class _Mpu:
    def __init__(self, rank, world):
        self.rank, self.world = rank, world

    def get_model_parallel_rank(self):
        return self.rank

    def get_model_parallel_world_size(self):
        return self.world

    def get_model_parallel_group(self):
        return None  # the default group: both ranks are one model-parallel group


def _partitioned_rank(rank, world_size, use_parallel_groups):
    # Megatron's mpu, or the ParallelGroups of a layout with tensor 2 (the same two ranks)
    mpu = ParallelDims(world_size, tensor=2).build() if use_parallel_groups else _Mpu(rank, world_size)
    results = {}
    for cpu in (False, True):
        checkpointing.configure(mpu, partition_activations=True, checkpoint_in_cpu=cpu)
        probe = checkpointing.checkpoint(Block(7, mp_dropout=False), torch.randn(2, 7, requires_grad=True))
        partitioned = type(probe.grad_fn).__name__ == "_PartitionedCheckpointBackward"  # not the plain path
        torch.manual_seed(3)
        # Inputs must match across model-parallel ranks, so no per-rank stream here; 4 x 7 = 28 values
        # split in 2 x 14 and 3 x 7 = 21 in 2 x 11 (padded).
        model = torch.nn.Sequential(Block(7, mp_dropout=False), Block(7, mp_dropout=False))
        ok = True
        for rows, autocast in ((4, False), (3, True)):  # the recompute runs in forward's autocast mode
            x = torch.randn(rows, 7, requires_grad=True)
            plain, _ = _grads(model, x, use_checkpoint=False, seed=5, autocast=autocast)
            ckpt, _ = _grads(model, x, use_checkpoint=True, seed=5, autocast=autocast)
            ok = ok and len(plain) == len(ckpt) and all(torch.equal(a, b) for a, b in zip(plain, ckpt))
        results[cpu] = ok and partitioned
    return results


@pytest.mark.parametrize("use_parallel_groups", [False, True])
def test_partition_activations_over_two_model_parallel_ranks(use_parallel_groups):
    from dscomm.testing import run_ranks

    assert run_ranks(_partitioned_rank, 2, use_parallel_groups, timeout=60) == [{False: True, True: True}] * 2


def _contiguous_rank(rank, world_size):
    mpu = ParallelDims(world_size, tensor=2).build()
    checkpointing.configure(mpu, partition_activations=True, contiguous_checkpointing=True, num_checkpoints=2)
    torch.manual_seed(3)
    model = torch.nn.Sequential(Block(7, mp_dropout=False), Block(7, mp_dropout=False))
    x = torch.randn(4, 7, requires_grad=True)
    plain, _ = _grads(model, x, use_checkpoint=False, seed=5)
    seen = []
    for _ in range(2):  # the second step reuses the first step's buffer
        h = x
        for block in model:
            h = checkpointing.checkpoint(block, h)
        buffers = checkpointing._CONTIGUOUS.buffers
        seen.append([(tuple(b.shape), b.data_ptr()) for b in buffers.values()])
        free_in_forward = [len(rows) for rows in checkpointing._CONTIGUOUS.free.values()]
        h.pow(2).sum().backward()
        free_after = [len(rows) for rows in checkpointing._CONTIGUOUS.free.values()]
    ckpt, _ = _grads(model, x, use_checkpoint=True, seed=5)
    h = x
    try:
        for block in [*model, model[0]]:  # three checkpoints held at once, two rows
            h = checkpointing.checkpoint(block, h)
        too_many = ""
    except dsconfig.ConfigError as exc:
        too_many = str(exc)
    checkpointing.reset()
    return {"bitwise": all(torch.equal(a, b) for a, b in zip(plain, ckpt)), "seen": seen,
            "free_in_forward": free_in_forward, "free_after": free_after, "too_many": too_many,
            "after_reset": len(checkpointing._CONTIGUOUS.buffers)}


def test_contiguous_memory_optimization_keeps_partitions_in_number_checkpoints_rows():
    from dscomm.testing import run_ranks

    for result in run_ranks(_contiguous_rank, 2, timeout=60):
        assert result["bitwise"]
        # 4 x 7 = 28 values, 14 a rank: one buffer of number_checkpoints (2) rows, the same one every step
        assert result["seen"][0] == result["seen"][1] and [s for s, _ in result["seen"][0]] == [(2, 14)]
        assert result["free_in_forward"] == [0] and result["free_after"] == [2]  # taken in forward, back in backward
        assert "activation_checkpointing.number_checkpoints" in result["too_many"]
        assert result["after_reset"] == 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="cpu_checkpointing moves device inputs; needs CUDA")
def test_cpu_checkpointing_copies_device_inputs_to_pinned_memory_and_back():
    checkpointing.configure(checkpoint_in_cpu=True)
    torch.manual_seed(1)
    model = torch.nn.Sequential(*[Block(64, mp_dropout=False) for _ in range(3)]).cuda()
    x = torch.randn(256, 64, device="cuda", requires_grad=True)
    plain, _ = _grads(model, x, use_checkpoint=False)
    offloaded, _ = _grads(model, x, use_checkpoint=True)
    _assert_bitwise(plain, offloaded)
    copies = []
    original = checkpointing._HostCopy.__init__

    def spy(self, tensor):
        original(self, tensor)
        copies.append(self)

    checkpointing._HostCopy.__init__ = spy
    try:
        _grads(model, x, use_checkpoint=True)
    finally:
        checkpointing._HostCopy.__init__ = original
    assert len(copies) == 3 and all(c.host.is_pinned() and c.event is not None for c in copies)


def test_each_engine_applies_its_own_section_but_never_over_the_scripts_configure():
    checkpointing._settings = checkpointing._Settings()  # a fresh process: nothing configured yet
    first = dsconfig.load({"activation_checkpointing": {"cpu_checkpointing": True}})
    second = dsconfig.load({"activation_checkpointing": {"profile": True}})
    checkpointing.configure_from_engine(first)
    assert checkpointing._settings.cpu_checkpointing
    checkpointing.configure_from_engine(second)  # a second initialize() in the same process
    assert checkpointing._settings.profile and not checkpointing._settings.cpu_checkpointing
    checkpointing.configure(synchronize=True)  # the script's own settings stand
    checkpointing.configure_from_engine(first)
    assert checkpointing._settings.synchronize and not checkpointing._settings.cpu_checkpointing


def test_an_engine_takes_contiguous_checkpointing_without_number_checkpoints_which_the_script_gives():
    checkpointing._settings = checkpointing._Settings()
    section = {"activation_checkpointing": {"partition_activations": True, "contiguous_memory_optimization": True}}
    with pytest.raises(dsconfig.ConfigError, match=r"activation_checkpointing\.number_checkpoints"):
        checkpointing.configure(deepspeed_config=section)  # the script's own call must say it
    checkpointing._settings = checkpointing._Settings()
    checkpointing.configure_from_engine(dsconfig.load(section))  # Megatron passes num_checkpoints itself later
    assert checkpointing._settings.contiguous_memory_optimization and checkpointing._settings.number_checkpoints is None
