"""P:D rebalances in the controller: the role-flip state machine (`machine`, pure) and its data (`state`).
The store side is rebalances.py; the reconciler that steps every active rebalance is rebalance_reconciler.py.
"""
