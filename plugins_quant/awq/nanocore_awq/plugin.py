"""Entry point of nanocore-awq: registers ``awq`` and ``wna16``."""
from nanocore import hookimpl
from nanocore_awq.method import AWQLinearMethod
from nanocore_awq.wna16 import WNA16LinearMethod


@hookimpl
def nanocore_linear_methods():
    return {"awq": AWQLinearMethod, "wna16": WNA16LinearMethod}
