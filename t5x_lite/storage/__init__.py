"""Storage: file operations on paths that may be local, `gs://...` or `s3://...`.

Owns: `files.py` (exists, open, write_whole, rename, copy, ... and `StorageError`). Its public
names are re-exported here, so callers write `from t5x_lite import storage; storage.join(...)`.
May import: `t5x_lite.errors` and `t5x_lite.tf_setup` only (the bottom of the stairs).
"""

from t5x_lite.storage.files import (
                                    S3_PREFIX,
                                    StorageError,
                                    absolute,
                                    bucket_of,
                                    copy,
                                    exists,
                                    glob,
                                    is_s3,
                                    is_url,
                                    join,
                                    listdir,
                                    makedirs,
                                    nearest_existing,
                                    open,
                                    remove,
                                    remove_tree,
                                    rename,
                                    tensorflow_readable,
                                    walk_files,
                                    write_whole,
)

__all__ = ["S3_PREFIX", "StorageError", "absolute", "bucket_of", "copy", "exists", "glob", "is_s3", "is_url", "join",
           "listdir", "makedirs", "nearest_existing", "open", "remove", "remove_tree", "rename", "tensorflow_readable", "walk_files",
           "write_whole"]
