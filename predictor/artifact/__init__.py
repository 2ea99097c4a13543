"""Voice artifacts: the manifest format, publishing, and fetching into MODEL_DIR with verification."""
