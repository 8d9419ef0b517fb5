"""t5x_lite: a small, complete T5X-style trainer for sequence models in JAX."""

import os as _os

# The user's own TF_CPP_MIN_LOG_LEVEL, read before anything imports JAX, which sets it to 1 when
# unset: tf_setup.py quiets TensorFlow unless the user chose a level.
USER_TF_CPP_MIN_LOG_LEVEL = _os.environ.get("TF_CPP_MIN_LOG_LEVEL")
