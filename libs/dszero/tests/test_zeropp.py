"""ZeRO++ on 4 gloo ranks simulated as 2 nodes of 2: its collectives against the plain ones, training the
test GPT in fp16 for 50 steps against plain ZeRO-3, the bytes the comms logger counts, and checkpoints."""

import os

import pytest
import torch
import torch.distributed as dist
from models import TinyGPT, batches, loss_of

import dscomm
import dszero
from dscomm.testing import run_ranks
from dsconfig import ZeroConfig
from dszero.quantize import QuantSpec, dequantize, error_bound, quantize
from dszero.wire import reduce_scatter
from dszero.zeropp import logged_bytes
from dszero.zeropp.nodes import node_groups, nodes_of, ranks_per_node
from dszero.zeropp.qgz import Residuals, quantized_reduce_scatter
from dszero.zeropp.qwz import quantized_gather

WORLD, STEPS = 4, 50
QWZ = {"zero_quantized_weights": True}
QGZ = {"zero_quantized_gradients": True}
HPZ = {"zero_hpz_partition_size": 2}
FEATURES = {"plain": {}, "qwZ": QWZ, "qgZ": QGZ, "hpZ": HPZ, "qwZ+hpZ": {**QWZ, **HPZ}, "all": {**QWZ, **QGZ, **HPZ}}
# Loss tolerance against plain ZeRO-3 (fp16, 50 steps, losses near 4.1): any step, and the last 10 steps' mean.
STEP_TOLERANCE, MEAN_TOLERANCE = 0.08, 0.02


# ---------------------------------------------------------------------------------------------- nodes
def test_nodes_from_local_world_size_are_equal_consecutive_runs_of_data_ranks():
    assert nodes_of([0, 1, 2, 3], 2) == 2
    assert nodes_of([0, 2, 4, 6], 4) == 2  # tensor parallel 2: two data ranks per node of 4
    assert nodes_of([0, 1, 2, 3], 4) == 4
    assert nodes_of([0, 1, 2, 3], 3) is None  # 3 + 1
    assert nodes_of([0, 4, 1, 5], 4) is None  # a node's ranks are not consecutive in the group


# ---------------------------------------------------------------------------------------------- collectives
def grid_gradient(rank, numel):
    """Values qgZ's int8 blocks of 8 carry exactly: even integers, and 127 at every block start."""
    values = 2.0 * torch.randint(-31, 32, (numel,), generator=torch.Generator().manual_seed(rank))
    values[::8] = 127.0
    return values


def collectives(rank, world):
    out = {}
    group = dist.group.WORLD
    shard = 40
    grids = torch.stack([grid_gradient(r, shard * world) for r in range(world)])
    exact = grids.sum(0)[rank * shard:(rank + 1) * shard] / world
    out["plain equals exact"] = torch.equal(reduce_scatter(torch.empty(shard), grids[rank].clone(), group,
                                                           average=True), exact)
    for per_node in (1, 2, 4):
        nodes = node_groups(group, per_node)
        got = quantized_reduce_scatter(torch.empty(shard), grids[rank].clone(), nodes, QuantSpec(8, 8),
                                       average=True)
        out[f"qgZ exact at nodes of {per_node}"] = torch.equal(got, exact)
    nodes = node_groups(group, 2)
    gen = torch.Generator().manual_seed(11)
    randoms = torch.randn(world, 4 * 1000, generator=gen, dtype=torch.float32).to(torch.float16)
    truth = randoms.float().sum(0)[rank * 1000:(rank + 1) * 1000] / world
    got = quantized_reduce_scatter(torch.empty(1000, dtype=torch.float16), randoms[rank].clone(), nodes,
                                   QuantSpec(4, 128), average=True)
    out["qgZ int4 relative error"] = ((got.float() - truth).norm() / truth.norm()).item()
    # Error feedback: the same gradient 16 times; the sum of the results drifts by one step's error, not 16.
    drift = {}
    for feedback in (False, True):
        residuals = Residuals() if feedback else None
        total = torch.zeros(1000)
        for _ in range(16):
            total += quantized_reduce_scatter(torch.empty(1000), randoms[rank].float(), nodes, QuantSpec(4, 128),
                                              average=True, residuals=residuals)
        drift[feedback] = (total - 16 * truth).abs().max().item()
    out["drift"] = drift
    # qwZ's gather: every rank's quantized shard, dequantized alike on every rank.
    shards = torch.stack([torch.randn(500, generator=torch.Generator().manual_seed(r)) * (r + 1)
                          for r in range(world)]).to(torch.float16)
    expected = dequantize(quantize(shards, QuantSpec(8, 256)), 500, QuantSpec(8, 256), dtype=torch.float16).view(-1)
    for async_op in (False, True):
        full = torch.empty(500 * world, dtype=torch.float16)
        pending = quantized_gather(full, shards[rank].clone(), group, QuantSpec(8, 256), async_op=async_op,
                                   log_name="test")
        if pending is not None:
            pending.wait()
        out[f"qwZ gather async={async_op}"] = torch.equal(full, expected)
    out["qwZ within bound"] = bool(((expected.float() - shards.view(-1).float()).abs()
                                    <= error_bound(shards, QuantSpec(8, 256), torch.float16).view(-1)).all())
    # Which ranks share a node.
    out["from LOCAL_WORLD_SIZE"] = ranks_per_node(group, 1, {"LOCAL_WORLD_SIZE": "2"})
    out["one node without it"] = ranks_per_node(group, 1, {})
    errors = []
    for hpz, environ in ((3, {}), (1, {"LOCAL_WORLD_SIZE": "3"}), (1, {"LOCAL_WORLD_SIZE": "two"})):
        try:
            ranks_per_node(group, hpz, environ)
        except dszero.ZeroConfigError as exc:
            errors.append(str(exc))
    out["errors"] = errors
    return out


