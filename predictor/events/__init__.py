"""CloudEvents: synthesis events, their replies, and audio outputs written exactly once to S3."""
