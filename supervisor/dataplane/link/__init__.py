"""Links: one long-lived bidirectional gRPC stream per linked pair, multiplexing every request.

The sender dials (`OutboundLink`, lazily, on its first frame) and writes
frames; the listener (`serve_links`) dispatches them and answers on the same
stream with credit frames. Frames queued while a write is in flight go out
together as one gRPC message: each frame is serialized once when it is sent
and a batch is the concatenation of their wire encodings, so batching costs no
re-encoding. A link that breaks is dropped from its pool; the next frame to
that address dials again, so a restarted peer on the same address is found.

A link never dies of what a peer wrote: each frame of a batch is parsed on
its own, and one that does not parse is reported (with its request id, when
that much can be read) so only its request fails. Pooled shared buffers are
held by the link their frame went out on until the peer releases them; when
the link breaks, the buffers it still holds are dropped, never leaked.
Credits a listener returns for one stream within a batch travel as one frame.

A peer that stops on purpose says so first (a Leaving frame): from then on the
link takes no frame, its pool dials a new link for the next one, and once the
frames queued before are written the link ends its side of the stream. The
peer reads to that end before it stops, so a frame sent before the sender
knew is read there (and refused, if it would open a request) rather than
dropped unread with the peer's server.

One concept a module: the dialling side (`outbound`: OutboundLink, LinkPool),
the listening side (`server`: InboundLink, serve_links), the wire format
(`frames`), the batching writer of each side (`batcher`) and inline buffers
arriving in pieces (`pieces`); import each name from the module that defines
it. Both sides log as `stagevisor.supervisor.dataplane.link`.
"""
