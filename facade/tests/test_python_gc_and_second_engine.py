"""disable_python_gc (an initial collection; automatic collection back only when the last engine that asked
for it is destroyed) and a second initialize() in one process taking its own activation_checkpointing."""

import gc
import weakref

from engine_models import ADAMW, config, make_model

import dscomm
import dstrain
from dscomm.testing import run_ranks


class Cycle:
    def __init__(self):
        self.me = self


def _engine(**extra):
    engine, *_ = dstrain.initialize(model=make_model(), config=config(optimizer=ADAMW, **extra))
    return engine


def gc_lifetime(rank, world):
    gc.enable()
    thresholds = gc.get_threshold()
    gc.set_threshold(0)  # no automatic pass: only an explicit collection can free the cycle
    garbage = Cycle()
    freed = weakref.ref(garbage)
    del garbage
    first = _engine(disable_python_gc=True)
    gc.set_threshold(*thresholds)
    seen = {"collected_at_init": freed() is None, "off_with_one": not gc.isenabled()}
    second = _engine(disable_python_gc=True)
    plain = _engine()  # does not touch the collector
    first.destroy()
    seen["off_while_another_holds"] = not gc.isenabled()
    plain.destroy()
    second.destroy()
    seen["back_after_the_last"] = gc.isenabled()
    gc.disable()  # a process that had it off keeps it off
    third = _engine(disable_python_gc=True)
    third.destroy()
    seen["restores_the_original_state"] = not gc.isenabled()
    gc.enable()
    return seen


def test_disable_python_gc_collects_once_and_holds_the_collector_until_the_last_engine():
    assert run_ranks(gc_lifetime, 1)[0] == {"collected_at_init": True, "off_with_one": True,
                                             "off_while_another_holds": True, "back_after_the_last": True,
                                             "restores_the_original_state": True}


def second_engine_settings(rank, world):
    _engine(activation_checkpointing={"cpu_checkpointing": True})
    first = dscomm.checkpointing._settings.cpu_checkpointing
    _engine(activation_checkpointing={"profile": True})
    settings = dscomm.checkpointing._settings
    return first, settings.cpu_checkpointing, settings.profile


def test_a_second_initialize_takes_its_own_activation_checkpointing_section():
    assert run_ranks(second_engine_settings, 1)[0] == (True, False, True)
