"""sequence_parallel_size through initialize(): a dimension of the run's layout. The Hugging Face path trains as
one rank on the whole sequence (float64): DeepSpeed's tutorial script on 2 ranks (register_with_transformers'
groups as the mpu, the data-loader adapter, ZeRO-2 over sequence x data), and sp 2 x dp 2 on 4 ranks with the
engine's own loader (the sequence ranks of a replica read the same batches and shard them). The batch size
counts data ranks only; what sequence parallelism is not composed with is refused by key."""

import copy
import warnings

import pytest
import torch

import dscomm
import dsconfig
import dstrain
from dscomm.testing import run_ranks
from dstrain.wiring import dsseq as wiring_dsseq
from dstrain.wiring.layout import data_parallel_size, parallel_dims, requested_degrees

SEQ, VOCAB = 16, 64
SGD = {"type": "SGD", "params": {"lr": 0.1}}
# float64 models; gradients cross the wire in seq_parallel_communication_data_type (fp32 by default, as DeepSpeed)
TOL = 1e-7


def hf_model(seed=0, **extra):
    import transformers

    common = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=64, tie_word_embeddings=False,
                  attn_implementation="sdpa")
    common.update(extra)
    torch.manual_seed(seed)
    return transformers.AutoModelForCausalLM.from_config(transformers.LlamaConfig(**common),
                                                         dtype=torch.float64).train()


@pytest.fixture(autouse=True, scope="module")
def _modeling_code_loaded_before_forking():
    hf_model(num_hidden_layers=1)


def sample(index):
    gen = torch.Generator().manual_seed(500 + index)
    ids = torch.randint(3, VOCAB, (1, SEQ), generator=gen)
    return {"input_ids": ids, "position_ids": torch.arange(SEQ)[None], "labels": ids.clone()}


def whole_loss(model, ids):
    logits = model(input_ids=ids).logits
    return torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), ids[:, 1:].reshape(-1))


def reference_run(steps_of_samples):
    """One rank, whole sequences: each step averages its samples' losses (the data replicas')."""
    model = hf_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for ids_of_step in steps_of_samples:
        per_sample = [whole_loss(model, ids) for ids in ids_of_step]
        loss = sum(per_sample) / len(per_sample)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append([value.item() for value in per_sample])
    return losses, {name: p.detach().clone() for name, p in model.named_parameters()}


# ------------------------------------------------------------------------- DeepSpeed's tutorial, 2 ranks
def tutorial(rank, world, directory):
    import dstrain as deepspeed
    from dstrain.runtime.sequence_parallel.ulysses_sp import UlyssesSPAttentionHF, UlyssesSPDataLoaderAdapter
    from dstrain.utils import groups

    model = hf_model()
    mpu = UlyssesSPAttentionHF.register_with_transformers(model, "sdpa", sequence_parallel_size=2,
                                                          micro_batch_size=1, seq_length=SEQ,
                                                          seq_length_is_variable=False)
    config = {"train_micro_batch_size_per_gpu": 1, "gradient_clipping": 0.0, "steps_per_print": 10_000,
              "zero_optimization": {"stage": 2}, "optimizer": SGD, "sequence_parallel_size": 2}
    engine, *_ = deepspeed.initialize(config=config, model=model, model_parameters=model.parameters(), mpu=mpu)
    sp_group = groups._get_sequence_parallel_group()
    loader = UlyssesSPDataLoaderAdapter([sample(10 * rank + i) for i in range(2)],
                                        sp_rank=groups._get_sequence_parallel_rank(), sp_group=sp_group,
                                        sp_world_size=groups._get_sequence_parallel_world_size(), device=engine.device)
    losses = []
    for batch in loader:
        outputs = engine(input_ids=batch["input_ids"], position_ids=batch["position_ids"])
        shift_labels = batch["shift_labels"]
        loss = model.loss_function(logits=outputs.logits, labels=None, shift_labels=shift_labels,
                                   vocab_size=model.config.vocab_size)  # this rank's mean
        # DeepSpeed's tutorial: the differentiable, token-weighted mean over the sequence ranks
        losses_per_rank = torch.distributed.nn.functional.all_gather(loss, group=sp_group)
        good = (shift_labels != -100).view(-1).sum()
        good_per_rank = torch.distributed.nn.functional.all_gather(good, group=sp_group)
        loss = sum(losses_per_rank[r] * good_per_rank[r] for r in range(2)) / max(sum(good_per_rank), 1)
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    from dstrain.runtime.sequence_parallel import parallel_state_sp  # DeepSpeed's module-level state

    layout = (engine.dp_world_size, engine.seq_dp_world_size, engine.train_batch_size(),
              engine.optimizer.process_group is mpu.sequence_data, dscomm.groups.current() is mpu,
              engine.get_sequence_parallel_group() is sp_group,
              parallel_state_sp.get_model_parallel_group() is sp_group
              and parallel_state_sp.get_sequence_data_parallel_world_size() == 2)
    # A checkpoint of ZeRO's sequence x data shards reloads into a fresh engine of the same layout.
    engine.save_checkpoint(directory, tag="sp")
    fresh = hf_model(seed=1)
    reloaded, *_ = deepspeed.initialize(config=config, model=fresh, model_parameters=fresh.parameters(), mpu=mpu)
    reloaded.load_checkpoint(directory, tag="sp")
    same = all(torch.equal(a, b) for a, b in zip(model.parameters(), fresh.parameters(), strict=True))
    return losses, {name: p.detach().clone() for name, p in model.named_parameters()}, (*layout, same)