def test_zeropp_collectives_against_the_plain_ones():
    results = run_ranks(collectives, WORLD, timeout=120)
    for rank, out in enumerate(results):
        assert out["plain equals exact"]
        for per_node in (1, 2, 4):  # routing and averaging exact where int8 carries the values exactly
            assert out[f"qgZ exact at nodes of {per_node}"], (rank, per_node)
        assert out["qgZ int4 relative error"] < 0.3, out["qgZ int4 relative error"]
        assert out["drift"][True] * 4 < out["drift"][False], out["drift"]
        assert out["qwZ gather async=False"] and out["qwZ gather async=True"] and out["qwZ within bound"]
        assert out["from LOCAL_WORLD_SIZE"] == 2 and out["one node without it"] == 4
        hpz, uneven, garbage = out["errors"]
        assert "zero_hpz_partition_size = 3 must divide the data-parallel size 4; valid: [1, 2, 4]" in hpz
        assert "LOCAL_WORLD_SIZE=3" in uneven and "LOCAL_WORLD_SIZE='two'" in garbage


# ---------------------------------------------------------------------------------------------- training
def make(rank, keys, local_world=None, **zero_kwargs):
    if local_world is not None:
        os.environ["LOCAL_WORLD_SIZE"] = str(local_world)  # as torchrun sets it on each of 2 nodes of 2
    else:
        os.environ.pop("LOCAL_WORLD_SIZE", None)
    torch.manual_seed(0)
    model = TinyGPT().half()
    # Reuse off: every unit is gathered in forward and again in backward, the traffic ZeRO++ cuts.
    cfg = ZeroConfig(stage=3, stage3_param_persistence_threshold=0, stage3_max_reuse_distance=0, **keys)
    zero = dszero.ZeroOptimizer(model, torch.optim.AdamW(model.parameters(), lr=1e-2), cfg, precision="fp16",
                                **zero_kwargs)
    return model, zero


