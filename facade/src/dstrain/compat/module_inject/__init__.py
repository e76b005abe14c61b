"""`deepspeed.module_inject`: only AutoEP's layer module, `auto_ep_layer` (dsmoe's AutoEP). DeepSpeed's inference
kernel injection (the policies, `replace_transformer_layer`, AutoTP's inference layers) is not part of dstrain:
those names raise an AttributeError that says so."""


def __getattr__(name: str):
    if name == "auto_ep_layer":
        from . import auto_ep_layer

        return auto_ep_layer
    if name.startswith("__"):
        raise AttributeError(f"module 'deepspeed.module_inject' has no attribute {name!r}")
    from ..callers import missing

    raise AttributeError(f"module 'deepspeed.module_inject' has no attribute {name!r}: "
                         f"{missing(f'deepspeed.module_inject.{name}')}")
