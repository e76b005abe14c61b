"""The analyzer's map parts record their run: the reduce refuses parts of two analyses (a rerun killed half
way beside the parts of the run before it, a worker rerun under another run id) and parts that never
finished; a SIGKILLed analyzer leaves none of its forked map processes running."""

import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import mmap_format
import pytest
import torch
from test_data_analyzer import Tokens, length

from dsdata import DataAnalyzer, DataEfficiencyError

HERE = Path(__file__).resolve().parent


def doubled_length(batch):
    return 2 * length(batch)


FIRST_SAMPLE = Tokens().data[0]


def dies_in_thread_zero(batch):
    if torch.equal(batch[0], FIRST_SAMPLE):  # thread 0's first batch: its process stops dead, as if killed
        os._exit(9)
    return doubled_length(batch)


def analyzer(save_path, function, **kwargs):
    return DataAnalyzer(Tokens(), batch_size=32, metric_names=["length"], metric_functions=[function],
                        metric_types=["single_value_per_sample"], metric_dtypes=[torch.int64],
                        save_path=str(save_path), **kwargs)


def test_a_rerun_killed_half_way_is_not_merged_with_the_run_before(tmp_path):
    analyzer(tmp_path, length, num_threads=3).run_map_reduce()
    # The second analysis (another metric) loses thread 0's process; threads 1 and 2 finish with new values.
    with pytest.raises(DataEfficiencyError, match="map failed in thread 0"):
        analyzer(tmp_path, dies_in_thread_zero, num_threads=3).run_map()
    with pytest.raises(DataEfficiencyError, match=r"1 of 3 map part\(s\) did not finish .*worker0_thread0"):
        analyzer(tmp_path, dies_in_thread_zero, num_threads=3).run_reduce()


def test_a_worker_rerun_under_another_run_id_is_refused(tmp_path):
    for worker in range(2):
        analyzer(tmp_path, length, num_workers=2, worker_id=worker, run_id="first").run_map()
    analyzer(tmp_path, length, num_workers=2, run_id="first").run_reduce()
    analyzer(tmp_path, doubled_length, num_workers=2, worker_id=0, run_id="second").run_map()
    with pytest.raises(DataEfficiencyError, match=r"different runs: run second: 1 part\(s\).*run first: 1 part"):
        analyzer(tmp_path, doubled_length, num_workers=2).run_reduce()


def test_separate_workers_without_a_run_id_still_merge_and_are_warned(tmp_path, caplog):
    for worker in range(2):
        analyzer(tmp_path, length, num_workers=2, worker_id=worker, num_threads=2).run_map()
    analyzer(tmp_path, length, num_workers=2, num_threads=2).run_reduce()
    assert "without a shared run_id" in caplog.text
    _, items, _ = mmap_format.read(tmp_path / "length" / "length_sample_to_metric")
    assert [v for item in items for v in item] == length(Tokens().data).tolist()


def test_rerunning_specific_threads_continues_the_worker_run(tmp_path):
    analyzer(tmp_path, length, num_threads=3).run_map()
    analyzer(tmp_path, length, num_threads=3, specific_threads=[1]).run_map()  # DeepSpeed's way to redo a thread
    analyzer(tmp_path, length, num_threads=3).run_reduce()
    with pytest.raises(DataEfficiencyError, match=r"map part .*worker0_thread0 was computed as"):
        analyzer(tmp_path, length, num_threads=2).run_reduce()  # another split of the same files


def _state(pid):
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rfind(")") + 2]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_killed_analyzer_leaves_no_map_process_running(tmp_path):
    proc = subprocess.Popen([sys.executable, str(HERE / "analyzer_worker.py"), str(tmp_path)], stdout=subprocess.PIPE,
                            text=True)
    pids, deadline = set(), time.monotonic() + 120
    try:
        while len(pids) < 3 and time.monotonic() < deadline:
            if select.select([proc.stdout], [], [], 1)[0]:
                line = proc.stdout.readline()
                if line.startswith("computing "):
                    pids.add(int(line.split()[1]))
        assert len(pids) == 3, f"the three map processes did not start: {pids}"
        children = pids - {proc.pid}
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and any(_state(pid) not in (None, "Z") for pid in children):
            time.sleep(0.1)
        left = {pid: _state(pid) for pid in children if _state(pid) not in (None, "Z")}
        assert not left, f"map processes still running after their analyzer was killed: {left}"
    finally:
        for pid in pids - {proc.pid}:
            if _state(pid) not in (None, "Z"):
                os.kill(pid, signal.SIGKILL)
        proc.kill()
        proc.stdout.close()
    with pytest.raises(DataEfficiencyError, match=r"3 of 3 map part\(s\) did not finish"):
        analyzer(tmp_path, length, num_threads=3).run_reduce()
