"""A tiny Llama as Megatron-DeepSpeed trains it: a PipelineModule of embedding (tied to the LM head), Hugging Face
decoder layers, the final norm and the head, cut by AutoTP inside each stage; and the same layers as one plain module,
built with the same per-layer seeds, for the one-process reference."""

import torch
from torch import nn

from dstrain.pipe import LayerSpec, PipelineModule, TiedLayerSpec

VOCAB, HIDDEN, SEQ, MICRO = 32, 16, 6, 2
LAYERS = 2
UNITS = 4  # micro-batches per step over all replicas: data x gradient_accumulation_steps


def llama_config():
    import transformers

    return transformers.LlamaConfig(hidden_size=HIDDEN, intermediate_size=24, num_hidden_layers=LAYERS,
                                    num_attention_heads=4, num_key_value_heads=2, vocab_size=VOCAB,
                                    max_position_embeddings=32, tie_word_embeddings=True)


def mixtral_config():
    import transformers

    return transformers.MixtralConfig(hidden_size=HIDDEN, intermediate_size=24, num_hidden_layers=LAYERS,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=VOCAB,
                                      max_position_embeddings=32, num_local_experts=4, num_experts_per_tok=2,
                                      tie_word_embeddings=True)


class DecoderLayer(nn.Module):
    """One Hugging Face decoder layer (Llama, or Mixtral with its MoE block) on hidden states alone (causal,
    positions 0..seq-1)."""

    def __init__(self, index: int, family: str = "llama"):
        super().__init__()
        if family == "llama":
            from transformers.models.llama.modeling_llama import LlamaDecoderLayer as Layer
            from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding as Rotary
            config = llama_config()
        else:
            from transformers.models.mixtral.modeling_mixtral import MixtralDecoderLayer as Layer
            from transformers.models.mixtral.modeling_mixtral import MixtralRotaryEmbedding as Rotary
            config = mixtral_config()
        self.layer = Layer(config, index)
        self.rotary = Rotary(config)
        if family == "mixtral":  # experts that differ, large enough to route unevenly
            generator = torch.Generator().manual_seed(100 + index)
            with torch.no_grad():
                for param in self.layer.mlp.parameters():
                    param.copy_(torch.randn(param.shape, generator=generator) * 0.3)

    def forward(self, hidden):
        positions = torch.arange(hidden.shape[1]).unsqueeze(0)
        embeddings = self.rotary(hidden, positions)
        out = self.layer(hidden, attention_mask=None, position_ids=positions, position_embeddings=embeddings)
        return out[0] if isinstance(out, tuple) else out


class FinalNorm(nn.Module):
    def __init__(self):
        super().__init__()
        from transformers.models.llama.modeling_llama import LlamaRMSNorm

        self.norm = LlamaRMSNorm(HIDDEN)

    def forward(self, hidden):
        return self.norm(hidden)


class MoEBlock(nn.Module):
    """A residual dsmoe MoE layer (top-1, no token dropped, no random draw), its experts initialised by global
    expert id (`ep_rank`: this rank's place in its expert-parallel group, known when the pipeline builds it)."""

    def __init__(self, index: int, ep_size: int = 1, ep_rank: int = 0):
        super().__init__()
        import dsmoe

        expert = nn.Sequential(nn.Linear(HIDDEN, 24), nn.GELU(), nn.Linear(24, HIDDEN))
        self.moe = dsmoe.MoE(HIDDEN, expert, num_experts=4, ep_size=ep_size, k=1, use_rts=False, drop_tokens=False,
                             min_capacity=0)
        local = self.moe.num_local_experts
        with torch.no_grad():
            for offset, module in enumerate(self.moe.deepspeed_moe.experts.deepspeed_experts):
                expert_id = ep_rank * local + offset
                for name, param in module.named_parameters():
                    generator = torch.Generator().manual_seed(1000 * index + 10 * expert_id + len(name))
                    param.copy_(torch.randn(param.shape, generator=generator) * 0.3)

    def forward(self, hidden):
        out, _, _ = self.moe(hidden)  # l_aux stays on its stage (no loss term crosses a pipeline here)
        return hidden + out


