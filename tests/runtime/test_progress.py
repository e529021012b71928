"""The compile progress bar: on a terminal after its delay, never elsewhere."""

import io
import sys
import time

from tf_fusionstitch.runtime import progress


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def _run(stream, monkeypatch):
    monkeypatch.setattr(sys, "stderr", stream)
    monkeypatch.setattr(progress, "DELAY_S", 0.0)
    with progress.kernels_bar(3) as bar:
        for _ in range(3):
            time.sleep(0.11)   # past tqdm's mininterval, so each update is drawn
            bar.update(1)
    return stream.getvalue()


def test_a_terminal_sees_kernels_compiled_of_total(monkeypatch):
    shown = _run(_Terminal(), monkeypatch)
    assert "compiling kernels" in shown and "3/3" in shown


def test_a_log_file_sees_nothing(monkeypatch):
    assert _run(io.StringIO(), monkeypatch) == ""
