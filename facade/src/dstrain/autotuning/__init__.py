"""dstrain.autotuning: DeepSpeed's autotuner. `dstrain --autotuning tune|run script.py --deepspeed_config ds.json`
finds the fastest ZeRO stage, micro-batch size and (unless `fast`) ZeRO knobs for a script by short real
runs of it, as the config's `autotuning` section asks, and writes them out as DeepSpeed does.

The search is pure and tested without processes: `space` (points, knobs), `batches` (the batch
triple and its limits), `memory` (dszero's estimators), `tuners` and `cost_model` (the order of the
experiments and when to stop), `ranking` (the metric), `search` (stages, memory probe, exploration).
`experiments` runs one point through the launcher; `engine_metrics` is the engine's side of it;
`outputs` writes the summary, the CSV and ds_config_optimal.json; `command` is the launcher's flag.
See facade/docs/autotuning.md.
"""

from .batches import BatchLimits, tuning_micro_batches
from .errors import AutotuningError
from .ranking import METRICS, better, ranked, score
from .space import DEFAULT_KNOBS, Point, features, knob_dimensions, parse_stages, stage_points
from .tuners import TUNERS, Exploration, Trial, explore

__all__ = [
    "DEFAULT_KNOBS",
    "METRICS",
    "TUNERS",
    "AutotuningError",
    "BatchLimits",
    "Exploration",
    "Point",
    "Trial",
    "better",
    "explore",
    "features",
    "knob_dimensions",
    "parse_stages",
    "ranked",
    "score",
    "stage_points",
    "tuning_micro_batches",
]
