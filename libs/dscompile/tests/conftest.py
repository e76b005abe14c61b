import os
import sys
from pathlib import Path

import pytest

# --import-mode=importlib keeps test folders off sys.path; the graph helpers live here.
sys.path.insert(0, str(Path(__file__).parent))
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")  # no compile workers forked inside test ranks


@pytest.fixture(scope="session")
def warm_compiler():
    """torch.compile once in this process before it forks ranks: a rank's first compile otherwise spends
    most of its time loading and priming dynamo and AOT autograd (about 20 s of each multi-rank test on a
    loaded 2-core machine, 4 s with this). No process group and no compile worker exists here, so the
    forked ranks inherit nothing but warm caches."""
    import torch

    model = torch.nn.Sequential(torch.nn.Embedding(8, 4), torch.nn.LayerNorm(4), torch.nn.Linear(4, 4))
    torch.compile(model, backend="aot_eager")(torch.randint(0, 8, (2, 3))).sum().backward()
    torch._dynamo.reset()


@pytest.fixture(scope="session")
def captured():
    """The MLP's forward and backward graphs (graphs.py), traced once for every pass test."""
    import torch
    from graphs import MLP, capture

    torch.manual_seed(0)
    return capture(MLP(), torch.randint(0, 16, (2, 5)))