def test_deepspeeds_tutorial_trains_as_one_rank_on_the_whole_sequence(tmp_path):
    results = run_ranks(tutorial, 2, str(tmp_path), timeout=240)
    # The adapter serves rank 0's first sample, rank 1's first, then both ranks' second: one per step.
    order = [[sample(0)["input_ids"]], [sample(10)["input_ids"]], [sample(1)["input_ids"]], [sample(11)["input_ids"]]]
    ref_losses, ref_params = reference_run(order)
    for losses, params, layout in results:
        # one data replica of two sequence ranks: the batch counts it once; ZeRO spans both ranks
        assert layout == (1, 2, 1, True, True, True, True, True)
        # HF's loss upcasts float64 logits to float32: the per-rank means round there
        assert max(abs(a - b[0]) for a, b in zip(losses, ref_losses)) < 1e-6
        assert max((params[n] - ref_params[n]).abs().max().item() for n in params) < 1e-6


# ------------------------------------------------------------------ sp 2 x dp 2 with the engine's loader
class Samples(torch.utils.data.Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, index):
        return sample(index)["input_ids"][0]


def tiled_mlp_forward(self, x):
    """DeepSpeed's documented patch of LlamaMLP.forward: the MLP in tiles of the sequence (dsseq.TiledMLP)."""
    import dsseq

    def mlp(module, tile):
        return module.down_proj(module.act_fn(module.gate_proj(tile)) * module.up_proj(tile))

    return dsseq.TiledMLP.apply(mlp, self, x, 3, [self.gate_proj.weight, self.up_proj.weight, self.down_proj.weight])


def tiled_loss(engine, piece, group):
    """The whole sequence's mean loss from lm_head and cross-entropy in tiles (dsseq.TiledFusedLogitsLoss):
    no rank holds its slice's whole logits."""
    import dsseq

    hidden = engine.module.model(input_ids=piece["input_ids"], position_ids=piece["position_ids"]).last_hidden_state

    def head_and_loss(lm_head, rows, labels):
        return torch.nn.functional.cross_entropy(lm_head(rows), labels, ignore_index=-100, reduction="sum")

    labels = piece["shift_labels"]
    token_sum = dsseq.TiledFusedLogitsLoss.apply(head_and_loss, engine.module.lm_head, hidden, labels, None, 3,
                                                 [engine.module.lm_head.weight], "sum")
    count = (labels != -100).sum().to(token_sum.dtype)
    dscomm.all_reduce(count, group=group)
    return dsseq.sum_over_ranks(token_sum, group) / count


