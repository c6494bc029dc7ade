"""Which channels a recipient is sent on: a pure function of the enriched message, the
template and the suppression list.

    requested  = the send's channels, else the template's (content ∪ fallback ∪ ai channels)
    available  = requested ∩ channel preferences ∩ topic preference ∩ enabled contacts
                 − suppressed addresses                      (in-app needs no contact)

The fallback chain (the template's ``fallback`` list) is tried in order: of the requested
channels that are in the chain, only the first available one is sent on, and its task carries
the rest of the chain's available channels so delivery can go on to the next one if the
provider fails (none left: the failure goes to the retry cycle). It also carries the rest of the
chain as the template lists it (``route``): the fallback re-enters the engine with that, so a
channel passed over on the way (no contact, say) gets its skipped row when, and only when, the
chain reaches it. The
requested channels outside the chain are sent on independently. An unavailable channel is a
decision too (skipped or suppressed, with the reason) and ends up on the timeline.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from notifkit.db.logs import Kind
from notifkit.db.routing import Template
from notifkit.messages import CHANNELS, EnrichedMessage

# Channels whose messages go to every enabled address (a user's devices); the others go to
# the oldest enabled address only.
ALL_DESTINATIONS = frozenset({"push"})
# user_contacts.disabled_reason as a timeline detail says it.
_DISABLED = {"invalid_recipient": "the provider called the address invalid"}


@dataclass(frozen=True)
class Decision:
    channel: str
    send: bool
    destinations: list[str] = field(default_factory=list)
    kind: Kind | None = None  # skipped | suppressed when not sent
    reason: str | None = None
    chain: list[str] = field(default_factory=list)  # fallback channels after this one
    # The chain after this one with the channels the user cannot be reached on too, up to the
    # last one in ``chain``: what a fallback re-entry decides on (and says why it passes over).
    route: list[str] = field(default_factory=list)


def template_channels(template: Template) -> list[str]:
    """The channels a send gets when it names none: content, fallback chain, AI channels."""
    ai_channels = (template.ai or {}).get("channels") or []
    return _valid([*template.content, *template.fallback, *ai_channels])


def decide(
    message: EnrichedMessage, template: Template, suppressed: Mapping[tuple[str, str], str]
) -> list[Decision]:
    """One decision per channel considered; ``suppressed`` maps the suppressed (channel,
    target) pairs to why (bounce, complaint, unsubscribe)."""
    chain_override = message.get("fallbackChain")
    if chain_override is not None:
        chain, independent = _valid(chain_override), []
    else:
        requested = _valid(message.get("channels") or template_channels(template))
        chain = [c for c in _valid(template.fallback) if c in requested]
        independent = [c for c in requested if c not in chain]

    decisions = [_availability(message, template, c, suppressed) for c in independent]
    for index, channel in enumerate(chain):
        decision = _availability(message, template, channel, suppressed)
        if decision.send:
            # Only the channels the user can be reached on now: with none left, a provider's
            # 5xx on this one goes to the retry cycle rather than to a fallback that is bound
            # to end skipped, leaving the send failed after one attempt (CONTRACT §5).
            after = chain[index + 1:]
            rest = [c for c in after if _availability(message, template, c, suppressed).send]
            route = after[:after.index(rest[-1]) + 1] if rest else []
            decisions.append(Decision(channel, True, decision.destinations, chain=rest,
                                      route=route))
            break
        decisions.append(decision)
    return decisions


def _availability(
    message: EnrichedMessage, template: Template, channel: str,
    suppressed: Mapping[tuple[str, str], str],
) -> Decision:
    prefs = message["preferences"]
    if template.topic and prefs["topics"].get(template.topic) is False:
        return Decision(channel, False, kind=Kind.SKIPPED,
                        reason=f"topic opted out ({template.topic})")
    if prefs["channels"].get(channel) is False:
        return Decision(channel, False, kind=Kind.SKIPPED,
                        reason="channel disabled by preference")
    if channel == "inapp":
        return Decision(channel, True, [message["user"]["id"]])
    targets = message["contacts"].get(channel) or []
    if not targets:
        why = (message.get("disabledContacts") or {}).get(channel)
        return Decision(channel, False, kind=Kind.SKIPPED,
                        reason=f"contact disabled ({_DISABLED.get(why, why)})" if why
                        else "no contact")
    live = [t for t in targets if (channel, t) not in suppressed]
    if not live:
        why = ", ".join(sorted({str(suppressed[(channel, t)]) for t in targets}))
        return Decision(channel, False, kind=Kind.SUPPRESSED,
                        reason=f"address suppressed ({why})")
    return Decision(channel, True, live if channel in ALL_DESTINATIONS else live[:1])


def _valid(channels: Iterable[str]) -> list[str]:
    return [c for c in dict.fromkeys(channels) if c in CHANNELS]
