"""Rollouts: a model's traffic moved from class revision A to B in steps, in the spirit of Argo Rollouts'
canary strategy (docs/rollouts.md).

- `spec`: what an operator writes (YAML or flags), validated whole before anything is stored;
- `state`: what the store keeps between reconciles, what a reconcile observes, and the actions it emits
  (plain typed data);
- `analysis`: pure evaluation of analysis templates over windows of per-revision gateway counters;
- `machine`: the pure state machine, (spec, state, observations, now) -> (next state, actions).

The controller side (the store, the reconciler that runs the machine on the leader, the API) lives in
fleetctl.controller.rollouts, fleetctl.controller.rollout_reconciler and fleetctl.controller.api.
"""
