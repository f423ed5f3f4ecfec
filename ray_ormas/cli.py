"""`ray-ormas`: the command line. `ray-ormas demo` runs the digits demo on a local Ray cluster.

Exit codes: 0 success, 1 training failed, 2 usage error (argparse's own).
"""
from __future__ import annotations

import argparse
import sys
from typing import Sequence


def _parser() -> argparse.ArgumentParser:
    from . import __version__
    p = argparse.ArgumentParser(prog="ray-ormas", description="Ray Train with ormas-monitor on every rank.")
    p.add_argument("--version", action="version", version=f"ray-ormas {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    d = sub.add_parser("demo", help="digits CNN on 2 local Ray workers (DDP): healthy, dead layers watched, repaired")
    d.add_argument("--out", default="ray_ormas_demo", help="run storage folder (default: %(default)s)")
    d.add_argument("--epochs", type=int, default=12, help="training epochs per run (default: %(default)s)")
    d.add_argument("--workers", type=int, default=2, help="Ray Train workers (default: %(default)s)")
    d.add_argument("--check-every", type=int, default=10, help="steps between monitor checks (default: %(default)s)")
    d.add_argument("--seed", type=int, default=0)
    d.add_argument("--verbose", action="store_true", help="show the workers' logs and the monitor's events")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "demo":
        from . import demo
        try:
            demo.run(out=args.out, epochs=args.epochs, workers=args.workers, check_every=args.check_every,
                     seed=args.seed, verbose=args.verbose)
        except Exception as e:
            print(f"ray-ormas demo failed: {type(e).__name__}: {e}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
