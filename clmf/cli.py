"""The ``clmf`` command line: devices, demo, source (and the workflow commands)."""
from __future__ import annotations

import argparse
import logging
import sys
import time

import numpy as np

log = logging.getLogger("clmf.cli")


def _add_model_args(p, factors=32, reg=0.05, iterations=10):
    p.add_argument("--factors", "-f", type=int, default=factors, help="latent factors f")
    p.add_argument("--regularization", "--lambda", dest="regularization", type=float, default=reg,
                   help="λ (weighted by the row's rating count unless --unweighted)")
    p.add_argument("--iterations", "-i", type=int, default=iterations)
    p.add_argument("--unweighted", action="store_true", help="plain λ·I instead of λ·n·I")
    p.add_argument("--device", "-d", default="auto", help="auto | cpu | gpu | P:D | name substring")
    p.add_argument("--variant", default="auto", help="kernel variant name or 'auto' (tuned)")
    p.add_argument("--solver", default="auto", choices=["auto", "cholesky", "cg"])
    p.add_argument("--storage", default="float32", choices=["float32", "float16"])
    p.add_argument("--seed", type=int, default=0, help="random_state")


def _model_from(args):
    import clmf
    return clmf.ALS(factors=args.factors, regularization=args.regularization,
                    iterations=args.iterations, weighted_regularization=not args.unweighted,
                    solver=args.solver, variant=args.variant, device=args.device,
                    random_state=args.seed, storage=args.storage)


def cmd_devices(args):
    import clmf
    for d in clmf.devices():
        print(d)
    return 0


def _load_train_test(path, seed, test_fraction=0.1):
    """(train, test, description) from a path or the embedded default."""
    from . import datasets, splits
    if path is None:
        train, test = datasets.default()
        return train, test, "embedded synthetic MovieLens-100K-shaped set (seed 42), 10% held out"
    import os
    if os.path.isdir(path) or os.path.basename(path) in ("ua.base", "ub.base"):
        d = path if os.path.isdir(path) else os.path.dirname(path)
        train, test = datasets.load_movielens_100k_split(d, split="ua")
        return train, test, f"{d} (official ua.base/ua.test split)"
    data = datasets.load(path)
    train, test = splits.random_holdout(data, test_fraction=test_fraction, random_state=seed)
    return train, test, f"{path} ({int(test_fraction * 100)}% random holdout, seed {seed})"


def cmd_demo(args):
    import clmf
    train, test, what = _load_train_test(args.data, args.seed)
    print(f"data: {what}: {train.shape[0]} users × {train.shape[1]} items, "
          f"{len(train)} train / {len(test)} test ratings")
    model = _model_from(args)
    tc = test.to_csr().tocoo()

    def show(it, elapsed, metrics):
        print(f"iteration {it + 1:3d}  train RMSE {metrics['train_rmse']:.4f}  "
              f"test RMSE {metrics['validation_rmse']:.4f}  {metrics['seconds'] * 1000:8.1f} ms")

    t0 = time.perf_counter()
    model.fit(train, validation=test, callback=show, show_progress=False)
    total = time.perf_counter() - t0
    print(f"device: {model.device_}")
    print(f"kernels: users {model.config_['users']}")
    print(f"         items {model.config_['items']}")
    print(f"final test RMSE {model.rmse(test):.4f} after {args.iterations} iterations "
          f"(f={args.factors}, λ={args.regularization}); {total:.2f} s in all")
    return 0


def cmd_source(args):
    from .config import KernelConfig
    from .kernels import render_als
    print(render_als(KernelConfig.parse(args.variant), args.factors))
    return 0


def build_parser():
    p = argparse.ArgumentParser(prog="clmf", description="Autotuned ALS matrix factorization on OpenCL")
    p.add_argument("-v", "--verbose", action="count", default=0)
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("devices", help="list OpenCL devices and the properties the kernels use")
    s.set_defaults(func=cmd_devices)
    s = sub.add_parser("demo", help="fit the embedded default data set (or --data PATH) and print "
                                    "train/test RMSE per iteration")
    s.add_argument("--data", default=None, help="a MovieLens file or directory instead of the "
                                                "embedded synthetic set")
    _add_model_args(s)
    s.set_defaults(func=cmd_demo)
    s = sub.add_parser("source", help="print the rendered OpenCL source of a configuration")
    s.add_argument("variant", nargs="?", default="batch")
    s.add_argument("--factors", "-f", type=int, default=32)
    s.set_defaults(func=cmd_source)
    return p


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=[logging.WARNING, logging.INFO, logging.DEBUG][min(args.verbose, 2)],
                        format="%(levelname)s %(name)s: %(message)s")
    try:
        return args.func(args)
    except (ValueError, TypeError, FileNotFoundError, RuntimeError) as e:
        print(f"clmf {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
