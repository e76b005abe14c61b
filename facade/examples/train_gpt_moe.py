"""Train the main example's GPT with Mixture-of-Experts layers (the MoE-for-NLG tutorial), with dstrain.

    dstrain --num_procs 2 facade/examples/train_gpt_moe.py --deepspeed_config facade/examples/configs/moe_ep1.json --ep-size 1
    dstrain --num_procs 2 facade/examples/train_gpt_moe.py --deepspeed_config facade/examples/configs/moe_ep2.json --ep-size 2
    # PR-MoE: more experts near the output, each MoE layer a Residual MoE
    dstrain --num_procs 2 facade/examples/train_gpt_moe.py --deepspeed_config facade/examples/configs/moe_ep2.json \\
        --ep-size 2 --num-experts 2 4 --mlp-type residual
    # Mixture-of-Students: a smaller student distilled from that run's checkpoint for the first 50 steps
    dstrain --num_procs 2 facade/examples/train_gpt_moe.py --deepspeed_config facade/examples/configs/moe_ep2.json \\
        --ep-size 2 --num-experts 2 2 --mos --load-teacher runs/train_gpt_moe/checkpoints/moe_ep2 \\
        --teacher-num-experts 2 4 --teacher-mlp-type residual --mos-stop-step 50 --out runs/train_gpt_moe_mos

Every other block's MLP is an MoE layer (the tutorial's expert interval 2); `--num-experts` gives one
count per MoE layer (one count: all of them). The loss is the language-modelling loss plus
`--moe-loss-coeff` times the summed load-balancing losses, as Megatron-DeepSpeed's. As in
DeepSpeed's MoE examples the expert-parallel size is the script's argument; the two configs differ in
ZeRO stage and where they log. Written as a DeepSpeed script would be (`import dstrain as deepspeed`).
"""

import argparse
import os
import sys
import time
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

import dstrain as deepspeed

sys.path.insert(0, str(Path(__file__).parent))
from evaluation import evaluate
from gpt_model import CausalSelfAttention
from progress import ProgressBar
from text_corpus import CharWindows, stdlib_bytes


class MoEBlock(nn.Module):
    """A pre-norm decoder block whose MLP is an MoE layer (or a dense MLP for a count of one)."""

    def __init__(self, d_model: int, heads: int, mlp: nn.Module):
        super().__init__()
        self.norm1 = nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model, heads)
        self.norm2 = nn.LayerNorm(d_model)
        self.mlp = mlp  # returns (output, l_aux, exp_counts)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = x + self.attn(self.norm1(x))
        out, l_aux, _ = self.mlp(self.norm2(x))
        return x + out, l_aux


class DenseBlock(nn.Module):
    def __init__(self, d_model: int, heads: int):
        super().__init__()
        self.norm1 = nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model, heads)
        self.norm2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x)), x.new_zeros(())


class MoEGPT(nn.Module):
    """forward(tokens) -> LM loss + coeff x sum(l_aux); with return_logits=True, (that loss, logits)."""

    def __init__(self, args: argparse.Namespace, num_experts: list[int], mlp_type: str):
        super().__init__()
        d, layers = args.d_model, args.layers
        self.embed = nn.Embedding(256, d)
        self.pos = nn.Embedding(args.seq, d)
        moe_layers = deepspeed.moe.pyramid_layers(
            d, lambda: nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d)), num_experts,
            num_layers=layers // 2, ep_size=args.ep_size, mlp_type=mlp_type, k=args.top_k,
            capacity_factor=args.capacity_factor, eval_capacity_factor=args.capacity_factor, min_capacity=4)
        moe = iter(moe_layers)
        self.blocks = nn.ModuleList(MoEBlock(d, args.heads, next(moe)) if i % 2 else DenseBlock(d, args.heads)
                                    for i in range(layers))
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, 256, bias=False)
        self.moe_loss_coeff = args.moe_loss_coeff
        for weight in (self.embed.weight, self.pos.weight, self.head.weight):
            nn.init.normal_(weight, std=0.02)

    def forward(self, tokens: torch.Tensor, return_logits: bool = False):
        inputs, targets = tokens[:, :-1], tokens[:, 1:]
        x = self.embed(inputs) + self.pos(torch.arange(inputs.shape[1], device=inputs.device))
        aux = x.new_zeros(())
        for block in self.blocks:
            x, l_aux = block(x)
            aux = aux + l_aux
        logits = self.head(self.norm(x))
        loss = F.cross_entropy(logits.reshape(-1, 256).float(), targets.reshape(-1)) + self.moe_loss_coeff * aux
        return (loss, logits) if return_logits else loss


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--local_rank", type=int, default=-1, help="set by the launcher")
    parser.add_argument("--steps", type=int, default=200, help="optimizer steps to train in all (resumed included)")
    parser.add_argument("--seq", type=int, default=128, help="characters of context")
    parser.add_argument("--d-model", type=int, default=128)
    parser.add_argument("--layers", type=int, default=4, help="blocks; every second one is an MoE block")
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--num-experts", type=int, nargs="+", default=[4], help="experts per MoE layer (PR-MoE: a list)")
    parser.add_argument("--ep-size", type=int, default=1, help="ranks the experts of a layer are spread over")
    parser.add_argument("--mlp-type", choices=["standard", "residual"], default="standard", help="residual: PR-MoE")
    parser.add_argument("--top-k", type=int, default=1)
    parser.add_argument("--capacity-factor", type=float, default=1.25)
    parser.add_argument("--moe-loss-coeff", type=float, default=0.01, help="weight of the load-balancing loss")
    parser.add_argument("--mos", action="store_true", help="Mixture-of-Students: distil from --load-teacher")
    parser.add_argument("--load-teacher", help="the teacher's checkpoint directory (a dstrain save_dir)")
    parser.add_argument("--teacher-num-experts", type=int, nargs="+", help="the teacher's experts per MoE layer")
    parser.add_argument("--teacher-mlp-type", choices=["standard", "residual"], default="standard")
    parser.add_argument("--mos-stop-step", type=int, default=None, help="stop distilling at this step")
    parser.add_argument("--kd-temp", type=float, default=1.0)
    parser.add_argument("--kd-weight", type=float, default=1.0)
    parser.add_argument("--report-expert-counts", type=int, default=0, help="write expert loads every N steps")
    parser.add_argument("--corpus-mb", type=float, default=2.0, help="megabytes of standard-library source to read")
    parser.add_argument("--out", default="runs/train_gpt_moe", help="where checkpoints go (logs: see the config)")
    parser.add_argument("--save-every", type=int, default=100, help="save a checkpoint every N steps (and at the end)")
    parser.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in --out")
    parser.add_argument("--seed", type=int, default=1234)
    args = deepspeed.add_config_arguments(parser).parse_args()
    if args.mos and not args.load_teacher:
        parser.error("--mos needs --load-teacher <the teacher's checkpoint directory>")
    return args


