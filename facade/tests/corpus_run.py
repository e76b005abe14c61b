"""Run every real DeepSpeed config of the corpus through initialize() and two training steps."""

import copy
import json
import warnings
from pathlib import Path

import torch
from engine_models import TokenDataset, make_model

import dstrain

CORPUS = Path(__file__).resolve().parents[2] / "libs" / "dsconfig" / "tests" / "corpus"
OUTCOMES = Path(__file__).with_name("corpus_outcomes.json")
BATCH_KEYS = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")
# What the Hugging Face Trainer writes over "auto" (from its training arguments); other "auto" keys are dropped.
HF_FILLS = {"lr": 1e-3, "warmup_max_lr": 1e-3, "warmup_min_lr": 0.0, "warmup_num_steps": 2, "total_num_steps": 100,
            "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.0}


def as_a_script_would_run_it(raw: dict, scratch: str) -> dict:
    """What a launcher script does before initialize(): fill the "auto" placeholders (drop them, so the
    defaults apply, as the Hugging Face Trainer fills them), run small batches, and point NVMe paths here."""
    cfg = copy.deepcopy(raw)

    def fix(node):
        if isinstance(node, dict):
            for key in list(node):
                if node[key] == "auto":
                    if key in HF_FILLS:
                        node[key] = HF_FILLS[key]
                    else:
                        del node[key]
                elif key == "nvme_path":
                    node[key] = scratch
                else:
                    fix(node[key])
        elif isinstance(node, list):
            for item in node:
                fix(item)

    fix(cfg)
    for key in BATCH_KEYS:
        cfg.pop(key, None)
    cfg.update(train_micro_batch_size_per_gpu=2, gradient_accumulation_steps=1, steps_per_print=10**6)
    for monitor in ("tensorboard", "csv_monitor", "wandb", "comet"):
        cfg.pop(monitor, None)  # their own tests cover them; here they would only write files
    return cfg


def outcome(name: str, scratch: str) -> str:
    raw = json.loads((CORPUS / name).read_text())
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            actor = raw.get("hybrid_engine", {}).get("enabled") is True  # an RLHF actor: a causal LM that generates
            model = hf_causal_lm() if actor else make_model()
            # Configs without an optimizer section are for scripts that bring their own.
            client = None if "optimizer" in raw else torch.optim.AdamW(model.parameters(), lr=1e-3)
            engine, *_ = dstrain.initialize(model=model, optimizer=client,
                                            config=as_a_script_would_run_it(raw, scratch))
            data = TokenDataset(size=8).data
            for i in range(2):
                batch = data[i * 2:(i + 1) * 2]
                if actor:
                    engine.eval()
                    engine.module.generate(batch[:, :4], max_new_tokens=4, do_sample=False, pad_token_id=0)
                    engine.train()
                engine.backward(engine(input_ids=batch, labels=batch).loss if actor else engine(batch))
                engine.step()
            if not torch.isfinite(torch.tensor(engine.get_global_grad_norm() or 0.0)):
                return "trained (fp16 overflow)"
            engine.destroy()
        return "trained"
    except (dstrain.ConfigError, dstrain.DstrainError) as exc:
        return f"refused: {type(exc).__name__}: {str(exc).splitlines()[-1].strip()}"
    except Exception as exc:  # anything else is a bug the test reports
        return f"CRASH {type(exc).__name__}: {exc}"


def hf_causal_lm() -> torch.nn.Module:
    import transformers

    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=24, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, vocab_size=48, max_position_embeddings=64)
    return transformers.AutoModelForCausalLM.from_config(config)


def run_all(rank, world, names, scratch):
    return {name: outcome(name, f"{scratch}/rank{rank}") for name in names}


def kind(result: str) -> str:
    """"trained", or "refused: <error type>": the part of an outcome the snapshot holds."""
    if result.startswith("trained"):
        return "trained"
    if result.startswith("refused"):
        return ":".join(result.split(":", 2)[:2])
    return result


if __name__ == "__main__":
    from dscomm.testing import run_ranks

    names = sorted(p.name for p in CORPUS.glob("*.json"))
    results = run_ranks(run_all, 2, names, "/tmp/dstrain-corpus-scratch", timeout=600)[0]
    OUTCOMES.write_text(json.dumps({n: kind(r) for n, r in sorted(results.items())}, indent=1) + "\n")
    print(f"wrote {OUTCOMES}: {sum(kind(r) == 'trained' for r in results.values())} of {len(results)} train")
