"""The contract between engines, agents, the controller and the gateway: the types they exchange.

No module here imports torch, or anything of `agent` or `fleetctl`.
- `bounds`: bounded integers, finite floats and storable strings, used by every wire model.
"""
