"""The direct-mode inventory: where each agent and gateway is, and where its break-glass credential file
lies, so an operator with no controller still knows where to point (`fleetctl --direct all ...`).

    nodes:
      - {name: node-1, kind: agent, url: "http://10.0.0.5:8090", credential_file: /etc/fleetctl/node-1.bg}
      - {name: gw-a, kind: gateway, url: "http://10.0.0.9:8000", credential_file: /etc/fleetctl/gw-a.bg}

`fleetctl up` writes one beside its state (STATE_DIR/inventory.yaml); docs/production.md shows how to write
one for a real fleet.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from fleetctl.errors import ValidationFailed

INVENTORY_FILE = "inventory.yaml"
AGENT_CREDENTIAL_FILE = "admin-token"  # in an agent's state directory
GATEWAY_CREDENTIAL_FILE = "breakglass_token"  # in a gateway's state directory
KINDS = ("agent", "gateway")


def write_inventory(path: Path, nodes: list[dict[str, str]]) -> None:
    header = ("# fleetctl direct-mode inventory: where each node is and its break-glass credential file\n"
              "# (fleetctl --direct all ...). Keep a copy where you can reach it with the controller down.\n")
    path.write_text(header + yaml.safe_dump({"nodes": nodes}, sort_keys=False))


def read_inventory(path: Path) -> list[dict[str, Any]]:
    """The inventory's nodes ([] when there is no file); ValidationFailed naming `inventory` when it is bad."""
    try:
        raw = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        return []
    except yaml.YAMLError as exc:
        raise ValidationFailed(f"--inventory {path}: not YAML ({exc.__class__.__name__})", field="inventory") from None
    nodes = raw.get("nodes") if isinstance(raw, dict) else None
    if not isinstance(nodes, list) or not all(isinstance(n, dict) and {"name", "kind", "url"} <= set(n) for n in nodes):
        raise ValidationFailed(f"--inventory {path}: expected `nodes:`, each with name, kind and url",
                               field="inventory")
    for node in nodes:
        if node["kind"] not in KINDS:
            raise ValidationFailed(f"--inventory {path}: node {node['name']!r} has kind {node['kind']!r} "
                                   "(agent or gateway)", field="inventory")
    return nodes
