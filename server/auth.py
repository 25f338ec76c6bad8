"""Optional bearer-token check: `authorization: Bearer <token>` in the call metadata.

Health checks stay open (load balancers and orchestrators probe without credentials); every other
method, reflection included, answers UNAUTHENTICATED without the right token.
"""
from __future__ import annotations

import hmac

import grpc

OPEN_PREFIXES = ("/grpc.health.v1.Health/",)


def _denied_like(handler: grpc.RpcMethodHandler, message: str) -> grpc.RpcMethodHandler:
    """A handler of the same shape as `handler` that refuses the call."""

    def deny(request_or_iterator, context):
        context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    kinds = {
        (False, False): grpc.unary_unary_rpc_method_handler,
        (False, True): grpc.unary_stream_rpc_method_handler,
        (True, False): grpc.stream_unary_rpc_method_handler,
        (True, True): grpc.stream_stream_rpc_method_handler,
    }
    make = kinds[(handler.request_streaming, handler.response_streaming)]
    return make(deny, request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer)


class BearerTokenInterceptor(grpc.ServerInterceptor):
    def __init__(self, token: str):
        if not token:
            raise ValueError("an empty bearer token would accept everyone")
        self._expected = f"Bearer {token}".encode()

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        if handler is None or handler_call_details.method.startswith(OPEN_PREFIXES):
            return handler
        supplied = dict(handler_call_details.invocation_metadata or ()).get("authorization")
        if supplied is None:
            return _denied_like(handler, "missing bearer token (metadata 'authorization: Bearer <token>')")
        if isinstance(supplied, str):
            supplied = supplied.encode()
        if not hmac.compare_digest(supplied, self._expected):
            return _denied_like(handler, "wrong bearer token")
        return handler