def train(rank, world, keys, steps, local_world=None):
    model, zero = make(rank, keys, local_world)
    dscomm.configure(enabled=True, prof_all=True)
    losses = []
    for step, (tokens,) in enumerate(batches(steps, 1, world, rank)):
        if step == steps - 1:
            dscomm.reset_comms_log()  # the last step's traffic
        loss = loss_of(model, tokens)
        zero.backward(loss)
        zero.step()
        zero.zero_grad()
        losses.append(loss.item())
    log = dscomm.get_comms_log()
    dscomm.configure(enabled=False)
    dscomm.reset_comms_log()
    counts = {name: sum(e["count"] for e in sizes.values()) for name, sizes in log.items()}
    group_sizes = {name: {e["group_size"] for e in sizes.values()} for name, sizes in log.items()}
    secondary = sum(u.layout.padded_numel // 2 * u.model_flat.element_size() for u in zero.groups)
    return {"losses": losses, "bytes": logged_bytes(log), "counts": counts, "group_sizes": group_sizes,
            "comm_buffers": zero.memory_report()["communication_buffers"], "secondary_bytes": secondary}


def training(rank, world):
    runs = {}
    for name, keys in FEATURES.items():
        # qgZ alone learns its nodes from LOCAL_WORLD_SIZE; with hpZ they are zero_hpz_partition_size's.
        runs[name] = train(rank, world, keys, 10 if name == "qwZ+hpZ" else STEPS, 2 if name == "qgZ" else None)
    return runs


@pytest.fixture(scope="module")
def runs():
    return run_ranks(training, WORLD, timeout=420)


def test_hpz_trains_exactly_as_without_it(runs):
    for out in runs:
        assert out["hpZ"]["losses"] == out["plain"]["losses"]  # the secondary copy repeats forward's weights
        assert out["qwZ+hpZ"]["losses"] == out["qwZ"]["losses"][:10]


@pytest.mark.parametrize("feature", ["qwZ", "qgZ", "all"])
def test_quantized_features_train_within_tolerance_of_plain_zero3(runs, feature):
    for out in runs:
        plain, got = torch.tensor(out["plain"]["losses"]), torch.tensor(out[feature]["losses"])
        assert (got - plain).abs().max() <= STEP_TOLERANCE, (got - plain).abs().max()
        assert abs(got[-10:].mean() - plain[-10:].mean()) <= MEAN_TOLERANCE
        assert got[-10:].mean() < got[:5].mean() - 0.1  # and it learns
    print(f"{feature}: max |loss - plain| {(got - plain).abs().max():.4f}, last-10 mean difference "
          f"{abs(got[-10:].mean() - plain[-10:].mean()):.4f}")


def test_qwz_halves_the_weight_bytes_from_fp16(runs):
    for out in runs:
        plain, qwz = out["plain"], out["qwZ"]
        assert plain["counts"]["zero3_gather"] == qwz["counts"]["zeropp_qwz_gather"]
        ratio = plain["bytes"]["zero3_gather"] / qwz["bytes"]["zeropp_qwz_gather"]
        assert 1.9 < ratio < 2.0, ratio
        assert qwz["bytes"]["zero3_reduce_scatter"] == plain["bytes"]["zero3_reduce_scatter"]


def test_qgz_cuts_gradient_bytes_fourfold_per_step_and_more_across_nodes(runs):
    for out in runs:
        plain = out["plain"]["bytes"]["zero3_reduce_scatter"]
        qgz = out["qgZ"]["bytes"]
        within, across = qgz["zeropp_qgz_within_node"], qgz["zeropp_qgz_across_nodes"]
        assert out["qgZ"]["group_sizes"]["zeropp_qgz_within_node"] == {2}  # nodes of 2, from LOCAL_WORLD_SIZE
        assert "zero3_reduce_scatter" not in qgz
        assert 3.4 < plain / within < 4.0, plain / within  # int4 against fp16, in the step within the node
        assert plain / (within + across) > 2.3  # both steps: the node's partial sums (1/2) go out again
        # Leaving the node: half the plain reduce-scatter's pieces (owners on the other node) against half of
        # the across-node step's.
        assert plain * 0.5 / (across * 0.5) > 7.0
        assert out["all"]["bytes"]["zeropp_qgz_across_nodes"] == across


def test_hpz_moves_the_backward_gather_inside_the_node(runs):
    for out in runs:
        plain, hpz = out["plain"], out["hpZ"]
        # On gloo a gather is one broadcast (one logged message) per rank of its group.
        gathers = plain["counts"]["zero3_gather"] // 4  # each unit in forward and in backward
        assert hpz["group_sizes"]["zeropp_hpz_gather"] == {2} and hpz["group_sizes"]["zero3_gather"] == {4}
        assert hpz["counts"]["zero3_gather"] // 4 == gathers // 2  # forward: the primary partition, 4 ranks
        assert hpz["counts"]["zeropp_hpz_gather"] // 2 == gathers // 2  # backward: the secondary, in the node
        assert hpz["bytes"]["zero3_gather"] == plain["bytes"]["zero3_gather"] // 2
        assert hpz["bytes"]["zeropp_hpz_gather"] == plain["bytes"]["zero3_gather"] // 2
        # The secondary copies (1/2 of every unit, fp16) are what hpZ holds between forward and backward.
        assert hpz["comm_buffers"] == hpz["secondary_bytes"] and plain["comm_buffers"] == 0
        everything = out["all"]
        assert everything["counts"]["zeropp_qwz_gather"] // 4 == everything["counts"]["zeropp_hpz_gather"] // 2


# ---------------------------------------------------------------------------------------------- checkpoints
def resume(rank, world, root):
    keys = {**QWZ, **QGZ, **HPZ}
    data = list(batches(4, 1, world, rank))
    model, zero = make(rank, keys)
    seen = {}
    model.head.register_forward_pre_hook(lambda m, i: seen.update(head=m.weight.detach().float().clone()))
    losses = []
    for step, (tokens,) in enumerate(data):
        if step == 2:
            zero.save(f"{root}/ckpt")
            masters = {name: dszero.safe_get_full_fp32_param(p) for name, p in model.named_parameters()}
        loss = loss_of(model, tokens)
        zero.backward(loss)
        zero.step()
        zero.zero_grad()
        losses.append(loss.item())
        if step == 2:
            forward_head = seen["head"]
    model, zero = make(rank, keys)
    zero.load(f"{root}/ckpt")
    resumed = []
    for tokens, in data[2:]:
        loss = loss_of(model, tokens)
        zero.backward(loss)
        zero.step()
        zero.zero_grad()
        resumed.append(loss.item())
    # A ZeRO++ checkpoint is a plain one: it loads without ZeRO++ too.
    plain_model, plain_zero = make(rank, {})
    plain_zero.load(f"{root}/ckpt")
    with dszero.GatheredParameters(list(plain_model.parameters())):
        loaded_head = plain_model.head.weight.float().clone()
    saved = dszero.get_fp32_state_dict_from_zero_checkpoint(f"{root}/ckpt") if rank == 0 else None
    return losses, resumed, masters, forward_head, saved, loaded_head


def test_checkpoints_hold_full_precision_state_and_resume_exactly(tmp_path):
    results = run_ranks(resume, WORLD, str(tmp_path), timeout=180)
    for losses, resumed, _, _, _, _ in results:
        assert resumed == losses[2:]
    _, _, masters, forward_head, saved, loaded_head = results[0]
    assert set(saved) == set(masters)
    for name, value in saved.items():
        assert torch.equal(value, masters[name]), name  # the fp32 masters, not what the wire carried
    # Forward computed with int8-quantized weights; the checkpoint keeps the full-precision ones.
    master_head = masters["head.weight"]
    difference = (forward_head - master_head).abs()
    assert (difference > master_head.abs() * 2.0 ** -11 + 2.0 ** -25).any()  # more than fp16's rounding
    largest = max(master_head.abs().max(), masters["head.bias"].abs().max())  # of any block of the unit
    assert difference.max() <= largest * (1 / 254 + 2.0 ** -10)  # int8's half step, fp16's rounding twice
    assert torch.equal(loaded_head, master_head.half().float())


# ---------------------------------------------------------------------------------------------- refusals
def refusals(rank, world):
    found = []
    model = TinyGPT()
    for cfg, kwargs in ((ZeroConfig(stage=2, zero_quantized_weights=True), {}),
                        (ZeroConfig(stage=3, zero_quantized_gradients=True), {"communication_dtype": torch.float16})):
        try:
            dszero.ZeroOptimizer(model, torch.optim.AdamW(model.parameters()), cfg, **kwargs)
        except dszero.ZeroConfigError as exc:
            found.append(str(exc))
    return found


def test_what_zeropp_cannot_do_is_refused_by_key():
    stage, dtype = run_ranks(refusals, 2, timeout=60)[0]
    assert "zero_quantized_weights" in stage and "needs stage 3 (stage is 2)" in stage
    assert "zero_quantized_gradients" in dtype and "communication_data_type" in dtype
