"""Checkpoints: what `save_checkpoint` / `load_checkpoint` write and read (tags, `latest`, manifests,
the module, ZeRO shards, scheduler, client state, RNG), and the layouts of tensor-parallel, pipeline
and expert runs."""
