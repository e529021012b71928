"""The numpy dtype of a case's dtype name, as TensorFlow maps it (bfloat16
included).
"""

from __future__ import annotations

import tensorflow as tf


def np_dtype(dtype: str):
    return tf.as_dtype(dtype).as_numpy_dtype
