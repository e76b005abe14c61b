"""Train the main example's GPT as a 2-stage pipeline (DeepSpeed's pipeline-parallelism tutorial), with dstrain.

    dstrain --num_procs 2 facade/examples/train_gpt_pipeline.py --deepspeed_config facade/examples/configs/pipeline_2stage.json

The GPT is written as one flat list of layers (the embeddings, the transformer blocks of gpt_model.py, the
output head) wrapped in a PipelineModule, which cuts it into --pipeline-parallel-size stages by parameter
count; each rank builds only its stage's layers. `engine.train_batch()` runs gradient_accumulation_steps
micro-batches through the stages by the config's schedule (pipeline.schedule: 1f1b, DeepSpeed's; gpipe,
zb_h1 ... also run) and steps the optimizer. With 2 processes and 2 stages there is one data-parallel replica;
with 4 processes, two. Written as DeepSpeed's tutorial is (`import dstrain as deepspeed` is the only change).
"""

import argparse
import math
import os
import sys
import time
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

import dstrain as deepspeed
from dstrain.pipe import LayerSpec, PipelineModule

sys.path.insert(0, str(Path(__file__).parent))
from gpt_model import Block
from progress import ProgressBar
from text_corpus import CharWindows, stdlib_bytes

VOCAB = 256


class Embeddings(nn.Module):
    """The first layer: token and position embeddings of the input characters."""

    def __init__(self, seq: int, d_model: int):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, d_model)
        self.pos = nn.Embedding(seq, d_model)
        nn.init.normal_(self.embed.weight, std=0.02)
        nn.init.normal_(self.pos.weight, std=0.02)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.embed(inputs) + self.pos(torch.arange(inputs.shape[1], device=inputs.device))


class OutputHead(nn.Module):
    """The last layer: final LayerNorm and the next-character logits."""

    def __init__(self, d_model: int):
        super().__init__()
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, VOCAB, bias=False)
        nn.init.normal_(self.head.weight, std=0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(x))


def next_char_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, VOCAB).float(), targets.reshape(-1))


class NextCharPairs(torch.utils.data.Dataset):
    """(inputs, targets) pairs, as a pipeline reads them: the first stage takes inputs, the last targets."""

    def __init__(self, windows: CharWindows):
        self.windows = windows

    def __len__(self) -> int:
        return len(self.windows)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        window = self.windows[index]
        return window[:-1], window[1:]


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--local_rank", type=int, default=-1, help="set by the launcher")
    parser.add_argument("-p", "--pipeline-parallel-size", type=int, default=2, help="pipeline stages")
    parser.add_argument("--steps", type=int, default=100, help="optimizer steps (each one train_batch)")
    parser.add_argument("--seq", type=int, default=128, help="characters of context")
    parser.add_argument("--d-model", type=int, default=128)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--corpus-mb", type=float, default=2.0, help="megabytes of standard-library source to read")
    parser.add_argument("--out", default="runs/train_gpt_pipeline", help="where checkpoints go (logs: see the config)")
    parser.add_argument("--seed", type=int, default=1234)
    return deepspeed.add_config_arguments(parser).parse_args()


def main() -> None:
    args = parse_args()
    deepspeed.init_distributed()  # before the PipelineModule: it reads the world to place its stages
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // local_world))  # ranks share this machine's cores
    rank = deepspeed.comm.get_rank()
    torch.manual_seed(args.seed)

    text = stdlib_bytes(int(args.corpus_mb * 1024 * 1024))
    split = int(len(text) * 0.95)
    train_data = NextCharPairs(CharWindows(text[:split], args.seq))
    val_data = NextCharPairs(CharWindows(text[split:], args.seq))

    layers = [LayerSpec(Embeddings, args.seq, args.d_model),
              *[LayerSpec(Block, args.d_model, args.heads) for _ in range(args.layers)],
              LayerSpec(OutputHead, args.d_model)]
    net = PipelineModule(layers=layers, loss_fn=next_char_loss, num_stages=args.pipeline_parallel_size,
                         partition_method="parameters")
    for name, param in net.named_parameters():  # GPT-2's scaled residual init, on this stage's blocks
        if name.endswith("proj.weight") or name.endswith("mlp.2.weight"):
            nn.init.normal_(param, std=0.02 / math.sqrt(2 * args.layers))
    engine, _, _, _ = deepspeed.initialize(args=args, model=net,
                                           model_parameters=[p for p in net.parameters() if p.requires_grad],
                                           training_data=train_data)
    stage_params = sum(p.numel() for p in net.parameters())
    print(f"rank {rank}: pipeline stage {engine.stage_id} of {engine.num_stages}, layers "
          f"{net.partitions()[engine.stage_id]}..{net.partitions()[engine.stage_id + 1] - 1} of {len(layers)}, "
          f"{stage_params / 1e6:.2f}M parameters", flush=True)

    bar = ProgressBar(args.steps, enabled=rank == 0)
    first, last, window = [], [], 10
    began = time.perf_counter()
    while engine.global_steps < args.steps:
        loss = engine.train_batch().item()  # the mean loss of the batch's micro-batches, on every rank
        (first if len(first) < window else last).append(loss)
        last[:] = last[-window:]
        bar.update(engine.global_steps, loss, engine.train_batch_size())
    bar.close()

    val_loader = torch.utils.data.DataLoader(val_data, batch_size=engine.train_micro_batch_size_per_gpu())
    val = engine.eval_batch(iter(val_loader)).item()
    ckpt_dir = Path(args.out) / "checkpoints" / Path(args.deepspeed_config or "config").stem
    engine.save_checkpoint(ckpt_dir)  # one file per layer, written by the stage that holds it
    if rank == 0:
        print(f"trained steps 0..{engine.global_steps} in {time.perf_counter() - began:.0f} s; first loss "
              f"{sum(first) / len(first):.3f} -> last loss {sum(last or first) / len(last or first):.3f} (mean of "
              f"up to {window} steps); validation loss {val:.3f}", flush=True)
        print(f"checkpoint: {ckpt_dir}", flush=True)
    engine.destroy()


if __name__ == "__main__":
    main()
