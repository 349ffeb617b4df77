"""fleetctl: the control plane (controller, gateway, CLI) of an LLM inference fleet."""

__version__ = "0.1.0"