def project(embedding, hidden):
    return hidden @ embedding.weight.t()


def token_loss(logits, labels):
    return nn.functional.cross_entropy(logits.reshape(-1, VOCAB).float(), labels.reshape(-1))


def specs(body=None):
    """embedding, decoder layers (or `body(index)` specs), norm, LM head tied to the embedding."""
    body = body or (lambda i: LayerSpec(DecoderLayer, i))
    return [TiedLayerSpec("embed", nn.Embedding, VOCAB, HIDDEN), *[body(i) for i in range(LAYERS)],
            LayerSpec(FinalNorm), TiedLayerSpec("embed", nn.Embedding, VOCAB, HIDDEN, forward_fn=project)]


def pipeline(stages, tensor, data, dtype=torch.float64, body=None, partition="type:DecoderLayer|MoEBlock", **kwargs):
    from dscomm import PipeModelDataParallelTopology

    topology = PipeModelDataParallelTopology(num_pp=stages, num_mp=tensor, num_dp=data)
    module = PipelineModule(specs(body), topology=topology, loss_fn=token_loss, seed_layers=True,
                            partition_method=partition, **kwargs)
    return module.to(dtype)


def batch(step, unit):
    gen = torch.Generator().manual_seed(1000 * step + unit)
    return torch.randint(0, VOCAB, (MICRO, SEQ), generator=gen), torch.randint(0, VOCAB, (MICRO, SEQ), generator=gen)


def batches(step, replica, data):
    """Replica `replica`'s micro-batches of step `step` when `data` replicas share the UNITS micro-batches: the
    same global batch at every data-parallel size."""
    gas = UNITS // data
    return iter([batch(step, replica * gas + m) for m in range(gas)])


class Unpiped(nn.Module):
    """The same layers, built with the PipelineModule's per-layer seeds, as one module whose forward is the loss."""

    def __init__(self, layer_specs, base_seed=1234):
        super().__init__()
        self.layers, self.tied, self.funcs = nn.ModuleDict(), nn.ModuleDict(), []
        for index, spec in enumerate(layer_specs):
            torch.manual_seed(base_seed + index)
            if isinstance(spec, TiedLayerSpec):
                if spec.key not in self.tied:
                    self.tied[spec.key] = spec.build()
                module = self.tied[spec.key]
                self.funcs.append(module if spec.forward_fn is None else (lambda x, m=module, f=spec.forward_fn: f(m, x)))
            else:
                self.layers[str(index)] = spec.build()
                self.funcs.append(self.layers[str(index)])

    def forward(self, pair):
        x, labels = pair
        for func in self.funcs:
            x = func(x)
        return token_loss(x, labels)


def pipe_name(name: str) -> str:
    """The plain module's name of a PipelineModule parameter ("3.norm.weight" -> "layers.3.norm.weight")."""
    return name.replace("tied_modules.", "tied.") if name.startswith("tied_modules.") else f"layers.{name}"


def reference(steps, clip, lr, dtype=torch.float64, body=None):
    """One process, every replica's micro-batches: the mean losses, the gradient norms and the weights."""
    model = Unpiped(specs(body)).to(dtype)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    losses, norms = [], []
    for step in range(steps):
        total = 0.0
        for unit in range(UNITS):
            loss = model(batch(step, unit)) / UNITS
            loss.backward()
            total += loss.item()
        for param in model.parameters():  # an expert no token reached decays as ZeRO's flat buffers decay it
            if param.grad is None:
                param.grad = torch.zeros_like(param)
        norms.append(torch.nn.utils.clip_grad_norm_(model.parameters(), clip if clip else float("inf")).item())
        optimizer.step()
        optimizer.zero_grad()
        losses.append(total)
    return losses, norms, {n: p.detach().clone() for n, p in model.named_parameters()}
