"""Synthesis engines: the interface, the torch (native VITS) and ONNX Runtime engines, devices, phonemes."""
