"""A webgpu worker that dies of SIGSEGV before doing anything, as a crash in the WebGPU EP plugin,
Dawn or the Vulkan driver would kill it."""

import os
import signal

if __name__ == "__main__":
    os.kill(os.getpid(), signal.SIGSEGV)
