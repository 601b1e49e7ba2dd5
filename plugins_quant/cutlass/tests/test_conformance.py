"""The shared linear-method conformance suite. On CPU ``cutlass`` runs its torch twin (see the README);
the ``cuda``-marked checks of the suite run the CUTLASS kernel on an sm_90 GPU."""
from nanocore_conformance import LinearMethodConformance


class TestCutlass(LinearMethodConformance):
    backend = "cutlass"