def main() -> None:
    args = parse_args()
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // local_world))  # ranks share this machine's cores
    deepspeed.init_distributed()
    rank = deepspeed.comm.get_rank()
    torch.manual_seed(args.seed)

    text = stdlib_bytes(int(args.corpus_mb * 1024 * 1024))
    split = int(len(text) * 0.95)
    train_data, val_data = CharWindows(text[:split], args.seq), CharWindows(text[split:], args.seq)
    model = MoEGPT(args, args.num_experts, args.mlp_type)
    engine, _, loader, _ = deepspeed.initialize(args=args, model=model, model_parameters=model.parameters(),
                                                training_data=train_data)
    mos = None
    if args.mos:
        teacher = MoEGPT(args, args.teacher_num_experts or args.num_experts, args.teacher_mlp_type)
        deepspeed.moe.load_teacher(teacher, args.load_teacher)
        mos = deepspeed.moe.MixtureOfStudents(teacher.to(engine.device), temperature=args.kd_temp,
                                              kd_weight=args.kd_weight, stop_step=args.mos_stop_step)
    config_name = Path(args.deepspeed_config).stem if args.deepspeed_config else "config"
    ckpt_dir = Path(args.out) / "checkpoints" / config_name
    if args.resume:
        path, _client = engine.load_checkpoint(ckpt_dir)
        if path is None and rank == 0:
            print(f"--resume: no checkpoint in {ckpt_dir} yet; starting from step 0", flush=True)
    if rank == 0:
        params = sum(p.numel() for p in model.parameters())
        print(f"model: {params / 1e6:.2f}M parameters on this rank; experts per MoE layer {args.num_experts} "
              f"({args.mlp_type}), expert-parallel size {args.ep_size}; {len(train_data)} training windows", flush=True)

    batches = deepspeed.RepeatingLoader(loader)
    start = engine.global_steps
    bar = ProgressBar(args.steps, start=start, enabled=rank == 0)
    first, last, window = [], [], 10
    began = time.perf_counter()
    while engine.global_steps < args.steps:
        step_loss = 0.0
        for _ in range(engine.gradient_accumulation_steps()):
            tokens = next(batches).to(engine.device)  # the loader yields CPU tensors
            if mos is not None and mos.distilling(engine.global_steps):
                loss, logits = engine(tokens, return_logits=True)
                with torch.no_grad():
                    _, teacher_logits = mos.teacher(tokens, return_logits=True)
                loss = mos.loss(loss, logits, engine.global_steps, teacher_logits=teacher_logits)
            else:
                loss = engine(tokens)
            engine.backward(loss)
            engine.step()
            step_loss += loss.item() / engine.gradient_accumulation_steps()
        (first if len(first) < window else last).append(step_loss)
        last[:] = last[-window:]
        bar.update(engine.global_steps, step_loss, engine.train_batch_size())
        if args.report_expert_counts and engine.global_steps % args.report_expert_counts == 0:
            deepspeed.moe.report_expert_counts(engine)
        if engine.global_steps % args.save_every == 0 or engine.global_steps == args.steps:
            engine.save_checkpoint(ckpt_dir)
    bar.close()
    val = evaluate(engine, val_data)
    if rank == 0:
        trained = engine.global_steps - start
        if trained:
            print(f"trained steps {start}..{engine.global_steps} in {time.perf_counter() - began:.0f} s; first loss "
                  f"{sum(first) / len(first):.3f} -> last loss {sum(last or first) / len(last or first):.3f} (mean "
                  f"of up to {window} steps); validation loss {val:.3f}", flush=True)
        print(f"checkpoint: {ckpt_dir} (resume with --resume)", flush=True)
    engine.destroy()


if __name__ == "__main__":
    main()
