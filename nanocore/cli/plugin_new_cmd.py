"""``nanocore plugin new NAME --kind KIND [--dir DIR]``: write a ready plugin distribution to start from."""
from __future__ import annotations

from nanocore.interfaces import KINDS


def register(subparsers) -> None:
    p = subparsers.add_parser("plugin", help="plugin authoring tools ('nanocore plugin new')")
    actions = p.add_subparsers(dest="plugin_action", metavar="ACTION", required=True)
    new = actions.add_parser("new", help="write a plugin distribution with a stub backend and its conformance test")
    new.add_argument("name", help="backend name users will select, e.g. my_awq")
    new.add_argument("--kind", required=True, choices=list(KINDS), help="extension point the backend implements")
    new.add_argument("--dir", default=None, help="the distribution folder to create (default: ./nanocore-NAME); "
                     "'pip install -e DIR' then installs it")
    new.set_defaults(func=run_new)


def run_new(args) -> int:
    from nanocore.scaffold import write_plugin

    root = write_plugin(args.name, args.kind, args.dir)
    package = f"nanocore_{args.name}"
    print(f"wrote {root}\n  next: pip install -e '{root}[test]' && pytest {root}\n"
          f"  then replace the methods marked STUB in {root / package / 'backend.py'} (its README says what each does)")
    return 0
