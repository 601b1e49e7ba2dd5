"""Entry point of nanocore-int8: registers ``int8_w8a8`` and ``int8_w8a16``."""
from nanocore import hookimpl
from nanocore_int8.methods import Int8W8A8LinearMethod, Int8W8A16LinearMethod


@hookimpl
def nanocore_linear_methods():
    return {"int8_w8a8": Int8W8A8LinearMethod, "int8_w8a16": Int8W8A16LinearMethod}
