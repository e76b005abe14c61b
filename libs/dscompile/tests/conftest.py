import os
import sys
from pathlib import Path

import pytest

# --import-mode=importlib keeps test folders off sys.path; the graph helpers live here.
sys.path.insert(0, str(Path(__file__).parent))
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")  # no compile workers forked inside test ranks



@pytest.fixture(scope="session")
def captured():
    """The MLP's forward and backward graphs (graphs.py), traced once for every pass test."""
    import torch
    from graphs import MLP, capture

    torch.manual_seed(0)
    return capture(MLP(), torch.randint(0, 16, (2, 5)))
