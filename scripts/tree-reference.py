#!/usr/bin/env python3
"""Reference epsilons of tree aggregation (DP-FTRL) from Google's dp_accounting, for
privacy/tests/data/tree_rdp.csv (read by fl-privacy's tree accounting test).

    python3 -m venv /tmp/dp && /tmp/dp/bin/pip install dp-accounting==0.6.0
    /tmp/dp/bin/python scripts/tree-reference.py > privacy/tests/data/tree_rdp.csv

Each row: `trees` trees of `steps` rounds each, a client at most once per tree, so the trees
compose (SelfComposedDpEvent); RDP accountant under REPLACE_SPECIAL neighbours, which
dp_accounting requires for tree aggregation.
"""
import dp_accounting
from dp_accounting.rdp import rdp_privacy_accountant as rdp

print("noise_multiplier,steps,trees,delta,epsilon")
for z in (0.5, 1.0, 2.0, 5.0, 10.0):
    for steps, trees in ((1, 1), (7, 1), (100, 1), (1000, 1), (10, 12), (50, 4), (333, 3)):
        for delta in (1e-5,):
            acc = rdp.RdpAccountant(
                neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_SPECIAL
            )
            event = dp_accounting.SingleEpochTreeAggregationDpEvent(z, steps)
            acc.compose(dp_accounting.SelfComposedDpEvent(event, trees))
            print(f"{z},{steps},{trees},{delta},{acc.get_epsilon(delta):.10g}")
