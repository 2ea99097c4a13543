"""Storage: URIs, the S3 client and its error translation, atomic local files. Imports nothing above core."""
