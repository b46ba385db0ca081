"""The gateway: one turn pipeline for every entrypoint.

DESIGN.md, "One pipeline, every entrypoint": the chat page, ``/v1/conversations/{id}/turns``
(and regenerate) and the OpenAI-compatible ``/v1/chat/completions`` and ``/v1/completions``
are protocols over one pipeline, as vLLM's serving layer shares one base among its
entrypoints. The order of decisions:

caller -> route -> shed -> answer budget -> prompt -> rate limit -> input moderation
-> admission slot -> generate -> output moderation -> settle (ledger + TPM refund, once)
-> persist (conversation turns only).

- :mod:`gateway.gate`: the caller and the admission steps before any engine work (route, shed,
  budget, rate limit) and their refusals (:class:`gateway.gate.Refused`).
- :mod:`gateway.run`: input moderation, then generate with the output gate beside the stream,
  one token tally, one settle.

The entrypoints (conversations/submit.py + conversations/generate.py for conversation turns,
api/completions.py for the stateless ones) parse their protocol, assemble their prompt and
render the events; they never re-run a step. This package sits above ``inference/``,
``moderation/`` and ``usage/`` and imports them; they never import it.
"""
