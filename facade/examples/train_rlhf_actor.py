"""A small PPO loop on a tiny Llama: the actor trains with the Hybrid Engine at ZeRO-3 and generates
its own answers between steps, as DeepSpeed-Chat's step 3 does.

    dstrain --num_procs 2 facade/examples/train_rlhf_actor.py --deepspeed_config facade/examples/configs/rlhf_actor_zero3.json

Each iteration: the actor samples answers to a batch of prompts (`engine.module.generate`, weights gathered
once per call), a frozen critic scores every answer token (+1 for an even token id, -1 for an odd one: a
reward the policy can learn), a frozen reference model gives the KL penalty, and a clipped PPO update
trains the actor. The mean reward rises; `engine.eval()` prints the Hybrid Engine's latency split.
Written as a DeepSpeed script would be (`import dstrain as deepspeed` is the only change).
"""

import argparse
import copy
import os

import torch
import transformers

import dstrain as deepspeed

VOCAB = 64


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--local_rank", type=int, default=-1, help="set by the launcher")
    parser.add_argument("--iterations", type=int, default=30)
    parser.add_argument("--prompt-length", type=int, default=8)
    parser.add_argument("--answer-length", type=int, default=16)
    parser.add_argument("--ppo-epochs", type=int, default=2)
    parser.add_argument("--kl-coef", type=float, default=0.05)
    parser.add_argument("--clip", type=float, default=0.2)
    parser.add_argument("--seed", type=int, default=1234)
    return deepspeed.add_config_arguments(parser).parse_args()


def tiny_llama(seed: int) -> torch.nn.Module:
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=128,
                                      pad_token_id=0, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(seed)
    return transformers.AutoModelForCausalLM.from_config(config)


class Critic(torch.nn.Module):
    """A frozen per-token reward: +1 for an even token id, -1 for an odd one (ids 0-2 are special: 0)."""

    def __init__(self):
        super().__init__()
        scores = torch.tensor([1.0 if t % 2 == 0 else -1.0 for t in range(VOCAB)])
        scores[:3] = 0.0
        self.score = torch.nn.Embedding.from_pretrained(scores[:, None], freeze=True)

    def forward(self, answers: torch.Tensor) -> torch.Tensor:
        return self.score(answers).squeeze(-1).mean(dim=1)


def token_logprobs(logits: torch.Tensor, sequences: torch.Tensor, answer_from: int) -> torch.Tensor:
    """Log-probability of each answer token under `logits` (the model's output for `sequences`)."""
    logprobs = torch.log_softmax(logits[:, answer_from - 1:-1].float(), dim=-1)
    return logprobs.gather(-1, sequences[:, answer_from:, None]).squeeze(-1)


def main() -> None:
    args = parse_args()
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // local_world))
    deepspeed.init_distributed()
    rank = deepspeed.comm.get_rank()

    actor = tiny_llama(args.seed)
    reference = copy.deepcopy(actor).eval().requires_grad_(False)  # the policy before training: the KL anchor
    critic = Critic().eval()
    engine, *_ = deepspeed.initialize(args=args, model=actor, model_parameters=actor.parameters())
    reference.to(engine.device)
    critic.to(engine.device)
    zero3 = engine.zero_optimization_stage() == 3
    rows, p = engine.train_micro_batch_size_per_gpu(), args.prompt_length
    prompts_gen = torch.Generator().manual_seed(args.seed + rank)
    rewards = []
    for iteration in range(args.iterations):
        prompts = torch.randint(3, VOCAB, (rows, p), generator=prompts_gen).to(engine.device)
        # 1. Generate with the actor (the Hybrid Engine gathers the ZeRO-3 weights once for the call).
        engine.eval()
        sequences = engine.module.generate(prompts, attention_mask=torch.ones_like(prompts),
                                           max_length=p + args.answer_length, min_length=p + args.answer_length,
                                           do_sample=True, top_k=0, pad_token_id=0, synced_gpus=zero3)
        answers = sequences[:, p:]
        # 2. Score: the critic's reward, a KL penalty against the reference, the old log-probabilities.
        with torch.no_grad():
            old = token_logprobs(engine(input_ids=sequences).logits, sequences, p)
            ref = token_logprobs(reference(input_ids=sequences).logits, sequences, p)
            reward = critic(answers)
            returns = reward[:, None] - args.kl_coef * (old - ref)
            advantage = (returns - returns.mean()) / (returns.std() + 1e-6)
        rewards.append(reward.mean().item())
        # 3. PPO: the clipped objective on the answers' tokens.
        engine.train()
        for _ in range(args.ppo_epochs):
            new = token_logprobs(engine(input_ids=sequences).logits, sequences, p)
            ratio = torch.exp(new - old)
            clipped = torch.clamp(ratio, 1 - args.clip, 1 + args.clip)
            loss = -torch.min(ratio * advantage, clipped * advantage).mean()
            engine.backward(loss)
            engine.step()
        if rank == 0 and (iteration % 5 == 0 or iteration == args.iterations - 1):
            kl = (old - ref).mean().item()
            print(f"iteration {iteration:3d}  mean reward {rewards[-1]:+.3f}  KL to the reference {kl:.4f}", flush=True)
    engine.eval()  # prints the last iteration's latency split
    if rank == 0:
        first, last = sum(rewards[:5]) / min(5, len(rewards)), sum(rewards[-5:]) / min(5, len(rewards))
        print(f"mean reward: first iterations {first:+.3f}, last iterations {last:+.3f}")
    engine.destroy()


if __name__ == "__main__":
    main()
