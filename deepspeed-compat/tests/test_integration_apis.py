"""Every DeepSpeed API the installed transformers and Accelerate integrations reach for, resolved on dstrain;
and what happens when an integration reaches for one dstrain lacks: an error naming the API, the package that
asked and its version, never an AttributeError deep inside it."""

from __future__ import annotations

import ast
import importlib
import importlib.util
from pathlib import Path

import deepspeed
import pytest
import torch

from dscomm.testing import run_ranks

# The modules of each package that talk to DeepSpeed (import it, or reach through `deepspeed.`).
INTEGRATIONS = {
    "transformers": ["integrations/deepspeed.py", "modeling_utils.py", "trainer.py", "training_args.py",
                     "integrations/accelerate.py", "generation/utils.py", "trainer_pt_utils.py"],
    "accelerate": ["accelerator.py", "state.py", "utils/deepspeed.py", "utils/dataclasses.py", "utils/other.py",
                   "commands/launch.py", "utils/launch.py"],
}

# What they reach for that dstrain does not provide; each only on the path of a feature dstrain lacks, where
# the error names the API and who asked (the last test).
NOT_PROVIDED = {
    "deepspeed.ops.adagrad": "DeepSpeed's CPU Adagrad (Accelerate swaps torch's Adagrad for it under optimizer offload)",
    "deepspeed.ops.lion": "DeepSpeed's CPU Lion (bitsandbytes' 32-bit Lion under optimizer offload)",
    "deepspeed.utils:set_z3_leaf_modules": "ZeRO-3 leaf modules (DeepSpeedPlugin.transformer_moe_cls_names, for MoE)",
}


def deepspeed_references(package: str) -> list[tuple[str, str | None, str]]:
    """(module path, name imported from it or None, where) for every `import deepspeed...`, `from deepspeed...
    import name` and `deepspeed.a.b` attribute chain in the package's integration modules."""
    root = Path(importlib.util.find_spec(package).submodule_search_locations[0])
    found = []
    for relative in INTEGRATIONS[package]:
        path = root / relative
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            where = f"{package}/{relative}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, ast.Import):
                found += [(alias.name, None, where) for alias in node.names if alias.name.split(".")[0] == "deepspeed"]
            elif isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] == "deepspeed":
                found += [(node.module, alias.name, where) for alias in node.names]
            elif isinstance(node, ast.Attribute):
                chain, inner = [], node
                while isinstance(inner, ast.Attribute):
                    chain.append(inner.attr)
                    inner = inner.value
                if isinstance(inner, ast.Name) and inner.id == "deepspeed":
                    found.append(("deepspeed." + ".".join(reversed(chain)), "", where))
    return found


def resolves(module: str, name: str | None) -> bool:
    try:
        if name == "":  # an attribute chain from the top
            target = deepspeed
            for part in module.split(".")[1:]:
                target = getattr(target, part)
        else:
            imported = importlib.import_module(module)
            if name is not None:
                getattr(imported, name)
    except (ImportError, AttributeError):
        return False
    return True


@pytest.mark.parametrize("package", sorted(INTEGRATIONS))
def test_every_deepspeed_api_the_integration_reaches_for_resolves_or_is_named_as_missing(package):
    references = deepspeed_references(package)
    assert len(references) > 5, f"no DeepSpeed references found in {package}: has its layout changed?"
    unresolved = {f"{module}:{name}" if name else module: where for module, name, where in references
                  if not resolves(module, name)}
    unknown = {api: where for api, where in unresolved.items()
               if api not in NOT_PROVIDED and api.split(":")[0] not in NOT_PROVIDED}
    assert not unknown, f"{package} reaches for DeepSpeed APIs dstrain lacks: {unknown}"


def test_what_is_listed_as_missing_is_missing():
    for api in NOT_PROVIDED:  # once dstrain provides one, its entry goes
        module, _, name = api.partition(":")
        assert not resolves(module, name or None), f"{api} resolves now: remove it from NOT_PROVIDED"


def test_accelerates_path_to_an_api_dstrain_lacks_names_the_api_and_accelerates_version():
    from importlib.metadata import version

    from accelerate.utils.deepspeed import map_pytorch_optim_to_deepspeed

    optimizer = torch.optim.Adagrad(torch.nn.Linear(2, 2).parameters())
    with pytest.raises(ImportError) as caught:
        map_pytorch_optim_to_deepspeed(optimizer)  # what Accelerate does to torch's Adagrad under offload
    message = str(caught.value)
    assert "deepspeed.ops.adagrad" in message and "no dstrain counterpart" in message
    assert f"accelerate {version('accelerate')} at accelerate/utils/deepspeed.py:" in message


def _asked_by_a_newer_transformers(rank: int, world: int) -> dict[str, str]:
    """A transformers integration module (by its name and file) asking for APIs this dstrain lacks."""
    from transformers import LlamaConfig, LlamaForCausalLM

    import dstrain

    model = LlamaForCausalLM(LlamaConfig(vocab_size=16, hidden_size=8, intermediate_size=16, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1))
    engine, *_ = dstrain.initialize(model=model, config={"train_batch_size": 1, "optimizer": {"type": "SGD",
                                                                                               "params": {"lr": 0.1}}})
    newer = Path(importlib.util.find_spec("transformers").origin).parent / "integrations" / "deepspeed_next.py"
    code = ("import deepspeed\n"
            "def attempt(call):\n"
            "    try:\n        call()\n    except (AttributeError, ImportError) as exc:\n        return str(exc)\n"
            "messages = {'module': attempt(lambda: __import__('deepspeed.runtime.zero.stage_next')),\n"
            "            'name': attempt(lambda: deepspeed.zero_next_init),\n"
            "            'engine': attempt(lambda: engine.consolidated_state_dict_next())}\n")
    scope = {"__name__": "transformers.integrations.deepspeed_next", "engine": engine}
    exec(compile(code, str(newer), "exec"), scope)
    return scope["messages"]


def test_a_newer_transformers_asking_for_what_dstrain_lacks_gets_the_api_and_its_version_named():
    from importlib.metadata import version

    messages = run_ranks(_asked_by_a_newer_transformers, 1, timeout=120)[0]
    asked = f"asked by transformers {version('transformers')} at transformers/integrations/deepspeed_next.py:"
    for kind, api in (("module", "deepspeed.runtime.zero.stage_next"), ("name", "deepspeed.zero_next_init"),
                      ("engine", "engine.consolidated_state_dict_next")):
        assert api in messages[kind] and asked in messages[kind], messages[kind]
        assert "verified with transformers" in messages[kind]
