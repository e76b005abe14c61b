"""Checkpoints: one writer, one reader, and one small protocol every part of a training run saves and
loads through. Tensor, pipeline and expert parallelism are layouts of those parts, not parts of their own.

Read it in this order:

    contents.py         WholeCheckpoint: a checkpoint seen whole, each tensor by its name in the model
    protocol.py         the protocol: a part's save / read / load, and what each is handed
    layout.py           how a run's tensors lie across its ranks (data, tensor, pipeline), now and when saved
    experts.py          ... and its experts (dsmoe's MoE layers, AutoEP), one file per global expert
    module_weights.py   the parts: the module's weights and buffers (module file, layer files, expert files)
    optimizer_state.py    ZeRO's masters, moments, per-group scalars and loss scaler (dszero's shards)
    training_state.py     scheduler, client state, step hooks, counters, each rank's loader and RNG
    run_parts.py        which parts a run has, in the order they load
    files.py            the files of a checkpoint, and what a file's place says it is
    records.py          every file records its save, step and place; loading checks them all first
    paths.py            tags, `latest`, a tag's directory
    saved.py            a dstrain checkpoint opened for loading: manifest, common file, layout, records
    writer.py           save_checkpoint
    reader.py           load_checkpoint, and FOREIGN_READERS: where other formats plug in
    whole.py            read_whole / load_whole: any layout, any format, through WholeCheckpoint
    sixteen_bit.py      save_16bit_model
    moe_teacher.py      load_teacher (Mixture-of-Students)
    rng.py              capture and restore every random generator

The engines call `save_checkpoint(parts, ...)`, `load_checkpoint(parts, ...)` and `save_16bit_model(parts,
...)` with their training parts (engine/parts.py), never with themselves.
"""

from .contents import WholeCheckpoint
from .reader import FOREIGN_READERS, ForeignReader, load_checkpoint
from .sixteen_bit import save_16bit_model
from .whole import load_whole, read_whole
from .writer import save_checkpoint

__all__ = ["FOREIGN_READERS", "ForeignReader", "WholeCheckpoint", "load_checkpoint", "load_whole", "read_whole",
           "save_16bit_model", "save_checkpoint"]
