"""The vLLM adapter: renders a `vllm serve` command line from a replica class.

This package never imports `fleetctl`: it takes a plain Mapping of ReplicaClassSpec fields, so the agent (or
anything else) can hand it the class's JSON. `command` holds the rendering; docs/agent.md the mapping table.
"""

from engine.vllm.command import VllmLaunch, VllmRenderError, render_flags, render_vllm_command

__all__ = ["VllmLaunch", "VllmRenderError", "render_flags", "render_vllm_command"]
