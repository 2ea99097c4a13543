"""Protocols on the wire: KServe v2 (REST, gRPC codecs), v1, the OpenAI-style speech route."""
