"""A world of one on BACKEND: dscomm's collectives given host (CPU) tensors, printed as JSON on the last line.

NCCL moves device memory only; dscomm stages host tensors through the current GPU and copies results back.
"""

import json
import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist

import dscomm

backend = sys.argv[1]
if backend == "nccl":
    torch.cuda.set_device(0)
with tempfile.TemporaryDirectory() as scratch:
    dist.init_process_group(backend, init_method=f"file://{Path(scratch) / 'rendezvous'}", rank=0, world_size=1)
    results = {}
    value = torch.tensor([3.0, 4.0])
    dscomm.all_reduce(value)
    results["all_reduce"] = value.tolist()
    flag = torch.tensor([7], dtype=torch.int64)
    dscomm.broadcast(flag, 0)
    results["broadcast"] = flag.tolist()
    gathered = [torch.zeros(2)]
    dscomm.all_gather(gathered, torch.tensor([1.0, 2.0]))
    results["all_gather"] = gathered[0].tolist()
    into = torch.zeros(2)
    dscomm.all_gather_into_tensor(into, torch.tensor([5.0, 6.0]))
    results["all_gather_into_tensor"] = into.tolist()
    out = torch.zeros(2)
    dscomm.reduce_scatter_tensor(out, torch.tensor([8.0, 9.0]))
    results["reduce_scatter_tensor"] = out.tolist()
    pending = torch.tensor([2.5])
    dscomm.all_reduce(pending, async_op=True).wait()
    results["async_all_reduce"] = pending.tolist()
    dscomm.configure(enabled=True)
    dscomm.all_reduce(torch.ones(4))
    summary = dscomm.log_summary(return_dict=True)["summary"]
    results["summary_ranks"] = summary["all_reduce"][16]["ranks"]
    results["devices"] = sorted({str(t.device) for t in (value, flag, gathered[0], into, out, pending)})
    dist.destroy_process_group()
print(json.dumps(results))