def sp_by_dp(rank, world, stage, tiled):
    import dsseq

    if tiled:  # in this rank's process only: the reference (the test's process) runs the plain MLP
        from transformers.models.llama import modeling_llama

        modeling_llama.LlamaMLP.forward = tiled_mlp_forward
    model = hf_model()
    mpu = dsseq.UlyssesSPAttentionHF.register_with_transformers(model, "sdpa", 2, micro_batch_size=1)
    config = {"train_batch_size": 2, "gradient_clipping": 0.0, "steps_per_print": 10_000,
              "zero_optimization": {"stage": stage}, "optimizer": SGD, "sequence_parallel_size": 2}
    engine, _, loader, _ = dstrain.initialize(config=config, model=model, mpu=mpu, training_data=Samples())
    groups = dscomm.groups.current()
    sp, sp_rank = groups.size("sequence"), groups.rank_in("sequence")
    seen, losses = [], []
    for _, ids in zip(range(2), loader):
        piece = dsseq.shard_batch({"input_ids": ids, "position_ids": torch.arange(SEQ)[None].expand_as(ids),
                                   "labels": ids}, sp_rank, sp)
        if tiled:
            loss = tiled_loss(engine, piece, groups.sequence)
        else:
            logits = engine(input_ids=piece["input_ids"], position_ids=piece["position_ids"]).logits
            loss = dsseq.sequence_parallel_loss(logits, piece["shift_labels"], groups.sequence)
        engine.backward(loss)
        engine.step()
        whole = [torch.empty_like(ids) for _ in range(world)]
        dscomm.all_gather(whole, ids)
        seen.append([w for w in whole[::sp]])  # one per data replica
        losses.append(loss.item())
    params = {name: p.detach().clone() for name, p in model.named_parameters()}
    if stage == 3:
        import dszero

        params = {name: dszero.safe_get_full_fp32_param(p).clone() for name, p in model.named_parameters()}
    same_batch = torch.equal(seen[0][0], seen[0][0]) and all(len(s) == 2 for s in seen)
    return seen, losses, params, (engine.dp_world_size, engine.train_batch_size(), same_batch,
                                  engine.global_samples)


@pytest.mark.parametrize(("stage", "tiled"), [(1, False), (3, True)])
def test_sp2_by_dp2_trains_as_one_rank_on_the_whole_sequence(stage, tiled):
    """ZeRO-3 with DeepSpeed's tiled MLP and tiled logits loss: each weight's gradient still arrives once."""
    results = run_ranks(sp_by_dp, 4, stage, tiled, timeout=300)
    seen = results[0][0]
    assert all(r[0][i][j].tolist() == seen[i][j].tolist() for r in results for i in range(2) for j in range(2))
    assert seen[0][0].tolist() != seen[0][1].tolist()  # the two replicas read different samples
    ref_losses, ref_params = reference_run([[ids for ids in step] for step in seen])
    for rank, (_, losses, params, layout) in enumerate(results):
        assert layout == (2, 2, True, 4)  # data replicas, the batch, both steps' samples counted once per replica
        replica = rank // 2
        assert max(abs(a - b[replica]) for a, b in zip(losses, ref_losses)) < TOL
        assert max((params[n] - ref_params[n]).abs().max().item() for n in params) < TOL


# ------------------------------------------------------------------------------------- pure layout rules
def _degrees(**extra):
    return requested_degrees(dsconfig.load({"train_batch_size": 8, **extra}, world_size=1))


def test_the_batch_counts_data_ranks_only():
    degrees = _degrees(sequence_parallel_size=2)
    assert degrees["sequence_parallel_size"] == 2 and data_parallel_size(degrees, 8) == 4
    cfg = dsconfig.load({"train_micro_batch_size_per_gpu": 2, "sequence_parallel_size": 2},
                        world_size=data_parallel_size(degrees, 8))
    assert cfg.train_batch_size == 8  # micro 2 x data 4, not x 8 ranks
    dims = parallel_dims(degrees, 8)
    assert (dims.sequence, dims.data) == (2, 4) and dims.partition("sequence")[0] == [0, 1]


