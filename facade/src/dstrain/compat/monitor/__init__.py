"""`deepspeed.monitor.*`: DeepSpeed's monitor submodules, each the dsmonitor class of that name.

`deepspeed.monitor` itself is dsmonitor; these modules give DeepSpeed's file layout (`deepspeed.monitor.tensorboard`,
`.wandb`, `.csv_monitor`, `.comet`, `.monitor`, `.config`) over it.
"""
