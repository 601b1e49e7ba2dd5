"""``nanocore conformance [--kind K] [--name N] [pytest args...]``: the shared suite for installed backends."""
from __future__ import annotations

import importlib.util
import os

from nanocore.interfaces import KINDS


def register(subparsers) -> None:
    p = subparsers.add_parser("conformance", help="run the conformance suite for installed backends",
                              description="Runs nanocore_conformance for every installed backend (or those selected); "
                                          "extra arguments go to pytest, e.g. -x or -k apply.")
    p.add_argument("--kind", choices=list(KINDS), help="only backends of this kind")
    p.add_argument("--name", help="only the backend (or failed plugin) with this name or 'distribution:name'")
    p.add_argument("pytest_args", nargs="*", help="passed to pytest (put them after --)")
    p.set_defaults(func=run)


def run(args) -> int:
    try:
        import pytest

        # located, not imported: the suite generates its classes at import, after the filters are set
        suite = importlib.util.find_spec("nanocore_conformance.installed_suite")
    except ImportError as exc:
        raise RuntimeError(f"the conformance suite is not installed ({exc}); pip install nanocore-conformance "
                           f"(in this repository: pip install -e conformance)") from None
    os.environ.pop("NANOCORE_CONFORMANCE_KIND", None)
    os.environ.pop("NANOCORE_CONFORMANCE_NAME", None)
    if args.kind:
        os.environ["NANOCORE_CONFORMANCE_KIND"] = args.kind
    if args.name:
        os.environ["NANOCORE_CONFORMANCE_NAME"] = args.name
    # the suite file lives in the package; -p no:cacheprovider keeps it from writing caches next to it
    code = pytest.main([suite.origin, "-p", "no:cacheprovider", "-q",
                        "-W", "ignore::pytest.PytestAssertRewriteWarning", *args.pytest_args])
    if code == pytest.ExitCode.NO_TESTS_COLLECTED:
        raise ValueError(f"no installed backend matches --kind {args.kind} --name {args.name}; "
                         f"see 'nanocore plugins'")
    return int(code)
