"""Child processes that tests interrupt with SIGINT, as Ctrl-C in a terminal would.

A runner started in the background (`cmd &` in a script) hands its children SIGINT ignored, and a
Python child then never sees the Ctrl-C a test sends: SIGINT is set back to its default in the child."""

import signal
import subprocess


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def interruptible(args, **options) -> subprocess.Popen:
    """subprocess.Popen(args, **options), with SIGINT as a terminal delivers it."""
    return subprocess.Popen(args, preexec_fn=_default_sigint, **options)
