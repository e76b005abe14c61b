"""The event names DeepSpeed's engine writes, as the config reference lists them.

An event is a `(name, value, step)` tuple; `step` counts samples for the `Train/Samples/` events.
"""

TRAIN_LOSS = "Train/Samples/train_loss"
EVAL_LOSS = "Train/Samples/eval_loss"
LR = "Train/Samples/lr"
LOSS_SCALE = "Train/Samples/loss_scale"  # only with fp16
ELAPSED_FORWARD = "Train/Samples/elapsed_time_ms_forward"
ELAPSED_BACKWARD = "Train/Samples/elapsed_time_ms_backward"
ELAPSED_BACKWARD_INNER = "Train/Samples/elapsed_time_ms_backward_inner"
ELAPSED_BACKWARD_ALLREDUCE = "Train/Samples/elapsed_time_ms_backward_allreduce"
ELAPSED_STEP = "Train/Samples/elapsed_time_ms_step"

# The timer names of the wall-clock breakdown, in the order the engine logs them, each with the
# event that carries its time (timer names as DeepSpeed's engine spells them).
FORWARD_GLOBAL_TIMER = "fwd"
BACKWARD_GLOBAL_TIMER = "bwd"
BACKWARD_INNER_GLOBAL_TIMER = "bwd_inner"
BACKWARD_REDUCE_GLOBAL_TIMER = "bwd_allreduce"
STEP_GLOBAL_TIMER = "step"
BREAKDOWN_EVENTS = {
    FORWARD_GLOBAL_TIMER: ELAPSED_FORWARD,
    BACKWARD_GLOBAL_TIMER: ELAPSED_BACKWARD,
    BACKWARD_INNER_GLOBAL_TIMER: ELAPSED_BACKWARD_INNER,
    BACKWARD_REDUCE_GLOBAL_TIMER: ELAPSED_BACKWARD_ALLREDUCE,
    STEP_GLOBAL_TIMER: ELAPSED_STEP,
}
