"""The autotuner writes only into folders it made, and never through a planted link (issue 28, item 1).

A results folder is a place other users (or a script gone wrong) may have written to: a link planted
at an experiment's folder used to get that folder's ds_config.json replaced and the experiment's logs
written into it, and a `summary.txt.partial` link to a user file had the file overwritten (the atomic
write followed it). Each test plants the link on real files and checks what it points at is untouched.
"""

import json
import os
import sys
from pathlib import Path

import pytest

import dsconfig
from dstrain.autotuning import AutotuningError, Point
from dstrain.autotuning.experiments import ExperimentRunner
from dstrain.autotuning.outputs import write_results
from dstrain.autotuning.owned_dirs import MARKER, OwnedDir, write_file_no_follow
from dstrain.autotuning.search import Outcome, Record, SearchResult

PRECIOUS = "a user's file: must survive the tuning session\n"
WRITES_METRICS = ("import json, os; json.dump({'throughput': 5.0}, "
                  "open(os.environ['DSTRAIN_AUTOTUNING_METRICS'], 'w')); print('ran')")


def runner(tmp_path: Path, code: str = WRITES_METRICS, **kwargs) -> ExperimentRunner:
    return ExperimentRunner({"optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}}, metric="throughput",
                            end_step=3, exps_dir=tmp_path / "exps", results_dir=tmp_path / "results",
                            command=lambda path, config: [sys.executable, "-c", code],
                            description={"world_size": 1}, cwd=str(tmp_path), **kwargs)


@pytest.fixture
def victim(tmp_path):
    """A folder of the user's, with a config and a log the tuner must never touch."""
    folder = tmp_path / "victim"
    folder.mkdir()
    for name in ("ds_config.json", "stdout.log", "exp.json"):
        (folder / name).write_text(PRECIOUS)
    return folder


def untouched(folder: Path) -> bool:
    return sorted(p.name for p in folder.iterdir()) == ["ds_config.json", "exp.json", "stdout.log"] and all(
        p.read_text() == PRECIOUS for p in folder.iterdir())


POINT = Point(0, 2, 1, 2)  # z0_gas1_tmbspg2


def test_an_experiment_folder_planted_as_a_link_is_refused_and_its_target_untouched(tmp_path, victim):
    tune = runner(tmp_path)  # the tuner made results/
    (tmp_path / "results" / POINT.name).symlink_to(victim, target_is_directory=True)
    with pytest.raises(AutotuningError) as info:
        tune(POINT)
    message = str(info.value)
    assert str(tmp_path / "results" / POINT.name) in message and "symbolic link" in message
    assert str(victim) in message  # names where the link points
    assert untouched(victim)


def test_an_experiment_folder_the_tuner_did_not_make_is_refused(tmp_path):
    tune = runner(tmp_path)
    planted = tmp_path / "results" / POINT.name
    planted.mkdir()
    (planted / "stdout.log").symlink_to(tmp_path / "elsewhere.log")
    with pytest.raises(AutotuningError, match=f"{planted} was not made by the autotuner"):
        tune(POINT)
    assert not (tmp_path / "elsewhere.log").exists()


def test_a_link_planted_in_an_earlier_sessions_experiment_folder_is_refused(tmp_path, victim):
    assert runner(tmp_path)(POINT).status == "ok"  # an earlier session: the folder is the tuner's
    folder = tmp_path / "results" / POINT.name
    (folder / "stdout.log").unlink()
    (folder / "stdout.log").symlink_to(victim / "stdout.log")
    with pytest.raises(AutotuningError, match=r"stdout.log is a symbolic link \(to .*victim/stdout.log"):
        runner(tmp_path, overwrite=True)(POINT)
    assert untouched(victim)


def test_experiments_of_an_earlier_session_are_taken_up(tmp_path):
    first = runner(tmp_path)(POINT)
    again = runner(tmp_path)(POINT)  # the same folders, made by the first session: reused, not refused
    assert (first.status, again.status, again.reused) == ("ok", "ok", True)
    folder = tmp_path / "results" / POINT.name
    assert (folder / MARKER).is_file() and (tmp_path / "results" / MARKER).is_file()
    assert (folder / "stdout.log").read_text() == "ran\n"


@pytest.mark.parametrize("key", ["results_dir", "exps_dir"])
def test_a_results_folder_that_is_a_link_is_refused_naming_the_key(tmp_path, victim, key):
    (tmp_path / ("results" if key == "results_dir" else "exps")).symlink_to(victim, target_is_directory=True)
    with pytest.raises(dsconfig.ConfigError) as info:
        runner(tmp_path)
    assert info.value.paths == [f"autotuning.{key}"]
    assert "is a symbolic link" in str(info.value) and str(victim) in str(info.value)
    assert untouched(victim)


def test_a_full_folder_the_tuner_did_not_make_is_refused_and_an_empty_one_taken_up(tmp_path, victim):
    with pytest.raises(dsconfig.ConfigError, match="was not made by the autotuner"):
        OwnedDir.prepare(victim, "results_dir")
    assert untouched(victim)
    empty = tmp_path / "empty"
    empty.mkdir()
    OwnedDir.prepare(empty, "results_dir").close()
    assert (empty / MARKER).is_file()


def _result() -> SearchResult:
    result = SearchResult("throughput")
    result.records.append(Record(POINT, Outcome("ok", {"throughput": 5.0}), "tuning"))
    return result


@pytest.mark.parametrize("name", ["summary.txt.partial", "summary.txt", "ds_config_optimal.json.partial"])
def test_a_summary_file_planted_as_a_link_to_a_user_file_is_refused(tmp_path, name):
    results = OwnedDir.prepare(tmp_path / "results", "results_dir")
    user_file = tmp_path / "notes.txt"
    user_file.write_text(PRECIOUS)
    (tmp_path / "results" / name).symlink_to(user_file)
    with pytest.raises(AutotuningError, match=f"{name} is a symbolic link"):
        write_results(_result(), results, optimal={"train_batch_size": 2}, optimal_command="dstrain x.py")
    assert user_file.read_text() == PRECIOUS
    with pytest.raises(AutotuningError, match=f"{name} is a symbolic link"):
        results.refuse_links(("summary.txt", "ds_config_optimal.json"))  # what tune checks before the first run


def test_a_description_in_exps_dir_is_not_written_through_a_link(tmp_path):
    user_file = tmp_path / "notes.txt"
    user_file.write_text(PRECIOUS)
    tune = runner(tmp_path)
    (tmp_path / "exps" / f"{POINT.name}.json.partial").symlink_to(user_file)
    with pytest.raises(AutotuningError, match="symbolic link"):
        tune(POINT)
    assert user_file.read_text() == PRECIOUS


def test_the_engines_metrics_file_is_not_written_through_a_link(tmp_path):
    user_file = tmp_path / "notes.txt"
    user_file.write_text(PRECIOUS)
    folder = tmp_path / "exp"
    folder.mkdir()
    (folder / "metrics.json.partial").symlink_to(user_file)
    with pytest.raises(AutotuningError, match="symbolic link"):
        write_file_no_follow(str(folder / "metrics.json"), "{}")
    (tmp_path / "swapped").symlink_to(folder, target_is_directory=True)
    with pytest.raises(OSError):  # a folder swapped for a link is not entered
        write_file_no_follow(str(tmp_path / "swapped" / "metrics.json"), "{}")
    assert user_file.read_text() == PRECIOUS
    (folder / "metrics.json.partial").unlink()
    write_file_no_follow(str(folder / "metrics.json"), json.dumps({"ok": 1}))
    assert json.loads((folder / "metrics.json").read_text()) == {"ok": 1}
    assert sorted(os.listdir(folder)) == ["metrics.json"]
