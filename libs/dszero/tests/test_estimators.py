"""Memory estimators: the ZeRO paper's arithmetic, checked on hand-counted cases."""

from torch import nn

import dszero
from dszero.estimators import model_sizes, zero2_estimates, zero3_estimates

B = 1_000_000_000


def test_model_sizes_count_own_parameters_per_module():
    model = nn.Sequential(nn.Linear(10, 20), nn.Sequential(nn.Linear(20, 30)))
    assert model_sizes(model) == (10 * 20 + 20 + 20 * 30 + 30, 20 * 30 + 30)


def test_zero2_matches_the_paper():
    # 7.5B parameters on 64 GPUs: the paper's ZeRO-2 example is 2 + 14 / 64 bytes per parameter.
    rows = {r.options: r for r in zero2_estimates(7_500_000_000, num_gpus_per_node=8, num_nodes=8)}
    assert rows["offload_optimizer=none"].per_device_bytes == 2 * 7_500_000_000 + 14 * 7_500_000_000 // 64
    assert rows["offload_optimizer=cpu"].per_device_bytes == 2 * 7_500_000_000 + 2 * 7_500_000_000 // 64


def test_zero3_orders_the_options_by_device_memory():
    rows = zero3_estimates(total=B, largest=10_000_000, num_gpus_per_node=4, num_nodes=1)
    device = {r.options: r.per_device_bytes for r in rows}
    all_off = device["offload_param=cpu, offload_optimizer=cpu, zero_init=1"]
    optim_off = device["offload_param=none, offload_optimizer=cpu, zero_init=1"]
    none_off = device["offload_param=none, offload_optimizer=none, zero_init=1"]
    assert all_off == 4 * 10_000_000 < optim_off == all_off + 4 * B // 4 < none_off == optim_off + 12 * B // 4
    host = {r.options: r.per_host_bytes for r in rows}
    assert host["offload_param=none, offload_optimizer=none, zero_init=0"] > \
        host["offload_param=none, offload_optimizer=none, zero_init=1"] == 0


def test_live_estimators_print_a_table(capsys):
    model = nn.Sequential(nn.Linear(1000, 1000), nn.Linear(1000, 1000))
    rows2 = dszero.estimate_zero2_model_states_mem_needs_all_live(model, num_gpus_per_node=2)
    rows3 = dszero.estimate_zero3_model_states_mem_needs_all_live(model, num_gpus_per_node=2)
    out = capsys.readouterr().out
    assert "ZeRO-2" in out and "ZeRO-3" in out and "offload_optimizer=cpu" in out and "per GPU" in out
    assert len(rows2) == 2 and len(rows3) == 6
