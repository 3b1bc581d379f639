"""The error a service call ends with: a gRPC status code and details."""

from __future__ import annotations

import grpc

__all__ = ["ServiceError"]


class ServiceError(Exception):
    """A call ends with this gRPC status and these details (never memory text).

    >>> ServiceError(grpc.StatusCode.NOT_FOUND, "no such model").details
    'no such model'
    """

    def __init__(
        self, code: grpc.StatusCode, details: str, trailing_metadata: tuple[tuple[str, str], ...] = ()
    ) -> None:
        super().__init__(details)
        self.code = code
        self.details = details
        #: sent with the status (e.g. admission control's refusal reason and retry hint)
        self.trailing_metadata = trailing_metadata
