"""Entry point of nanocore-awq: registers ``awq``."""
from nanocore import hookimpl
from nanocore_awq.method import AWQLinearMethod


@hookimpl
def nanocore_linear_methods():
    return {"awq": AWQLinearMethod}
