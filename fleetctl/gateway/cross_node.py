"""Cross-node KV fetch: should the chosen engine load a prompt's blocks from ANOTHER node's tier?

A node's tier (agent/kv_tiers) is reached by that node's engines. When the engine chosen for a request would
recompute blocks that an engine of the same class on another node holds in its node's tier, the chosen engine
can fetch them over the network instead: it asks that engine (`POST /kv/tier/fetch`, which reads its node's
tier) for the blocks after its own memory's leading run, and checks every block as it checks a local tier
fetch (layout, hash, tokens, CRC-32). A transfer that fails any check, or takes longer than the engine's
tier timeout, is dropped and the engine does what it would have done without it: its own tier, then
recompute. Never a wrong answer.

The decision is a pure function of block counts, the link's measured bandwidth and the engine's measured
prefill speed:

    without = own tier blocks x own tier seconds per block  +  (peer run - own run) x recompute seconds per block
    with    = link rtt + (peer run - memory run) x block bytes / link bandwidth
    fetch  <=>  with < without

(the peer answers the run after the engine's memory, so it also carries the blocks the engine's own tier holds).
The link's figures are the chosen engine's own measurements of earlier fetches from that node (bytes and
seconds per source node, so the round trip is inside the bandwidth); until it has some, `PeerFetchPolicy`'s
defaults, and the plan says they were not measured.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class PeerFetchPolicy:
    default_bandwidth_bytes_per_s: float = 100e6  # a deliberately modest guess until the link is measured
    default_rtt_s: float = 0.002


@dataclass(frozen=True)
class PeerOffer:
    """An engine of the same class on another node, and how many leading blocks of the prompt its tier holds."""

    engine_id: str
    node: str
    url: str
    tier_run: int


@dataclass(frozen=True)
class LinkEstimate:
    bandwidth_bytes_per_s: float  # effective: measured ones include the round trip
    rtt_s: float
    measured: bool


@dataclass(frozen=True)
class LocalCosts:
    """What the chosen engine would do without a peer: its hit, split as the scorer priced it."""

    memory_blocks: int
    tier_blocks: int  # its own node's tier blocks after memory
    tier_fetch_s: float  # predicted seconds to fetch those
    recompute_s_per_block: float  # block size / the engine's measured prefill tokens per second
    block_bytes: float  # the K/V bytes of one block


@dataclass(frozen=True)
class CrossNodeFetch:
    engine: str  # the chosen engine, which would fetch
    fetch: bool
    peer: str  # the engine asked
    peer_node: str
    peer_url: str
    blocks: int  # blocks the transfer carries (the peer's run after the chosen engine's memory)
    gain_blocks: int  # of those, blocks the chosen engine would otherwise recompute
    with_s: float
    without_s: float
    bandwidth_bytes_per_s: float
    measured: bool

    @property
    def kv_transfer_params(self) -> dict[str, str]:
        """What the chosen engine's request carries when it should fetch (engine/reference/kv_tier_peer.py)."""
        return {"tier_peer": self.peer_url, "tier_peer_node": self.peer_node}

    @property
    def reason(self) -> str:
        verdict = "fetch" if self.fetch else "recompute"
        source = "measured" if self.measured else "default"
        return (f"{verdict}: {self.blocks} blocks from {self.peer} on {self.peer_node} ~{self.with_s:.3f}s at "
                f"{self.bandwidth_bytes_per_s / 1e6:.0f} MB/s ({source}) vs ~{self.without_s:.3f}s without")


def link_estimate(measured: Mapping[str, tuple[float, float]], node: str, policy: PeerFetchPolicy) -> LinkEstimate:
    """The link from `node`: (bytes, seconds) measured by the chosen engine, else the policy's defaults."""
    nbytes, seconds = measured.get(node, (0.0, 0.0))
    if nbytes > 0 and seconds > 0:
        return LinkEstimate(nbytes / seconds, 0.0, True)
    return LinkEstimate(policy.default_bandwidth_bytes_per_s, policy.default_rtt_s, False)


def plan_cross_node_fetch(engine: str, local: LocalCosts, offers: Sequence[PeerOffer],
                          links: Mapping[str, LinkEstimate]) -> CrossNodeFetch | None:
    """The best peer to fetch from, with the verdict; None when no peer's tier holds more than the engine reaches."""
    own_run = local.memory_blocks + local.tier_blocks
    best: CrossNodeFetch | None = None
    for offer in offers:
        gain = offer.tier_run - own_run
        if gain <= 0 or offer.node not in links:
            continue
        link = links[offer.node]
        blocks = offer.tier_run - local.memory_blocks
        with_s = link.rtt_s + blocks * local.block_bytes / link.bandwidth_bytes_per_s
        without_s = local.tier_fetch_s + gain * local.recompute_s_per_block
        plan = CrossNodeFetch(engine, with_s < without_s, offer.engine_id, offer.node, offer.url, blocks, gain, with_s,
                              without_s, link.bandwidth_bytes_per_s, link.measured)
        if best is None or (plan.without_s - plan.with_s) > (best.without_s - best.with_s):
            best = plan
    return best
