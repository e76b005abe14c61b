"""Stage 3 specifics: parameters are released between uses, and GatheredParameters reads and writes them."""

import torch
from models import batches, loss_of, make_model

import dszero
from dscomm.testing import run_ranks
from dsconfig import ZeroConfig


def make(rank, world, threshold=0):
    model = make_model()
    zero = dszero.ZeroOptimizer(model, torch.optim.SGD(model.parameters(), lr=0.1),
                                ZeroConfig(stage=3, stage3_param_persistence_threshold=threshold))
    return model, zero


def released_between_uses(rank, world):
    full = sum(p.numel() for p in make_model().parameters())
    model, zero = make(rank, world)
    held = sum(p.numel() for p in model.parameters())  # released: every parameter is an empty tensor
    tokens = next(batches(1, 1, world, rank))[0]
    zero.backward(loss_of(model, tokens))
    zero.step()
    after = sum(p.numel() for p in model.parameters())
    shards = sum(u.shard_numel for u in zero.groups)
    return full, held, after, shards


def test_parameters_are_released_and_partitioned():
    for full, held, after, shards in run_ranks(released_between_uses, 2, timeout=60):
        assert held == 0 and after == 0
        assert shards < 0.6 * full  # about half of the model per rank (padding aside)


def gathered_read_and_write(rank, world):
    model, _zero = make(rank, world)
    with dszero.GatheredParameters(model.parameters()):
        before = model.head.weight.detach().clone()
    with dszero.GatheredParameters(model.head.weight, modifier_rank=1):
        if rank == 1:
            with torch.no_grad():
                model.head.weight.fill_(0.5)
    with dszero.GatheredParameters([model.head.weight]):
        after = model.head.weight.detach().clone()
    released = model.head.weight.numel()
    return before, after, released


def test_gathered_parameters_reads_and_writes_across_ranks():
    results = run_ranks(gathered_read_and_write, 2, timeout=60)
    (before0, after0, released0), (before1, after1, _) = results
    assert torch.equal(before0, before1) and before0.shape == (64, 32)
    assert torch.all(after0 == 0.5) and torch.all(after1 == 0.5)  # rank 1's write reached rank 0
    assert released0 == 0


def kept_after_gathering(rank, world):
    model, zero = make(rank, world)
    kept = {}
    for name, param in model.named_parameters():  # DeepSpeed-Chat's save_zero_three_model, on the CPU
        with dszero.GatheredParameters([param]):
            kept[name] = param.data.cpu()  # no copy on a CPU: the gathered tensor itself
    with dszero.GatheredParameters(list(model.parameters())):
        whole = {name: param.detach().clone() for name, param in model.named_parameters()}
    tokens = next(batches(1, 1, world, rank))[0]
    zero.backward(loss_of(model, tokens))  # the hooks gather and release as before
    zero.step()
    with dszero.GatheredParameters(list(model.parameters())):
        stepped = {name: param.detach().clone() for name, param in model.named_parameters()}
    return ({name: torch.equal(kept[name], whole[name]) for name in whole},
            any(not torch.equal(stepped[name], whole[name]) for name in whole))


def test_tensors_taken_inside_gathered_parameters_keep_the_weights_after_it():
    for same, trained in run_ranks(kept_after_gathering, 2, timeout=60):
        assert all(same.values()), [name for name, ok in same.items() if not ok]
        assert trained  # the units still gather, step and release after their buffers went to readers


def persistent_small_units(rank, world):
    _model, zero = make(rank, world, threshold=10_000)
    return sorted((unit.persistent, unit.names[0]) for unit in zero.groups)


def test_small_units_stay_gathered_under_the_persistence_threshold():
    units = run_ranks(persistent_small_units, 1, timeout=60)[0]
    persistent = [name for keep, name in units if keep]
    assert "blocks.0.norm1.weight" in persistent and "head.weight" in persistent  # 2*32 and 64*32+64 elements
    assert all(keep for keep, _ in units)


def gathered_after_evaluation(rank, world):
    model = make_model()
    zero = dszero.ZeroOptimizer(model, torch.optim.SGD(model.parameters(), lr=0.1),
                                ZeroConfig(stage=3, stage3_param_persistence_threshold=0,
                                           stage3_max_reuse_distance=10**9, stage3_prefetch_bucket_size=10**9))
    tokens = next(batches(1, 1, world, rank))[0]
    zero.backward(loss_of(model, tokens))
    zero.step()
    with torch.no_grad():  # an evaluation after a traced step leaves the reused and prefetched units gathered
        loss_of(model, tokens)
    before = sum(unit.gathered for unit in zero.groups)
    zero.empty_partition_cache()
    return before, sum(unit.gathered for unit in zero.groups), sum(p.numel() for p in model.parameters())


def test_empty_partition_cache_releases_what_evaluation_left_gathered():
    before, after, held = run_ranks(gathered_after_evaluation, 1, timeout=60)[0]
    assert before > 0 and after == 0 and held == 0


