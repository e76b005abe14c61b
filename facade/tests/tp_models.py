"""Tiny Hugging Face causal LMs built from configs (nothing downloaded) for the tensor-parallel tests."""

import torch

VOCAB, SEQ = 64, 8


def hf_model(family: str = "llama", seed: int = 0, dtype=torch.float32, **extra):
    import transformers

    common = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=8,
                  num_key_value_heads=4, vocab_size=VOCAB, max_position_embeddings=64, tie_word_embeddings=False,
                  pad_token_id=0, bos_token_id=1, eos_token_id=2)
    common.update(extra)
    config = {"llama": transformers.LlamaConfig, "qwen2": transformers.Qwen2Config,
              "phi3": transformers.Phi3Config}[family](**common)
    torch.manual_seed(seed)
    return transformers.AutoModelForCausalLM.from_config(config, dtype=dtype).train()


def tokens(step: int, replica: int = 0, batch: int = 4) -> torch.Tensor:
    gen = torch.Generator().manual_seed(1000 * step + replica)
    return torch.randint(3, VOCAB, (batch, SEQ), generator=gen)


def tp_config(tp: int, stage: int = 0, **tensor_parallel) -> dict:
    return {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1, "gradient_clipping": 0.5,
            "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.01}},
            "zero_optimization": {"stage": stage, "stage3_gather_16bit_weights_on_model_save": True},
            "tensor_parallel": {"autotp_size": tp, **tensor_parallel}}


def whole_parameters(engine) -> dict[str, torch.Tensor]:
    """Every parameter of a (possibly cut, possibly stage-3 partitioned) engine's module, whole."""
    import dstp
    import dszero

    module = engine.module
    state = dstp.state_of(module)
    out = {}
    with dszero.GatheredParameters(list(module.parameters())):
        for name, param in module.named_parameters():
            value = param.detach().clone()
            pp = state.plan.params.get(name) if state is not None else None
            if pp is not None and pp.sharded:
                shards = [torch.empty_like(value) for _ in range(state.tp_size)]
                torch.distributed.all_gather(shards, value.contiguous(), group=state.tensor_group.group)
                value = dstp.merge_shards(shards, pp)
            out[name] = value
    return out
