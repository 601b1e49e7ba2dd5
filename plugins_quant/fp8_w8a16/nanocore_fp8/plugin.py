"""Entry point of nanocore-fp8: registers ``fp8_w8a16`` and ``fp8_w8a8``."""
from nanocore import hookimpl
from nanocore_fp8.methods import Fp8W8A8LinearMethod, Fp8W8A16LinearMethod


@hookimpl
def nanocore_linear_methods():
    return {"fp8_w8a16": Fp8W8A16LinearMethod, "fp8_w8a8": Fp8W8A8LinearMethod}
