"""DeepSpeed's Pipeline Parallelism tutorial, in small: a model flattened into a sequence of layers,
wrapped in PipelineModule, trained with engine.train_batch(). Only deepspeed.* names are used (the
test swaps the import for `import dstrain as deepspeed`)."""

import argparse
import json
import os

import deepspeed
import torch
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--local_rank", type=int, default=-1)
parser.add_argument("--steps", type=int, default=6)
parser.add_argument("--out", required=True)
parser = deepspeed.add_config_arguments(parser)
args = parser.parse_args()

deepspeed.init_distributed()
torch.manual_seed(0)


def join_layers(features, classifier):
    # The tutorial's AlexNet becomes one flat list: the features, a function that flattens, the classifier.
    return [*features, lambda x: torch.flatten(x, 1), *classifier]


features = [nn.Conv2d(3, 8, kernel_size=3, padding=1), nn.ReLU(inplace=True), nn.MaxPool2d(2)]
classifier = [deepspeed.pipe.LayerSpec(nn.Linear, 8 * 4 * 4, 32), nn.ReLU(inplace=True),
              deepspeed.pipe.LayerSpec(nn.Linear, 32, 10)]
net = deepspeed.pipe.PipelineModule(layers=join_layers(features, classifier), loss_fn=nn.CrossEntropyLoss(),
                                    num_stages=2, partition_method="parameters")

gen = torch.Generator().manual_seed(0)
images = torch.randn(256, 3, 8, 8, generator=gen)
labels = (images.mean(dim=(1, 2, 3)) > 0).long() + 2 * (images[:, 0].mean(dim=(1, 2)) > 0).long()
trainset = list(zip(images, labels, strict=True))

engine, _, _, _ = deepspeed.initialize(args=args, model=net,
                                       model_parameters=[p for p in net.parameters() if p.requires_grad],
                                       training_data=trainset)
losses = [engine.train_batch().item() for _ in range(args.steps)]  # the loader built from training_data

# The tutorial's other form: an iterator the script gives.
loader = torch.utils.data.DataLoader(trainset, batch_size=engine.train_micro_batch_size_per_gpu())
eval_loss = engine.eval_batch(iter(deepspeed.utils.RepeatingLoader(loader))).item()
losses.append(engine.train_batch(data_iter=iter(deepspeed.utils.RepeatingLoader(loader))).item())

if engine.global_rank == 0:
    with open(os.path.join(args.out, "result.json"), "w") as handle:
        json.dump({"losses": losses, "eval_loss": eval_loss, "steps": engine.global_steps,
                   "stage": engine.stage_id, "first": engine.is_first_stage(), "schedule": engine.schedule,
                   "partitions": net.partitions()}, handle)
