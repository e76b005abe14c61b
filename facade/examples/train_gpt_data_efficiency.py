"""Finetune a small GPT with DeepSpeed's data efficiency: a curriculum (easy windows first, short sequences
first) and random layerwise token dropping, on the Python standard library's source as characters.

    dstrain --num_procs 2 facade/examples/train_gpt_data_efficiency.py --steps 200

1. Data analysis (once, all ranks sharing the work): dsdata's DataAnalyzer gives every window a
   difficulty, its "rarity" (bytes outside the corpus's 32 most common ones), and indexes the windows
   by it in DeepSpeed's files.
2. Curriculum: the config's data_sampling section admits windows up to a rising rarity (clusters of
   the analysis) and a rising sequence length ("seqlen", applied by a post-processing function that
   truncates each batch).
3. Random-LTD: the middle transformer blocks run on a random subset of the tokens, growing from a
   quarter of the full sequence to all of it over the run.
The config is written below as DeepSpeed's JSON would be; the script is a DeepSpeed script with
`import dstrain as deepspeed`.
"""

import argparse
import os
import sys
import time
from pathlib import Path

import torch

import dsdata
import dstrain as deepspeed

sys.path.insert(0, str(Path(__file__).parent))
from gpt_model import GPT, Block
from text_corpus import CharWindows, stdlib_bytes


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--local_rank", type=int, default=-1, help="set by the launcher")
    parser.add_argument("--steps", type=int, default=200, help="optimizer steps")
    parser.add_argument("--seq", type=int, default=64, help="characters of context")
    parser.add_argument("--d-model", type=int, default=96)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--corpus-mb", type=float, default=0.5)
    parser.add_argument("--out", default="runs/train_gpt_data_efficiency", help="analysis files go here")
    parser.add_argument("--seed", type=int, default=1234)
    return parser.parse_args(argv)


class Rarity:
    """Bytes of a window outside the corpus's 32 most common ones: symbols and rare letters are harder."""

    def __init__(self, text: bytes):
        counts = torch.bincount(torch.frombuffer(bytearray(text), dtype=torch.uint8).long(), minlength=256)
        self.common = torch.zeros(256, dtype=torch.bool)
        self.common[counts.topk(32).indices] = True

    def __call__(self, batch: torch.Tensor) -> torch.Tensor:
        return (~self.common[batch]).sum(dim=1)


def ds_config(args, analysis: Path) -> dict:
    rarity = analysis / "rarity"
    layers = args.layers
    return {
        "train_micro_batch_size_per_gpu": args.micro_batch,
        "gradient_accumulation_steps": 1,
        "steps_per_print": 50,
        "optimizer": {"type": "AdamW", "params": {"lr": 2e-3, "weight_decay": 0.01}},
        "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 2e-3,
                                                     "warmup_num_steps": 20}},
        "gradient_clipping": 1.0,
        "data_efficiency": {
            "enabled": True,
            "seed": args.seed,
            "data_sampling": {
                "enabled": True,
                "num_epochs": 100,
                "curriculum_learning": {
                    "enabled": True,
                    "data_cluster_path": str(analysis / "clusters"),
                    "curriculum_metrics": {
                        "rarity": {"index_to_sample_path": str(rarity / "rarity_index_to_sample_percentile_merged"),
                                   "index_to_metric_path": str(rarity / "rarity_index_to_metric"),
                                   "difficulty_type": "percentile", "clustering_type": "schedule_based",
                                   "min_difficulty": 20, "max_difficulty": 100, "schedule_type": "fixed_root",
                                   "schedule_config": {"total_curriculum_step": args.steps // 2,
                                                       "difficulty_step": 5, "root_degree": 2}},
                        "seqlen": {"clustering_type": "single_cluster", "min_difficulty": args.seq // 2,
                                   "max_difficulty": args.seq, "schedule_type": "fixed_linear",
                                   "schedule_config": {"total_curriculum_step": args.steps // 2,
                                                       "difficulty_step": 8}}}}},
            "data_routing": {
                "enabled": True,
                "random_ltd": {
                    "enabled": True, "total_layer_num": layers, "random_ltd_layer_num": layers - 2,
                    "random_ltd_layer_id": list(range(1, layers - 1)), "model_mask_name": None,
                    "model_type": "decoder", "hidden_state_order": "batch_seq_dim",
                    "random_ltd_schedule": {"min_value": args.seq // 4, "max_value": args.seq,
                                            "schedule_type": "fixed_linear",
                                            "schedule_config": {"require_steps": args.steps,
                                                                "seq_per_step": 8}}}}},
    }


def analyze(dataset, text: bytes, analysis: Path, rank: int, world: int) -> None:
    """Each rank analyzes its share of the windows; rank 0 merges (skipped when the files exist)."""
    if (analysis / "rarity" / "rarity_index_to_metric.idx").exists():
        return
    dsdata.DataAnalyzer(dataset, num_workers=world, worker_id=rank, batch_size=512, metric_names=["rarity"],
                        metric_functions=[Rarity(text)], metric_types=["single_value_per_sample"],
                        metric_dtypes=[torch.int64], save_path=str(analysis)).run_map_reduce()


def run(args) -> dict:
    """Train; returns the first and last losses and the token counts (rank 0's)."""
    deepspeed.init_distributed()
    rank, world = deepspeed.comm.get_rank(), deepspeed.comm.get_world_size()
    torch.manual_seed(args.seed)
    text = stdlib_bytes(int(args.corpus_mb * 1024 * 1024))
    dataset = CharWindows(text, args.seq)
    analysis = Path(args.out) / "analysis"
    analyze(dataset, text, analysis, rank, world)

    model = GPT(seq=args.seq, d_model=args.d_model, layers=args.layers, heads=args.heads)
    engine, _, loader, _ = deepspeed.initialize(model=model, config=ds_config(args, analysis), training_data=dataset)
    # Curriculum by sequence length: each batch cut to the current "seqlen" difficulty (+1 for the targets).
    engine.set_data_post_process_func(dsdata.seqlen_post_process("seqlen", extra_tokens=1))
    deepspeed.convert_to_random_ltd(engine, Block)  # the middle blocks drop tokens (random_ltd_layer_id)

    losses, lengths, began = [], [], time.perf_counter()
    for batch in loader:
        batch = batch.to(engine.device)  # the loader yields CPU tensors
        loss = engine(batch)
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
        lengths.append(batch.shape[1] - 1)
        if engine.global_steps >= args.steps:
            break
    ltd = engine.random_ltd_scheduler.state  # DeepSpeed's attribute
    window = max(1, min(20, len(losses) // 4))
    result = {"first": sum(losses[:window]) / window, "last": sum(losses[-window:]) / window,
              "lengths": (lengths[0], lengths[-1]), "consumed_tokens": ltd["consumed_tokens"],
              "consumed_layer_tokens": ltd["consumed_layer_tokens"], "seconds": time.perf_counter() - began}
    if rank == 0:
        print(f"{engine.global_steps} steps in {result['seconds']:.0f} s: loss {result['first']:.3f} -> "
              f"{result['last']:.3f} (means of {window} steps); sequence length {lengths[0]} -> {lengths[-1]}; "
              f"{ltd['consumed_tokens']} tokens, {ltd['consumed_layer_tokens']} layer tokens (without random-LTD: "
              f"{ltd['consumed_tokens'] * args.layers})", flush=True)
    engine.destroy()
    return result


def main() -> None:
    args = parse_args()
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // local_world))  # ranks share this machine's cores
    run(args)


if __name__ == "__main__":
    main()
