"""DeepSpeed's own checkpoint files, read into a WholeCheckpoint (nothing here writes them).

    files.py        which files a tag directory holds, by name; complete rank ranges
    unpickler.py    the restricted unpickler every `.pt` file goes through
    zero_states.py  each parameter's master and optimizer state from ZeRO's partitions (stages 0-3)
    experts.py      MoE experts numbered per rank in the ZeRO files, renamed to global ids
    reader.py       read_deepspeed(tag_dir): the whole checkpoint
"""
