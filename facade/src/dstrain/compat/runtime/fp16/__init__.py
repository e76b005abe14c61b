"""`deepspeed.runtime.fp16`: the kinds of optimizer fp16 at ZeRO stage 0 trains with (see optimizer_kinds)."""
