"""`deepspeed.runtime.data_pipeline.data_routing.helper`: converting a model's layers to random-LTD and back."""

from dsdata import convert_to_random_ltd, remove_random_ltd_state_dict, save_without_random_ltd

__all__ = ["convert_to_random_ltd", "remove_random_ltd_state_dict", "save_without_random_ltd"]
