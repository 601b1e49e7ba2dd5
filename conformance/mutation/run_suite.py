"""Runs the conformance tests against one mutant: pytest, stopping at the first failure, with hypothesis
derandomized and without its example database, so a kill replays and does not depend on earlier mutants, and
without shrinking, which only makes a found failure smaller (slowly) and never turns a kill into a survivor."""
from __future__ import annotations

import sys

import pytest
from hypothesis import Phase, settings


def main(argv: list[str]) -> int:
    settings.register_profile("mutation", derandomize=True, database=None,
                              phases=[Phase.explicit, Phase.generate, Phase.target])
    settings.load_profile("mutation")  # before pytest imports the suite, whose settings inherit this profile
    return int(pytest.main(["-x", "-q", "-p", "no:cacheprovider", *argv]))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
