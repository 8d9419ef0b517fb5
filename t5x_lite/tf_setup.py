"""TensorFlow is for data only: import it quietly and keep it off every accelerator."""

from __future__ import annotations

import os


def import_tensorflow():
    """Imports TensorFlow with its C++ logging quieted and all GPUs hidden from it."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf  # TensorFlow loads in seconds: only the data path imports it

    try:
        tf.config.set_visible_devices([], "GPU")
    except RuntimeError:  # TensorFlow already initialised its devices; they stay as they are
        pass
    return tf
