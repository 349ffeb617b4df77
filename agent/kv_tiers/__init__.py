"""The node's KV tiers, hosted by the agent: engine memory -> host DRAM -> local disk (see store.py)."""
