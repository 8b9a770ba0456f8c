"""The resource center: job artifacts in S3/MinIO, content-addressed, versioned by name,
verified on upload and on download, cached locally, protected while jobs reference them.

Modules: ``errors`` (one base error), ``validation`` (names, references, files),
``store`` (the bucket, through the minio client), ``catalog`` (versions in PostgreSQL:
upload, resolve, delete, gc) and ``cache`` (verified local copies for drivers).
"""
