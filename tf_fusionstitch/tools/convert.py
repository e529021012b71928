"""Convert a SavedModel's signatures to fused kernels and save the result.

  python -m tf_fusionstitch.tools.convert --input_saved_model_dir=in_dir \\
      --output_saved_model_dir=out_dir [--signature_keys=serving_default] [--fusion=stitch]

Every signature is converted (or only --signature_keys), or kept as it was with the
reason; the summary says which. The output loads with `tf.saved_model.load` in a process
that has imported tf_fusionstitch (README, "SavedModels").
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import app
from absl import flags

FLAGS = flags.FLAGS


def _define_flags():
    # Only when run as a program: tests import this module next to other tools.
    flags.DEFINE_string("input_saved_model_dir", None, "The SavedModel to convert.")
    flags.DEFINE_string("output_saved_model_dir", None, "Where to write the converted one.")
    flags.DEFINE_list("signature_keys", None,
                      "Signatures to convert (default: all); the others are kept as they are.")
    flags.DEFINE_enum("fusion", "stitch", ["stitch", "xla_like", "explore"],
                      "The fusion strategy (tf_fusionstitch.optimize's `fusion`).")
    flags.mark_flags_as_required(["input_saved_model_dir", "output_saved_model_dir"])


def convert(input_dir, output_dir, signature_keys=None, fusion="stitch") -> str:
    """Converts and saves; returns the converter's summary."""
    from tf_fusionstitch.saved_model_converter import SavedModelConverter
    converter = SavedModelConverter(input_dir, signature_keys=signature_keys, fusion=fusion)
    converter.convert()
    converter.save(output_dir)
    return converter.summary() + f"\nsaved to {output_dir}"


def main(argv):
    del argv
    print(convert(FLAGS.input_saved_model_dir, FLAGS.output_saved_model_dir,
                  FLAGS.signature_keys, FLAGS.fusion))


if __name__ == "__main__":
    _define_flags()
    app.run(main)