@pytest.mark.parametrize(("extra", "world", "message"), [
    ({"sequence_parallel_size": 3}, 4, "world 4 is not a multiple of pipe 1 x tensor 1 x sequence 3"),
    ({"sequence_parallel_size": 2, "tensor_parallel": {"autotp_size": 2}}, 4,
     "is not composed with tensor_parallel.autotp_size (2)"),
    ({"sequence_parallel_size": 2, "pipeline": {"stages": 2}}, 4, "is not composed with pipeline.stages (2)"),
])
def test_impossible_or_uncomposed_layouts_are_refused_by_key(extra, world, message):
    with pytest.raises((dstrain.ConfigError, dstrain.UnsupportedFeatureError)) as caught:
        parallel_dims(_degrees(**extra), world)
    assert "sequence_parallel_size" in str(caught.value) and message in str(caught.value)


@pytest.mark.parametrize(("extra", "key"), [
    ({"expert_parallel": {"enabled": True, "autoep_size": 1}}, "expert_parallel.enabled"),
    ({"data_efficiency": {"enabled": True}}, "data_efficiency.enabled"),
])
def test_features_sequence_parallelism_is_not_composed_with_are_refused_by_key(extra, key):
    cfg = dsconfig.load({"train_batch_size": 8, "sequence_parallel_size": 2, **extra}, world_size=1)
    with pytest.raises(dstrain.UnsupportedFeatureError) as caught:
        wiring_dsseq.check_composition(cfg, torch.nn.Linear(2, 2))
    assert "sequence_parallel_size" in str(caught.value) and key in str(caught.value)


def test_gradients_go_over_the_wire_in_the_sequence_parallel_dtype():
    cfg = dsconfig.load({"train_batch_size": 8, "sequence_parallel_size": 2, "communication_data_type": "bf16"},
                        world_size=1)
    with pytest.warns(UserWarning, match="seq_parallel_communication_data_type"):
        assert wiring_dsseq.with_sequence_settings(cfg, 2).communication_data_type == "fp32"  # DeepSpeed's default
    cfg = dsconfig.load({"train_batch_size": 8, "seq_parallel_communication_data_type": "bf16"}, world_size=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert wiring_dsseq.with_sequence_settings(cfg, 2).communication_data_type == "bf16"
        assert wiring_dsseq.with_sequence_settings(cfg, 1) is cfg  # off: communication_data_type as given


class SequenceMpu:
    """DeepSpeed's parallel_state_sp as a script holds it: sequence getters, "model parallel" aliasing them."""

    def get_sequence_parallel_world_size(self):
        return 2

    get_model_parallel_world_size = get_sequence_parallel_world_size


def test_an_mpu_and_the_config_must_agree_on_the_sequence_size():
    assert wiring_dsseq.is_sequence_mpu(SequenceMpu())
    assert wiring_dsseq.mpu_sequence_size(SequenceMpu(), 1) == 2  # the config may leave it to the mpu
    with pytest.raises(dstrain.ConfigError, match=r"sequence_parallel_size = 4: differs from the mpu's sequence-parallel "
                                                  r"size 2"):
        wiring_dsseq.mpu_sequence_size(SequenceMpu(), 4)


def refused_end_to_end(rank, world):
    config = {"train_micro_batch_size_per_gpu": 1, "optimizer": SGD, "sequence_parallel_size": 4}
    try:
        dstrain.initialize(config=config, model=copy.deepcopy(torch.nn.Linear(2, 2)))
    except dstrain.ConfigError as exc:
        return str(exc)
    return ""


def test_a_size_the_world_cannot_hold_is_refused_at_initialize():
    message = run_ranks(refused_end_to_end, 2, timeout=90)[0]
    assert "sequence_parallel_size" in message and "world 2 is not a multiple of" in message
