"""``python -m nanocore ...`` (and ``torchrun ... -m nanocore serve|generate ...``): the ``nanocore`` command."""
import sys

from nanocore.cli.main import main

if __name__ == "__main__":  # spawned workers re-import this module as __mp_main__
    sys.exit(main())
