#!/usr/bin/env python3
"""Compares `fl privacy epsilon|delta --accountant pld --json` with the `pld_poisson` columns of
the dp_accounting reference tables (privacy/tests/data/dp), row by row, and prints the largest
relative deviations. The test `cargo test -p fl-privacy --test reference_dp` checks the same rows
to 2%; this script reports the figures through the command users run.

Usage: scripts/pld-reference.py [path to the fl binary, default target/release/fl]
"""

import csv
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FL = sys.argv[1] if len(sys.argv) > 1 else str(ROOT / "target/release/fl")
DATA = ROOT / "privacy/tests/data/dp"


def ask(question, row, extra):
    args = [FL, "privacy", question, "--q", row["q"], "--sigma", row["sigma"],
            "--rounds", row["steps"], "--accountant", "pld", "--json", *extra]
    return json.loads(subprocess.run(args, check=True, capture_output=True, text=True).stdout)


def main():
    worst = []
    for row in csv.DictReader(open(DATA / "epsilon.csv")):
        ours = ask("epsilon", row, ["--delta", row["delta"]])["epsilon"]
        ref = float(row["eps_pld_poisson"])
        worst.append(((ours - ref) / ref, "epsilon", row, ours, ref))
    floor = 0
    for row in csv.DictReader(open(DATA / "delta.csv")):
        ref = float(row["delta_pld_poisson"])
        ours = ask("delta", row, ["--eps", row["eps"]])["delta"]
        if ref < 1e-12:
            floor += 1
            continue
        worst.append(((ours - ref) / ref, "delta", row, ours, ref))
    rel = [w[0] for w in worst]
    print(f"{len(worst)} rows compared ({floor} delta rows below 1e-12 skipped: the floor)")
    print(f"relative deviation: min {min(rel):+.4%}, max {max(rel):+.4%}")
    for w in sorted(worst, key=lambda w: -abs(w[0]))[:5]:
        r = w[2]
        print(f"  {w[1]} q={r['q']} sigma={r['sigma']} steps={r['steps']}: "
              f"ours {w[3]:.6g}, reference {w[4]:.6g} ({w[0]:+.4%})")


if __name__ == "__main__":
    main()
