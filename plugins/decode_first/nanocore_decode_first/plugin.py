"""Registers the ``decode_first`` scheduler policy with nanocore (entry point ``nanocore``)."""
from nanocore.hookspecs import hookimpl
from nanocore_decode_first.policy import DecodeFirstPolicy


@hookimpl
def nanocore_scheduler_policies():
    return {"decode_first": DecodeFirstPolicy}
