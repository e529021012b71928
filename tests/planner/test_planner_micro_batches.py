"""`micro_batches.schedule`: GPipe and 1F1B orders per pipeline stage (TF-free)."""

from absl.testing import absltest

from tf_fusionstitch.planner import micro_batches


def _spelled(order):
    return " ".join(f"{phase[0].upper()}{i}" for i, phase in order)


class ScheduleTest(absltest.TestCase):

    def test_gpipe_runs_every_forward_first(self):
        orders = micro_batches.schedule("gpipe", stages=2, micro_batches=3)
        self.assertEqual([_spelled(o) for o in orders], ["F0 F1 F2 B0 B1 B2"] * 2)

    def test_1f1b_fills_then_alternates(self):
        orders = micro_batches.schedule("1f1b", stages=4, micro_batches=4)
        self.assertEqual([_spelled(o) for o in orders], [
            "F0 F1 F2 F3 B0 B1 B2 B3",
            "F0 F1 F2 B0 F3 B1 B2 B3",
            "F0 F1 B0 F2 B1 F3 B2 B3",
            "F0 B0 F1 B1 F2 B2 F3 B3"])

    def test_unknown_schedule(self):
        with self.assertRaisesRegex(ValueError, "unknown pipeline schedule 'zigzag'"):
            micro_batches.schedule("zigzag", stages=2, micro_batches=2)


if __name__ == "__main__":
    absltest.main()
