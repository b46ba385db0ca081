"""daphne with write backpressure: ``python -m chatsite.serve`` takes daphne's own arguments.

daphne hands an ASGI app's ``http.response.body`` messages to Twisted, which buffers whatever the
socket cannot take yet, without limit: ``send()`` returns at once, so a client that stops reading
an event stream makes the gateway hold the rest of the answer in memory. Twisted has the
standard cure, its producer/consumer flow control (``IPushProducer``: the transport calls
``pauseProducing`` when its write buffer passes ``bufferSize``, 64 KiB, and ``resumeProducing``
once it drained). :class:`FlowControlServer` registers such a producer for each streamed
response and makes the app's ``send()`` wait while the transport is paused.

So a slow or stalled reader costs the gateway at most one transport buffer plus one chunk; the
answer's events wait in the turn's log (in the generating task and its Redis Stream,
conversations/turnlog.py), and the generation itself never waits for any reader
(conversations/streaming.py). A client that goes away still ends the wait: Twisted stops the
producer and daphne delivers ``http.disconnect``.
"""

from __future__ import annotations

# daphne.server installs Twisted's asyncio reactor at import; it must be imported first.
import daphne.server  # isort:skip

import asyncio
import sys

from daphne.cli import CommandLineInterface
from twisted.internet.interfaces import IPushProducer
from twisted.web import http
from zope.interface import implementer

# Twisted's table of reason phrases predates RFC 6585: a 429 went out as "429 Unknown Status".
http.RESPONSES.setdefault(429, b"Too Many Requests")


@implementer(IPushProducer)
class WriteGate:
    """A push producer standing for one streamed HTTP response: open while the connection's
    transport accepts data, closed while Twisted has paused it (its buffer is full)."""

    def __init__(self) -> None:
        self._writable = asyncio.Event()
        self._writable.set()
        self.stopped = False
        self.pauses = 0  # how often the transport pushed back (for tests and diagnostics)

    def pauseProducing(self) -> None:  # noqa: N802 - Twisted's interface
        self.pauses += 1
        self._writable.clear()

    def resumeProducing(self) -> None:  # noqa: N802
        self._writable.set()

    def stopProducing(self) -> None:  # noqa: N802 - the connection is going away
        self.stopped = True
        self._writable.set()

    @property
    def paused(self) -> bool:
        return not self._writable.is_set()

    async def wait_writable(self, is_gone, poll_s: float = 1.0) -> None:
        """Return once the transport accepts data again, the producer was stopped, or
        ``is_gone()`` says the connection closed (checked every ``poll_s`` seconds)."""
        while not self._writable.is_set() and not is_gone():
            try:
                await asyncio.wait_for(self._writable.wait(), poll_s)
            except TimeoutError:
                pass


class FlowControlServer(daphne.server.Server):
    """daphne's server whose ASGI ``send`` for a response body waits while the client's
    transport is paused (see the module docstring)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.write_gates: dict[object, WriteGate] = {}

    async def handle_reply(self, protocol, message) -> None:
        """Forward ``message`` to the protocol as daphne does; after a body chunk with more to
        come, wait until the transport can take more."""
        is_body = message.get("type") == "http.response.body"
        streaming = is_body and message.get("more_body", False)
        if is_body and not streaming:
            self._release_gate(protocol)  # a finished response must not keep a producer
        await super().handle_reply(protocol, message)
        if not streaming or not isinstance(protocol, http.Request) or self._gone(protocol):
            return
        gate = self.write_gates.get(protocol)
        if gate is None:
            gate = WriteGate()
            self.write_gates[protocol] = gate
            protocol.registerProducer(gate, True)
            protocol.notifyFinish().addBoth(lambda _: self._forget_gate(protocol))
        if gate.paused:
            await gate.wait_writable(lambda: self._gone(protocol))

    def _gone(self, protocol) -> bool:
        state = self.connections.get(protocol)
        return state is None or bool(state.get("disconnected")) or protocol.finished

    def _release_gate(self, protocol) -> None:
        if self.write_gates.pop(protocol, None) is not None and protocol.producer is not None:
            protocol.unregisterProducer()

    def _forget_gate(self, protocol) -> None:
        gate = self.write_gates.pop(protocol, None)
        if gate is not None:
            gate.stopProducing()


class FlowControlCommandLine(CommandLineInterface):
    """daphne's command line, serving with :class:`FlowControlServer`."""

    server_class = FlowControlServer


def main() -> None:
    """``python -m chatsite.serve [daphne arguments] chatsite.asgi:application``."""
    FlowControlCommandLine().run(sys.argv[1:])


if __name__ == "__main__":
    main()
