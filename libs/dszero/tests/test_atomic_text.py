"""write_text_atomically replaces a file in one rename, and never writes through a link planted under the file's
temporary name (a checkpoint folder is shared ground)."""

import os

from dszero.checkpoint import write_text_atomically


def test_a_link_planted_under_the_temporary_name_is_removed_not_written_through(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("precious")
    (tmp_path / "latest.tmp").symlink_to(victim)
    write_text_atomically(tmp_path / "latest", "global_step2")
    assert victim.read_text() == "precious"
    assert (tmp_path / "latest").read_text() == "global_step2" and not (tmp_path / "latest.tmp").exists()


def test_the_mode_is_the_new_files(tmp_path):
    write_text_atomically(tmp_path / "script.py", "print()\n", mode=0o755)
    assert os.access(tmp_path / "script.py", os.X_OK)
    write_text_atomically(tmp_path / "latest", "t")
    assert not os.access(tmp_path / "latest", os.X_OK)
