"""``python -m tests.fuzz N --seed S --mutants M --quantized Q --out DIR``: N random graphs at every -O
level, Q random int8 models (default N/4) and M malformed files and tampered artifacts; a summary,
failures saved (graphs minimized) under DIR. Exit status 1 when anything failed. ``--replay DIR/TAG``
runs one saved graph again."""
from __future__ import annotations

import argparse
import os
import sys
import time


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.fuzz", description=__doc__.split("\n")[0])
    p.add_argument("n", type=int, nargs="?", default=200, help="random graphs (default 200)")
    p.add_argument("--seed", type=int, default=None, help="the stream of graphs and mutants (default: the time)")
    p.add_argument("--mutants", type=int, default=None, help="malformed files and tampered artifacts (default N)")
    p.add_argument("--quantized", type=int, default=None,
                   help="random int8 models, the artifact against the reference on the quantized IR (default N/4)")
    p.add_argument("--out", default=os.path.join("tests", "fuzz", "failures"),
                   help="where failures are saved (default tests/fuzz/failures)")
    p.add_argument("--levels", default="0,1,2,3", help="-O levels (default 0,1,2,3)")
    p.add_argument("--batch", type=int, default=8,
                   help="random graphs compiled side by side as one model (default 8; a batch with any "
                        "failure is checked graph by graph)")
    p.add_argument("--first", type=int, default=0, help="start at graph FIRST of the stream (resume a run)")
    p.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds before a compile+run is a hang")
    p.add_argument("--mem-limit", type=float, default=6.0,
                   help="address-space limit of each worker in GiB (default 6; 0: none)")
    p.add_argument("--no-minimize", action="store_true", help="save failures as found")
    p.add_argument("--cli-every", type=int, default=10, help="run `kiln run` on every k-th mutant (0: never)")
    p.add_argument("--replay", metavar="DIR", help="run a saved case (DIR/model.onnx, DIR/feeds.npz) again")
    args = p.parse_args(argv)

    from .harness import Diff, replay
    from .pool import Pool

    levels = [int(x) for x in args.levels.split(",") if x.strip()]
    with Pool(args.workers, mem_limit=int(args.mem_limit * (1 << 30))) as pool:
        if args.replay:
            print(replay(pool, args.replay, levels))
            return 0
        seed = args.seed if args.seed is not None else int(time.time()) % 100000
        mutants = args.n if args.mutants is None else args.mutants
        int8 = args.n // 4 if args.quantized is None else args.quantized
        os.makedirs(args.out, exist_ok=True)
        t0 = time.perf_counter()
        print(f"kiln fuzz: {args.n} graphs x -O{args.levels}, {int8} int8 models and {mutants} mutants, seed {seed}, "
              f"{args.workers} workers; failures go to {args.out}", flush=True)
        reports = []
        if args.n:
            d = Diff(pool, args.out, levels, args.timeout, not args.no_minimize,
                     log=lambda s: print(s, flush=True))
            reports.append(d.run(args.n, seed, batch=max(1, args.batch), first=args.first))
            print(reports[-1].text(), flush=True)
        if int8:
            from .quantized import run as run_quantized

            reports.append(run_quantized(pool, int8, seed, args.out, timeout=max(args.timeout, 120.0),
                                         log=lambda s: print(s, flush=True)))
            print(reports[-1].text(), flush=True)
        if mutants:
            from .mutate import Mutants

            m = Mutants(pool, args.out, timeout=args.timeout, cli_every=args.cli_every,
                        log=lambda s: print(s, flush=True))
            reports.append(m.run(mutants, seed))
            print(reports[-1].text(), flush=True)
        failed = sum(r.failed for r in reports)
        print(f"\nkiln fuzz: seed {seed}: {failed} failure(s) in {time.perf_counter() - t0:.0f} s "
              f"({pool.restarts} worker restarts); rerun with --seed {seed}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
