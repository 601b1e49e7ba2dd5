"""Entry point of nanocore-cutlass: registers ``cutlass``."""
from nanocore import hookimpl
from nanocore_cutlass.method import CutlassFp8LinearMethod


@hookimpl
def nanocore_linear_methods():
    return {"cutlass": CutlassFp8LinearMethod}


@hookimpl
def nanocore_env_vars():
    return ["NANOCORE_CUTLASS_DIR"]  # read by this plugin, not an engine field
