"""The gateway: one turn pipeline for every entrypoint.

DESIGN.md, "One pipeline, every entrypoint": the chat page, ``/v1/conversations/{id}/turns``
(and regenerate) and the OpenAI-compatible ``/v1/chat/completions`` and ``/v1/completions``
are protocols over one pipeline, as vLLM's serving layer shares one base among its
entrypoints. The order of decisions:

caller -> route -> shed -> answer budget -> prompt -> rate limit -> input moderation
-> admission slot -> generate -> output moderation -> settle (ledger + TPM refund, once)
-> persist (conversation turns only).

- :mod:`gateway.admission`: the one admission sequence (:func:`gateway.admission.admit`): the
  caller, the requested model and answer budget, a callback that builds the prompt for the
  chosen route, and the text to check in; one admitted plan or one refusal out.
- :mod:`gateway.gate`: the admission steps (route, shed, budget, rate limit) and their refusal
  (:class:`gateway.gate.Refused`); :class:`gateway.gate.Caller`, who a request is for.
- :mod:`gateway.tenancy`: the tenant's prefix-cache salt every engine request carries.
- :mod:`gateway.run`: input moderation, then generate with the output gate beside the stream,
  one token tally, one settle.

The entrypoints (conversations/submit.py + conversations/generate.py for conversation turns,
with conversations/plan.py as the prompt callback; api/completions.py for the stateless ones)
parse their protocol and render the events; they never order or re-run a step. This package
sits above ``inference/`` and ``moderation/`` and imports them; they never import it. It
imports no feature app (accounts, usage, conversations): the caller arrives as values
(accounts/callers.py builds it) and the ledger's writer by name (settings.CHAT_USAGE_RECORDER).
"""