def reductions_in_flight_during_backward(rank, world):
    model, zero = make(rank, world)
    seen = []
    for module in model.modules():  # before each module's backward: how many unit reductions are running
        module.register_full_backward_pre_hook(lambda m, g: seen.append(len(zero.reducer.reducing)))
    tokens = next(batches(1, 1, world, rank))[0]
    zero.backward(loss_of(model, tokens))
    after = len(zero.reducer.reducing)
    zero.step()
    return max(seen), after


def test_unit_reduce_scatters_run_beside_the_rest_of_backward():
    for running, after in run_ranks(reductions_in_flight_during_backward, 2, timeout=60):
        # Later units' reductions are still in flight when earlier modules' backward starts (at most two),
        # and none is left once backward has ended.
        assert 1 <= running <= 2 and after == 0


def gathered_during_backward_with_two_groups(rank, world):
    # Two optimizer groups (a weight-decay split: matrices, then biases and norms), so the optimizer's unit order
    # is every matrix unit, then every bias unit; nothing kept for reuse or prefetched.
    model = make_model(layers=3)
    matrices = [p for p in model.parameters() if p.dim() >= 2]
    vectors = [p for p in model.parameters() if p.dim() < 2]
    largest_block = max(sum(p.numel() for p in block.parameters()) for block in model.blocks) * 4  # bytes, float32
    optimizer = torch.optim.SGD([{"params": matrices}, {"params": vectors, "weight_decay": 0.0}], lr=0.1)
    zero = dszero.ZeroOptimizer(model, optimizer, ZeroConfig(stage=3, stage3_param_persistence_threshold=0,
                                                             stage3_max_reuse_distance=0,
                                                             stage3_prefetch_bucket_size=0))
    last = {id(p) for p in model.blocks[-1].parameters()}
    seen = []  # at the first block's backward: the last block's gathered bytes, and everything gathered
    model.blocks[0].register_full_backward_pre_hook(lambda m, g: seen.append(
        (sum(u.gathered_bytes() for u in zero.groups if id(u.params[0]) in last),
         sum(u.gathered_bytes() for u in zero.groups))))
    for tokens, in batches(2, 1, world, rank):
        zero.backward(loss_of(model, tokens))
        zero.step()
    return seen, largest_block


def test_units_of_later_layers_are_released_in_backward_with_several_optimizer_groups():
    # Reduced in reverse module order, not reverse optimizer order: the last block's units are reduced and
    # released before the first block's backward, though the first block's biases come last in the optimizer.
    for seen, largest_block in run_ranks(gathered_during_backward_with_two_groups, 2, timeout=60):
        assert len(seen) == 2
        for last_block, everything in seen:
            assert last_block == 0
            assert everything <= 2 * largest_block


def alternating_units(rank, world):
    # Linear layers with a bias (two-parameter units: their gradients are copied into a flat buffer) between
    # bias-free ones (a lone gradient is reduced as it is); every unit is larger than the prefetch bucket.
    d = 16
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(d, d, bias=index % 2 == 0) for index in range(8)])
    reference = torch.nn.Sequential(*[torch.nn.Linear(d, d, bias=index % 2 == 0) for index in range(8)])
    reference.load_state_dict(model.state_dict())
    zero = dszero.ZeroOptimizer(model, torch.optim.SGD(model.parameters(), lr=0.1),
                                ZeroConfig(stage=3, stage3_param_persistence_threshold=0,
                                           stage3_prefetch_bucket_size=10, stage3_max_reuse_distance=0))
    plain = torch.optim.SGD(reference.parameters(), lr=0.1)
    allocations, prefetched = [], []
    for step in range(3):
        batch = torch.randn(4 * world, d, generator=torch.Generator().manual_seed(step))
        zero.backward(model(batch.chunk(world)[rank]).square().mean())
        zero.step()
        zero.zero_grad()
        reference(batch).square().mean().backward()
        plain.step()
        plain.zero_grad()
        allocations.append(zero.reducer.flat_allocations)
        prefetched.append(sum(u.prefetch_count for u in zero.groups))
    with dszero.GatheredParameters(list(model.parameters())):
        gap = max((a - b).abs().max().item() for a, b in zip(model.parameters(), reference.parameters()))
    return allocations, prefetched, gap


def test_flat_gradient_buffers_are_reused_and_units_larger_than_the_bucket_are_prefetched():
    for allocations, prefetched, gap in run_ranks(alternating_units, 2, timeout=60):
        # Four two-parameter units of one size per backward, two reductions in flight: the third and fourth reuse
        # the first two's buffers (before: four new buffers per backward). None is kept between steps.
        assert [allocations[0], allocations[1] - allocations[0], allocations[2] - allocations[1]] == [2, 2, 2]
        # Each unit exceeds the 10-element bucket and is still gathered ahead from the second step on (as
        # DeepSpeed admits the parameter that crosses the bucket); before, never.
        assert prefetched[0] == 0 and prefetched[1] > 0 and prefetched[2] > prefetched[1]
        assert gap < 1e-6  # trains as one process on the whole batch
