"""Run by test_analyzer_runs as its own process: a 3-thread map (two forked children) slow enough to be
SIGKILLed half way. Prints each map process's pid once it has started computing.
Usage: analyzer_worker.py SAVE_PATH"""

import os
import sys
import time

import torch
from test_data_analyzer import Tokens, length

from dsdata import DataAnalyzer


def slow_length(batch):
    os.write(1, f"computing {os.getpid()}\n".encode())  # one write: three processes share the pipe
    time.sleep(1.0)  # 19 batches a process: each one outlives the test's 5 s wait by far
    return length(batch)


DataAnalyzer(Tokens(), num_threads=3, batch_size=8, metric_names=["length"], metric_functions=[slow_length],
             metric_types=["single_value_per_sample"], metric_dtypes=[torch.int64], save_path=sys.argv[1]).run_map()
