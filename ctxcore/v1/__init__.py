"""ctxcore.v1: the gRPC wire contract of `ctxcore serve`.

``context_assembly.proto`` is the source; ``context_assembly_pb2`` (messages),
``context_assembly_pb2.pyi`` (their types) and ``context_assembly_pb2_grpc`` (the
service stub) are generated from it with grpcio-tools and committed; a test regenerates
them and fails when they drift.
"""
