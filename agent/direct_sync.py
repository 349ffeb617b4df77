"""Upload the agent's direct-action journal to the controller and apply the operator's resolutions.

After each successful heartbeat, when the journal holds actions the controller has not acknowledged, or
the supervisor still holds an engine stopped on a direct action, the agent sends them
(`POST /api/v1/breakglass/direct-actions`). The reply acknowledges the journal up to a sequence number and
says which holds the operator resolved (`fleetctl breakglass reconcile`): an adopted drain is now the
controller's own (the hold is dropped, the assignment drains the engine), a reverted one is undone (the
engine restarts), one that already matches desired state is dropped. A failed upload is logged and retried
on the next heartbeat; the heartbeat itself never fails because of it.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

from engine.contract.direct import DirectJournal, DirectUpload, DirectUploadReply

log = logging.getLogger("fleetctl.agent.direct")


class DirectLink(Protocol):
    async def upload_direct_actions(self, payload: dict[str, Any]) -> Any: ...


class Holds(Protocol):
    held: dict[str, int]

    def release_hold(self, seq: int, *, restart: bool) -> str | None: ...


class DirectSync:
    def __init__(self, link: DirectLink, node: str, journal: DirectJournal, holds: Holds):
        self.link, self.node, self.journal, self.holds = link, node, journal, holds

    def upload(self) -> DirectUpload | None:
        """What to send now, or None when there is nothing to say."""
        pending, open_holds = self.journal.pending(), sorted(set(self.holds.held.values()) - {0})
        if not pending and not open_holds:
            return None
        return DirectUpload(kind="agent", source=self.node, actions=pending[:1000], open=open_holds[:1000])

    async def sync(self) -> None:
        upload = self.upload()
        if upload is None:
            return
        try:
            raw = await self.link.upload_direct_actions(upload.model_dump(mode="json"))
            reply = DirectUploadReply.model_validate(raw)  # the client's parsed reply, or a plain dict
        except Exception as exc:  # an older controller, a refusal, a network error: next heartbeat
            log.warning("could not upload %d direct action(s): %s", len(upload.actions), exc)
            return
        if reply.acknowledged > self.journal.uploaded():
            self.journal.mark_uploaded(reply.acknowledged)
        for seq, resolution in reply.resolved.items():
            name = self.holds.release_hold(int(seq), restart=resolution == "reverted")
            if name is not None:
                log.warning("direct hold on engine %s %s by the operator", name, resolution)
