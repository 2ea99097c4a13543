"""Serving: the TTS service (admission, batching, drain), cold start, request parameters, middleware and interceptor."""
