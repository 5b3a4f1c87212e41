"""``python -m tolstat.corpus``: list the corpus and time its kernels."""

import sys

from tolstat.corpus import BUGS, OPS, timings


def main(argv=None):
    n = int((argv or sys.argv[1:] or ["24"])[0])
    print(f"{len(OPS)} ops, {len(BUGS)} bugs")
    t = timings(n=n)
    print(f"{'op':<12} {'variants':>8} {'#':>2} {'bugs':>8} {'#':>2} {'ref':>8}  (ms/call)")
    for op, r in t.items():
        nb = sum(b.op == op for b in BUGS.values())
        print(f"{op:<12} {r['variants']:8.3f} {len(OPS[op].variants):2d} {r['bugs']:8.3f} "
              f"{nb:2d} {r['reference']:8.3f}")


if __name__ == "__main__":
    main()
