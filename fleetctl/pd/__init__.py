"""Prefill:decode rebalancing: pure decisions over plain data, shared by the controller and the simulator.

- `planner`: observations of a model's load -> a recommended number of prefill and decode engines, with the
  reasoning spelled out, headroom and hysteresis (pure);
- `predict`: the short-term arrival-rate prediction the planner plans for (pure);
- `flips`: a target ratio -> which engines to flip, cheapest first, and the checks a target must pass (pure).

The role-flip state machine that carries a rebalance out is the controller's (fleetctl.controller.rebalance).
"""
