"""Storage: file operations on paths that may be local, `gs://...` or `s3://...`.

Owns: `files.py` (exists, open, write_whole, rename, copy, ...), `object_stores.py` (the gcsfs and
s3fs filesystems behind gs:// and s3://, their errors as `StorageError`, the GCS emulator's
settings) and `gcs_objects.py` (single gs:// objects changed only under generation preconditions,
for the lease). Their public names are re-exported here, so callers write
`from t5x_lite import storage; storage.join(...)`.
May import: `t5x_lite.errors` only (the bottom of the stairs).
"""

from t5x_lite.storage.files import (
                                    absolute,
                                    bucket_of,
                                    check_bucket,
                                    copy,
                                    exists,
                                    glob,
                                    is_gcs,
                                    is_s3,
                                    is_url,
                                    join,
                                    listdir,
                                    makedirs,
                                    nearest_existing,
                                    open,
                                    read_ranges,
                                    remove,
                                    remove_tree,
                                    rename,
                                    tensorflow_readable,
                                    walk_files,
                                    write_whole,
)
from t5x_lite.storage.object_stores import GCS_PREFIX, S3_PREFIX, StorageError, configure_environment

configure_environment()  # before Orbax first opens a gs:// path (see object_stores.py)

__all__ = ["GCS_PREFIX", "S3_PREFIX", "StorageError", "absolute", "bucket_of", "check_bucket", "copy", "exists",
           "glob", "is_gcs", "is_s3", "is_url", "join", "listdir", "makedirs", "nearest_existing", "open", "read_ranges", "remove",
           "remove_tree", "rename", "tensorflow_readable", "walk_files", "write_whole"]
