"""gRPC services whose requests that do not parse are INVALID_ARGUMENT, not UNKNOWN.

A generated `add_XServicer_to_server` registers deserializers that raise on bytes that are not the method's
message (corrupt bytes, a string field that is not UTF-8); grpc.aio answers those UNKNOWN "Unexpected <class
'DecodeError'>" and logs an ERROR traceback for the client's mistake. `add_parsing_service` registers the same
servicer with deserializers that cannot raise, and the method answers INVALID_ARGUMENT saying which message was
expected and which .proto file to generate a client from.
"""

from __future__ import annotations

import inspect
from typing import Any

import grpc
from google.protobuf.message import DecodeError


class _Malformed:
    """A request whose bytes did not parse; the method answers INVALID_ARGUMENT instead of running."""

    def __init__(self, error: DecodeError) -> None:
        # protobuf says "Error parsing message with type 'stagevisor.v1.X': Wire format was corrupt".
        text = str(error)
        self.message_type = text.partition("type '")[2].partition("'")[0]
        self.reason = text.rpartition("': ")[2] or "it does not parse"


def _parsing(parse: Any) -> Any:
    """`parse` (a generated message's FromString) returning a _Malformed instead of raising."""

    def deserialize(data: bytes) -> Any:
        try:
            return parse(data)
        except DecodeError as error:
            return _Malformed(error)

    return deserialize


def _refusing_malformed(behaviour: Any, streams: bool, service: str, proto: str) -> Any:
    def message(request: _Malformed) -> str:
        expected = request.message_type or f"{service} request message"
        return (
            f"the request is not a {expected} ({request.reason}); encode it with stubs generated from {proto}, "
            "every string field as UTF-8 (retrying will not help)"
        )

    if streams and inspect.isasyncgenfunction(behaviour):  # it yields its responses

        async def stream(request: Any, context: grpc.aio.ServicerContext) -> Any:
            if isinstance(request, _Malformed):
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, message(request))
            items = behaviour(request, context)
            try:
                async for item in items:
                    yield item
            finally:  # a client that went away ends the servicer's generator now, not when it is collected
                await items.aclose()

        return stream

    # A unary method, or a streaming one that writes its responses with context.write.
    async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
        if isinstance(request, _Malformed):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, message(request))
        return await behaviour(request, context)

    return unary


class _Registration:
    """Takes what a generated `add_XServicer_to_server` registers, to register it again with parsing methods."""

    def __init__(self) -> None:
        self.service = ""
        self.handlers: dict[str, Any] = {}

    def add_generic_rpc_handlers(self, handlers: Any) -> None:
        """The generated function's first registration (the same handlers as below): not needed."""

    def add_registered_method_handlers(self, service: str, handlers: dict[str, Any]) -> None:
        self.service, self.handlers = service, handlers


def add_parsing_service(add: Any, servicer: Any, server: grpc.aio.Server, proto: str) -> None:
    """Serve `servicer` on `server` as the generated `add` (`add_XServicer_to_server`) would, except that a request
    that does not parse (a string field that is not UTF-8, corrupt bytes) is INVALID_ARGUMENT naming `proto`, the
    file to generate stubs from, instead of UNKNOWN. Unary requests only (every method's, Admin's and Synthesis')."""
    taken = _Registration()
    add(servicer, taken)
    handlers = {}
    for name, handler in taken.handlers.items():
        if handler.request_streaming:
            raise TypeError(f"{taken.service}/{name} takes a stream of requests; add_parsing_service takes one")
        streams = handler.response_streaming
        behaviour = handler.unary_stream if streams else handler.unary_unary
        replaced = _refusing_malformed(behaviour, streams, taken.service, proto)
        make = grpc.unary_stream_rpc_method_handler if streams else grpc.unary_unary_rpc_method_handler
        handlers[name] = make(
            replaced,
            request_deserializer=_parsing(handler.request_deserializer),
            response_serializer=handler.response_serializer,
        )
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(taken.service, handlers),))
    registered: Any = server  # add_registered_method_handlers (grpcio 1.63+) is missing from grpc's type stubs
    registered.add_registered_method_handlers(taken.service, handlers)
