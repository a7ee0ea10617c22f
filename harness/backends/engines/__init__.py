"""Engine adapters: the harness's backends that drive a serving engine's own attention code.

Each engine has a subpackage (harness/backends/engines/sglang/, ...) with one module per engine backend; what
they share (the engine's release and supported range, stand-ins, the window translation, the
registration into harness.backends) is harness/backends/engines/base.py.
"""
